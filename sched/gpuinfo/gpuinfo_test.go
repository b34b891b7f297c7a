package gpuinfo

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestSimulated(t *testing.T) {
	g, src, err := Discover([]string{"DETSHARE_SIMGPU_COUNT=2", "DETSHARE_SIMGPU_SMS=64"})
	if err != nil {
		t.Fatal(err)
	}
	if src != SourceSimulated || len(g) != 2 || g[1].SMCount != 64 || !strings.HasPrefix(g[0].UUID, "SIM-") {
		t.Fatalf("%v %+v", src, g)
	}
	if _, _, err := Discover([]string{"DETSHARE_SIMGPU_SMS=lots"}); err == nil {
		t.Fatal("bad simulated GPU config must be refused")
	}
}

// TestNoDriver runs on CI (no NVIDIA driver): discovery must fail cleanly, not crash.
func TestNoDriver(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a real NVIDIA driver is present")
	}
	_, src, err := Discover(nil)
	if src != SourceNVML || err == nil {
		t.Fatalf("no driver: %v %v", src, err)
	}
	if !errors.Is(err, ErrNoDriver) && !strings.Contains(err.Error(), "NVML") {
		t.Fatalf("unclear error: %v", err)
	}
}

func TestCoresPerSM(t *testing.T) {
	if CoresPerSM(9, 0) != 128 || CoresPerSM(8, 0) != 64 || 16896/CoresPerSM(9, 0) != 132 {
		t.Fatal("cores per SM")
	}
}
