package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

// TestExclusiveComputeModeKeepsProcessesInMPS is issue 27's "a process that leaves MPS escapes the server-side
// limit", on the simulated GPU (a test double; the real GPU's compute mode is never changed by the tests): with
// mps.exclusive = true the scheduler puts the GPU in EXCLUSIVE_PROCESS compute mode at start and restores its mode
// when it stops. Meanwhile a tenant process (libdetshare, MPS pipe directory from its quota file) that unsets or
// changes CUDA_MPS_PIPE_DIRECTORY inside main(), and a process without the library or MPS, cannot create a context
// (CUDA_ERROR_DEVICE_UNAVAILABLE, 46), while the tenant's honest processes, MPS clients, run. Before (default mode)
// the same process that left MPS got a context.
func TestExclusiveComputeModeKeepsProcessesInMPS(t *testing.T) {
	dir, tb := newRunDir(t)
	reg := register(t, tb, "tenant", table.TierBestEffort, table.RoleNone, 0, false, 0)
	state := filepath.Join(t.TempDir(), "simgpu-state")
	cm := simgpu.ComputeModes{State: state}
	probe := soakBuild(t, "tests/ds_probe_rt")
	pipe := table.NewPaths(dir).MPSPipeDir(0)
	env := soakProbeEnv(t, tb, reg, state, pipe)
	bare := []string{"PATH=" + os.Getenv("PATH"), "LD_LIBRARY_PATH=" + filepath.Dir(soakBuild(t, "lib/simgpu/libcuda.so.1")),
		"DETSHARE_SIMGPU_STATE=" + state, "DETSHARE_SIMGPU_MEM=" + strconv.Itoa(1<<34), "DETSHARE_SIMGPU_SMS=64"}
	initRC := func(env []string, steps ...string) string {
		t.Helper()
		rcs, _, err := soakProbe(env, probe, append(steps, "init")...)
		if err != nil {
			t.Fatal(err)
		}
		return rcs["init"]
	}

	run := func(exclusive bool) (stop func()) {
		c := testConfig()
		c.MPS.Enable, c.MPS.Exclusive = true, exclusive
		ready := make(chan struct{})
		s, err := New(Options{RunDir: dir, Config: c, MPS: &mps.Manager{Paths: table.NewPaths(dir), Simulated: true},
			Ready: ready, ComputeModes: cm})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		<-ready
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("scheduler: %v", err)
			}
			s.Close()
		}
	}

	// mps.exclusive off (the default): a tenant process that leaves MPS inside main() still gets a context.
	stop := run(false)
	if m, _ := cm.ComputeMode(0); m != ComputeModeDefault {
		t.Fatalf("mps.exclusive off, compute mode %q", m)
	}
	if rc := initRC(env, "unsetenv:CUDA_MPS_PIPE_DIRECTORY"); rc != "0" {
		t.Fatalf("default compute mode: a process outside MPS: init rc %s, want 0", rc)
	}
	stop()

	stop = run(true)
	if m, _ := cm.ComputeMode(0); m != ComputeModeExclusiveProcess {
		t.Fatalf("mps.exclusive on: compute mode %q, want %s", m, ComputeModeExclusiveProcess)
	}
	if rc := initRC(env); rc != "0" {
		t.Errorf("an MPS client of the tenant: init rc %s, want 0", rc)
	}
	for what, steps := range map[string][]string{
		"CUDA_MPS_PIPE_DIRECTORY unset inside main()":   {"unsetenv:CUDA_MPS_PIPE_DIRECTORY"},
		"CUDA_MPS_PIPE_DIRECTORY changed inside main()": {"setenv:CUDA_MPS_PIPE_DIRECTORY=" + t.TempDir()},
	} {
		if rc := initRC(env, steps...); rc != "46" {
			t.Errorf("%s: init rc %s, want 46 (CUDA_ERROR_DEVICE_UNAVAILABLE)", what, rc)
		}
	}
	if rc := initRC(bare); rc != "46" {
		t.Errorf("a process without the library or MPS: init rc %s, want 46", rc)
	}
	stop()
	if m, _ := cm.ComputeMode(0); m != ComputeModeDefault {
		t.Fatalf("after the scheduler stopped: compute mode %q, want it restored to %s", m, ComputeModeDefault)
	}
	if rc := initRC(bare); rc != "0" {
		t.Errorf("after the restore, a process outside MPS: init rc %s, want 0", rc)
	}
}
