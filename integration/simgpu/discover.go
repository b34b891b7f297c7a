package simgpu

import (
	"errors"
	"os"

	"github.com/detshare/detshare/sched/table"
)

// ErrNotSelected is Discover's error when the environment does not select the simulated GPU.
var ErrNotSelected = errors.New("no GPUs are recorded in the table and none can be discovered here: " +
	"start the scheduler (`detshare sched`) or select the simulated GPU (DETSHARE_SIMGPU=1, a test double)")

// Discover describes the simulated GPUs the environment selects (DETSHARE_SIMGPU=1 and its size variables). It is
// the GPU discovery that the NVML-free binaries (hook, shim, runc wrapper) are wired with in cmd, and the one tests
// register tenants with: a real host gets its GPUs into the table from the scheduler, never from here.
func Discover() ([]table.GPUInfo, error) {
	env := os.Environ()
	if !table.SimGPUSelected(env) {
		return nil, ErrNotSelected
	}
	return table.DiscoverSimGPUs(env)
}
