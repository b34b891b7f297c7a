package gpuinfo

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// notAvailable is NVML's NVML_VALUE_NOT_AVAILABLE for a process's usedGpuMemory (the driver would not say).
const notAvailable = ^uint64(0)

// ProcessMemorySampler returns a function reading the device memory each process holds on GPU index (host PID ->
// bytes, nvmlDeviceGetComputeRunningProcesses: every process with a context, MPS clients included, whatever it
// allocated through), or nil when NVML cannot be initialised (no driver: the binaries start without it). A process
// whose usage the driver does not report is left out. NVML stays initialised for the process's life.
func ProcessMemorySampler() func(index int) (map[int]uint64, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil
	}
	devs := &deviceCache{}
	return func(index int) (map[int]uint64, error) {
		dev, err := devs.get(index)
		if err != nil {
			return nil, err
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetComputeRunningProcesses(%d): %s", index, nvml.ErrorString(ret))
		}
		out := make(map[int]uint64, len(procs))
		for _, p := range procs {
			if p.UsedGpuMemory != notAvailable {
				out[int(p.Pid)] += p.UsedGpuMemory
			}
		}
		return out, nil
	}
}
