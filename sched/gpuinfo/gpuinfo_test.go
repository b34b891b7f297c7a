package gpuinfo

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestHostDiscovery: on CI (no NVIDIA driver) discovery must fail cleanly, not crash; on a GPU host it must find
// every GPU with its SM count.
func TestHostDiscovery(t *testing.T) {
	g, err := Discover()
	if _, statErr := os.Stat("/dev/nvidiactl"); statErr == nil {
		if err != nil || len(g) == 0 {
			t.Fatalf("NVIDIA driver present but discovery failed: %v %+v", err, g)
		}
		for _, x := range g {
			if x.SMCount == 0 || x.UUID == "" || x.MemTotal == 0 {
				t.Fatalf("incomplete GPU info: %+v", x)
			}
		}
		return
	}
	if err == nil {
		t.Fatalf("no driver, yet discovery returned %+v", g)
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
