package doctor

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlDriverInfo asks NVML. On a host without the driver nvml.Init returns ERROR_LIBRARY_NOT_FOUND, which becomes a
// "no NVIDIA driver" finding rather than a crash (the binary is linked lazily for that reason, see the Makefile).
func nvmlDriverInfo() (d DriverInfo) {
	defer func() {
		if r := recover(); r != nil {
			d = DriverInfo{Err: fmt.Errorf("NVML unusable: %v", r)}
		}
	}()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return DriverInfo{Err: errors.New("libnvidia-ml.so.1 not found")}
		}
		return DriverInfo{Err: fmt.Errorf("nvmlInit: %s", nvml.ErrorString(ret))}
	}
	defer nvml.Shutdown()
	d.DriverVersion, _ = nvml.SystemGetDriverVersion()
	d.CUDAVersion, _ = nvml.SystemGetCudaDriverVersion()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		d.Err = fmt.Errorf("nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
		return d
	}
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g := GPU{Index: i}
		g.Name, _ = dev.GetName()
		g.UUID, _ = dev.GetUUID()
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemBytes = mem.Total
		}
		d.GPUs = append(d.GPUs, g)
	}
	return d
}
