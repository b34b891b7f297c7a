package gpuinfo

import (
	"fmt"
	"sync"

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
	var mu sync.Mutex
	devs := map[int]nvml.Device{}
	return func(index int) (map[int]uint64, error) {
		mu.Lock()
		dev, ok := devs[index]
		if !ok {
			d, ret := nvml.DeviceGetHandleByIndex(index)
			if ret != nvml.SUCCESS {
				mu.Unlock()
				return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", index, nvml.ErrorString(ret))
			}
			devs[index], dev = d, d
		}
		mu.Unlock()
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
