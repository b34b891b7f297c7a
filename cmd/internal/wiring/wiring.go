// Package wiring builds, once per binary, the dependencies of tenant registration (cgroupgpu/tenant.Registrar) for
// the NVML-free binaries: detshare-hook, detshare-runtime and containerd-shim-detshare-v1. It is where those binaries
// choose their GPU backend: they never probe NVML (they must stay small and start on hosts without a driver); the
// scheduler records the real GPUs in the table, and before it has, they can only describe the simulated GPU (a test
// double) when the environment selects it. `detshare` builds its own Registrar with NVML discovery (cmd/detshare).
package wiring

import (
	"github.com/detshare/detshare/cgroupgpu/placement"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/integration/simgpu"
	"github.com/detshare/detshare/sched/ensure"
)

// Container is the Registrar of the shim and the runc wrapper: they start the scheduler on demand and place
// gpu=auto by the neighbours' measured profile.
func Container() tenant.Registrar {
	return tenant.Registrar{EnsureScheduler: ensure.EnsureScheduler, DiscoverGPUs: simgpu.Discover,
		Placer: &placement.Placer{}}
}

// Hook is the Registrar of detshare-hook. At createContainer it runs inside the container's PID namespace, where a
// scheduler it started would neither see host PIDs nor outlive the container, so it starts none; it places gpu=auto
// first-fit.
func Hook() tenant.Registrar {
	return tenant.Registrar{DiscoverGPUs: simgpu.Discover}
}
