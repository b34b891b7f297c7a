// Package gpuinfo discovers the host's GPUs through NVML and samples their power and clocks, for the scheduler and
// the Kubernetes plugins. It knows only real GPUs: each binary's main chooses between it and the simulated GPU
// (a test double; cmd/internal/wiring). Without a driver it says so instead of failing hard: the scheduler then
// runs with no GPU and tenants run fail-static.
//
// Binaries importing this package link go-nvml and must be linked lazily (-extldflags -Wl,-z,lazy, see the Makefile)
// so that they start on hosts without the driver.
package gpuinfo

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/detshare/detshare/internal/table"
)

// ErrNoDriver is returned (wrapped) when there is no NVIDIA driver.
var ErrNoDriver = errors.New("no NVIDIA driver (libnvidia-ml.so.1 not found)")

// initNVML initialises NVML: ErrNoDriver without the library, the driver's reason otherwise. The caller shuts it
// down after a nil error.
func initNVML() error {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return ErrNoDriver
		}
		return fmt.Errorf("nvmlInit: %s", nvml.ErrorString(ret))
	}
	return nil
}

// Discover lists the host's GPUs through NVML.
func Discover() ([]table.GPUInfo, error) { return discoverNVML() }

func discoverNVML() (out []table.GPUInfo, err error) {
	defer func() {
		// go-nvml panics when a symbol is missing from an older driver's NVML; treat it as no usable NVML.
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("NVML unusable: %v", r)
		}
	}()
	if err := initNVML(); err != nil {
		return nil, err
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
	}
	for i := 0; i < n && i < table.MaxGPUs; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", i, nvml.ErrorString(ret))
		}
		g := table.GPUInfo{Index: i}
		g.Name, _ = dev.GetName()
		g.UUID, _ = dev.GetUUID()
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemTotal = mem.Total
		}
		g.SMCount = smCount(dev)
		if g.SMCount == 0 {
			return nil, fmt.Errorf("GPU %d (%s): cannot learn its SM count from NVML", i, g.UUID)
		}
		out = append(out, g)
	}
	return out, nil
}

// smCount asks NVML for the multiprocessor count; full GPUs often do not answer GetAttributes, so it falls back to
// CUDA cores divided by the cores per SM of the compute capability.
func smCount(dev nvml.Device) uint32 {
	if a, ret := dev.GetAttributes(); ret == nvml.SUCCESS && a.MultiprocessorCount > 0 {
		return a.MultiprocessorCount
	}
	cores, ret := dev.GetNumGpuCores()
	if ret != nvml.SUCCESS || cores <= 0 {
		return 0
	}
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return 0
	}
	return uint32(cores / CoresPerSM(major, minor))
}

// CoresPerSM is the FP32 cores per SM of a compute capability.
func CoresPerSM(major, minor int) int {
	switch {
	case major == 7:
		return 64
	case major == 8 && minor == 0:
		return 64
	case major < 7:
		return 128
	default: // 8.6, 8.9, 9.x, 10.x, 12.x
		return 128
	}
}
