package wiring

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/placement"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
)

// TestContainerStartsSchedulerAndPlacesByProfile: the shim's and the wrapper's Registrar starts the scheduler
// (sched/ensure: a missing binary is reported) and places gpu=auto with the profile placer.
func TestContainerStartsSchedulerAndPlacesByProfile(t *testing.T) {
	r := Container()
	if _, ok := r.Placer.(*placement.Placer); !ok {
		t.Fatalf("container placer %T, want *placement.Placer", r.Placer)
	}
	if r.EnsureScheduler == nil {
		t.Fatal("container registrar does not start the scheduler")
	}
	t.Setenv(ensure.BinEnv, "/nonexistent/detshare")
	if err := r.EnsureScheduler(filepath.Join(t.TempDir(), "run")); err == nil {
		t.Fatal("EnsureScheduler is not sched/ensure's: a missing binary must be reported")
	}
}

// TestHookStartsNoScheduler: the OCI hook runs in the container's PID namespace and must not start a scheduler.
func TestHookStartsNoScheduler(t *testing.T) {
	r := Hook()
	if r.EnsureScheduler != nil || r.Placer != nil {
		t.Fatalf("hook registrar %+v: want no scheduler start and first-fit placement", r)
	}
}

// TestDiscoveryIsTheTestDoubleOnlyWhenSelected: without DETSHARE_SIMGPU the NVML-free binaries discover nothing
// (the scheduler records the real GPUs) and `detshare run` uses its NVML discovery; with it every binary describes
// the simulated GPU and never calls NVML.
func TestDiscoveryIsTheTestDoubleOnlyWhenSelected(t *testing.T) {
	nvmlCalls := 0
	nvml := func() ([]table.GPUInfo, error) { nvmlCalls++; return []table.GPUInfo{{UUID: "GPU-real"}}, nil }
	for _, r := range []tenant.Registrar{Container(), Hook()} {
		t.Setenv("DETSHARE_SIMGPU", "0")
		if SimulatedGPU() {
			t.Fatal("DETSHARE_SIMGPU=0 chose the simulated GPU")
		}
		if _, err := r.DiscoverGPUs(); !errors.Is(err, simgpu.ErrNotSelected) {
			t.Fatalf("not selected: %v", err)
		}
		t.Setenv("DETSHARE_SIMGPU", "1")
		if !SimulatedGPU() {
			t.Fatal("DETSHARE_SIMGPU=1 did not choose the simulated GPU")
		}
		g, err := r.DiscoverGPUs()
		if err != nil || len(g) != 1 || g[0].UUID[:4] != "SIM-" {
			t.Fatalf("selected: %+v %v", g, err)
		}
	}
	h := Host(nvml)
	if g, err := h.DiscoverGPUs(); err != nil || g[0].UUID[:4] != "SIM-" || nvmlCalls != 0 {
		t.Fatalf("host, simulated GPU selected: %+v %v (NVML called %d times)", g, err, nvmlCalls)
	}
	t.Setenv("DETSHARE_SIMGPU", "0")
	if g, err := h.DiscoverGPUs(); err != nil || g[0].UUID != "GPU-real" || nvmlCalls != 1 {
		t.Fatalf("host, not selected: %+v %v (NVML called %d times)", g, err, nvmlCalls)
	}
	if _, ok := h.Placer.(*placement.Placer); !ok || h.EnsureScheduler == nil {
		t.Fatalf("host registrar %+v: want the scheduler started and the profile placer", h)
	}
}
