package gpuinfo

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
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

// TestHostFactsAndXidWatch: on a GPU host NVML gives each GPU's architecture and compute capability and the driver's
// versions (what the DRA plugin publishes), and the critical-Xid watch sets up (an H100's driver supports the
// events); on CI (no driver) both fail cleanly, naming the missing driver, instead of crashing.
func TestHostFactsAndXidWatch(t *testing.T) {
	f, err := Facts()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	werr := WatchXid(ctx, func(gpu int, xid uint64) { t.Logf("critical Xid %d on GPU %d during the test", xid, gpu) })
	if werr == nil {
		defer time.Sleep(1500 * time.Millisecond) // after cancel: the watch shuts NVML down within its 1 s wait
	}
	// DETSHARE_TEST_NVML_DOUBLE=1: the NVML double is on LD_LIBRARY_PATH (integration/gpu/nvml_health.sh NH_SIM=1).
	if _, statErr := os.Stat("/dev/nvidiactl"); statErr != nil && os.Getenv("DETSHARE_TEST_NVML_DOUBLE") != "1" {
		if err == nil || werr == nil {
			t.Fatalf("no driver, yet Facts %+v (%v) and WatchXid %v", f, err, werr)
		}
		if !errors.Is(err, ErrNoDriver) && !strings.Contains(err.Error(), "NVML") || !errors.Is(werr, ErrNoDriver) && !strings.Contains(werr.Error(), "NVML") {
			t.Fatalf("unclear errors: %v; %v", err, werr)
		}
		return
	}
	if err != nil || werr != nil {
		t.Fatalf("NVIDIA driver present: Facts %v, WatchXid %v", err, werr)
	}
	t.Logf("driver %s, CUDA %d, GPUs %+v", f.Version, f.CUDAVersion, f.GPUs)
	if f.Version == "" || f.CUDAVersion < 11000 || len(f.GPUs) == 0 {
		t.Fatalf("incomplete driver facts: %+v", f)
	}
	for i, g := range f.GPUs {
		if g.Architecture == "" || g.CCMajor < 7 || g.CCMinor < 0 {
			t.Errorf("GPU %d: incomplete facts %+v", i, g)
		}
	}
}
