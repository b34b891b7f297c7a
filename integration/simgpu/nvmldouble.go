package simgpu

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Variables of the NVML double's events (README.md).
const (
	EnvXid        = "DETSHARE_SIMGPU_XID"         // the Xid file: a line "N XID" injects critical Xid XID on GPU N
	EnvNVMLEvents = "DETSHARE_SIMGPU_NVML_EVENTS" // 0: no event support
)

// UseNVMLDouble points go-nvml (in this test process) at the NVML double of make build's output (DETSHARE_BUILD_DIR,
// else the repository's build/), with a private state file and Xid file for gpus GPUs, until the test ends; it
// returns the Xid file. go-nvml's library must not be loaded when it is called.
func UseNVMLDouble(t testing.TB, gpus string) (xidFile string) {
	t.Helper()
	build := os.Getenv("DETSHARE_BUILD_DIR")
	if build == "" {
		_, file, _, _ := runtime.Caller(0)
		build = filepath.Join(filepath.Dir(file), "..", "..", "build")
	}
	lib := filepath.Join(LibDir(build), "libnvidia-ml.so.1")
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("%s missing (%v): run `make build` first", lib, err)
	}
	dir := t.TempDir()
	xidFile = filepath.Join(dir, "xid")
	t.Setenv(EnvState, filepath.Join(dir, "state"))
	t.Setenv("DETSHARE_SIMGPU_COUNT", gpus)
	t.Setenv(EnvXid, xidFile)
	if err := nvml.SetLibraryOptions(nvml.WithLibraryPath(lib)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nvml.SetLibraryOptions(nvml.WithLibraryPath("libnvidia-ml.so.1")) })
	return xidFile
}

// InjectXid appends "gpu xid" to the NVML double's Xid file: its event sets deliver critical Xid xid on GPU gpu.
func InjectXid(t testing.TB, xidFile string, gpu int, xid uint64) {
	t.Helper()
	appendLine(t, xidFile, strconv.Itoa(gpu)+" "+strconv.FormatUint(xid, 10))
}

// InjectGPULost makes the NVML double's next event wait return NVML_ERROR_GPU_IS_LOST (a GPU fallen off the bus;
// NVML names none), through xidFile as InjectXid.
func InjectGPULost(t testing.TB, xidFile string) {
	t.Helper()
	appendLine(t, xidFile, "lost")
}

func appendLine(t testing.TB, path, line string) {
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
