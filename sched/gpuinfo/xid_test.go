package gpuinfo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// onNVMLDouble points go-nvml at the simulated GPU's libnvidia-ml.so.1 (a test double, built by make build) with a
// private state file and Xid file for gpus GPUs, until the test ends. (This file sorts after gpuinfo_test.go, whose
// TestHostDiscovery must see the host's own NVML.)
func onNVMLDouble(t *testing.T, gpus string) (xidFile string) {
	t.Helper()
	build := os.Getenv("DETSHARE_BUILD_DIR")
	if build == "" {
		_, file, _, _ := runtime.Caller(0)
		build = filepath.Join(filepath.Dir(file), "..", "..", "build")
	}
	lib := filepath.Join(build, "lib/simgpu/libnvidia-ml.so.1")
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("%s missing (%v): run `make build` first", lib, err)
	}
	dir := t.TempDir()
	xidFile = filepath.Join(dir, "xid")
	t.Setenv("DETSHARE_SIMGPU_STATE", filepath.Join(dir, "state"))
	t.Setenv("DETSHARE_SIMGPU_COUNT", gpus)
	t.Setenv("DETSHARE_SIMGPU_XID", xidFile)
	if err := nvml.SetLibraryOptions(nvml.WithLibraryPath(lib)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nvml.SetLibraryOptions(nvml.WithLibraryPath("libnvidia-ml.so.1")) })
	return xidFile
}

func appendLine(t *testing.T, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
}

// WatchXid delivers the critical Xid errors the NVML double reports for each GPU (injected through its Xid file) in
// order, with the GPU's NVML index, and none from before the watch began; it ends when its context does.
func TestWatchXidOnTheNVMLDouble(t *testing.T) {
	xid := onNVMLDouble(t, "2")
	appendLine(t, xid, "1 48") // before the watch: not delivered
	ctx, cancel := context.WithCancel(context.Background())
	events, err := WatchXid(ctx)
	if err != nil {
		cancel()
		t.Fatalf("WatchXid on the NVML double: %v", err)
	}
	appendLine(t, xid, "1 79")
	appendLine(t, xid, "0 13")
	for _, want := range []XidEvent{{GPU: 1, Xid: 79}, {GPU: 0, Xid: 13}} {
		select {
		case got := <-events:
			if got != want {
				t.Errorf("event %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event after 10 s, want %+v", want)
		}
	}
	cancel()
	for range events { // closed once the watch has shut NVML down
	}
}

// A driver without event support (modelled by the double with DETSHARE_SIMGPU_NVML_EVENTS=0) is ErrNoEvents, not a
// crash or a silent watch.
func TestWatchXidWithoutEventSupport(t *testing.T) {
	onNVMLDouble(t, "1")
	t.Setenv("DETSHARE_SIMGPU_NVML_EVENTS", "0")
	_, err := WatchXid(context.Background())
	if !errors.Is(err, ErrNoEvents) {
		t.Fatalf("WatchXid without event support: %v, want ErrNoEvents", err)
	}
}

// Facts reads the driver's version, its CUDA version and each GPU's architecture and compute capability: the
// double's are 580.00-simgpu, 13000, hopper 9.0.
func TestFactsOnTheNVMLDouble(t *testing.T) {
	onNVMLDouble(t, "2")
	f, err := Facts()
	if err != nil {
		t.Fatal(err)
	}
	want := GPUFacts{Architecture: "hopper", CCMajor: 9, CCMinor: 0}
	if f.DriverVersion != "580.00-simgpu" || f.CUDAVersion != 13000 || len(f.GPUs) != 2 || f.GPUs[0] != want || f.GPUs[1] != want {
		t.Errorf("Facts: %+v, want driver 580.00-simgpu, CUDA 13000, two GPUs %+v", f, want)
	}
}
