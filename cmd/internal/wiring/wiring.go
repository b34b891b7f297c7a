// Package wiring builds, once per binary, what tenant registration depends on (cgroupgpu/tenant.Registrar) and is
// where DetShare's binaries choose their GPU backend: NVML (sched/gpuinfo) or the simulated GPU (a test double,
// internal/simgpu), the latter only when the environment selects it. The hook, the shim and the runc wrapper
// never probe NVML (they must stay small and start on hosts without a driver): the scheduler records the real GPUs
// in the table, and before it has they can only describe the simulated GPU. This package links no NVML; `detshare`
// passes its NVML discovery in (cmd/detshare).
package wiring

import (
	"os"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/placement"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
)

// GPUs is the GPU discovery of a binary whose real discovery is nvml (nil: none, the NVML-free binaries): the
// simulated GPU when the environment selects it, nvml otherwise.
func GPUs(nvml func() ([]table.GPUInfo, error)) func() ([]table.GPUInfo, error) {
	return simgpu.OrReal(nvml)
}

// SimulatedGPU tells whether this process's environment chose the simulated GPU (a test double): the scheduler then
// runs the simulated MPS daemons and samples no board power.
func SimulatedGPU() bool { return simgpu.Selected(os.Environ()) }

// Container is the Registrar of the shim and the runc wrapper: they start the scheduler on demand and place
// gpu=auto by the neighbours' measured profile.
func Container() tenant.Registrar {
	return tenant.Registrar{EnsureScheduler: ensure.EnsureScheduler, DiscoverGPUs: GPUs(nil),
		Placer: &placement.Placer{}}
}

// Hook is the Registrar of detshare-hook. At createContainer it runs inside the container's PID namespace, where a
// scheduler it started would neither see host PIDs nor outlive the container, so it starts none; it places gpu=auto
// first-fit.
func Hook() tenant.Registrar {
	return tenant.Registrar{DiscoverGPUs: GPUs(nil)}
}

// Host is the Registrar of `detshare run`, which registers host processes in its own process: it starts the
// scheduler on demand, discovers GPUs through nvml (sched/gpuinfo.Discover) unless the simulated GPU is selected,
// and places gpu=auto by the neighbours' measured profile.
func Host(nvml func() ([]table.GPUInfo, error)) tenant.Registrar {
	return tenant.Registrar{EnsureScheduler: ensure.EnsureScheduler, DiscoverGPUs: GPUs(nvml),
		Placer: &placement.Placer{}}
}

// Devices is the GPU device source of the shim, the runc wrapper and `detshare cdi`: the simulated GPU's (a test
// double) when the environment selects it at the time of the call, else the host's (NVIDIA's CDI spec, or the
// driver's files, with hookPath's `detshare-hook ldcache` as the loader hook; the edit generated from the driver's
// files is kept in the run directory between starts, cdi.CacheFile).
func Devices(hookPath string) cdi.Source {
	return devices{host: cdi.Host{HookPath: hookPath, CacheDir: table.RunDir("")}}
}

type devices struct{ host cdi.Host }

func (d devices) Edit(gpu cdi.GPU) (cdi.Edit, error) {
	if SimulatedGPU() {
		return cdi.Simulated{}.Edit(gpu)
	}
	return d.host.Edit(gpu)
}
