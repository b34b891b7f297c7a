package gpuinfo

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLComputeModes reads and sets a real GPU's compute mode through NVML (nvmlDeviceGetComputeMode,
// nvmlDeviceSetComputeMode; setting needs root), for the scheduler's mps.exclusive (sched/daemon ComputeModes). The
// GPU is its NVML index, as Discover records it. Modes: "default", "exclusive_process", "prohibited".
type NVMLComputeModes struct{}

var modeNames = map[nvml.ComputeMode]string{nvml.COMPUTEMODE_DEFAULT: "default",
	nvml.COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process", nvml.COMPUTEMODE_PROHIBITED: "prohibited"}

func device(gpu int) (nvml.Device, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlInit: %s", nvml.ErrorString(ret))
	}
	d, ret := nvml.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", gpu, nvml.ErrorString(ret))
	}
	return d, nil
}

// ComputeMode reads GPU gpu's compute mode.
func (NVMLComputeModes) ComputeMode(gpu int) (string, error) {
	d, err := device(gpu)
	if err != nil {
		return "", err
	}
	m, ret := d.GetComputeMode()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("nvmlDeviceGetComputeMode(%d): %s", gpu, nvml.ErrorString(ret))
	}
	if n, ok := modeNames[m]; ok {
		return n, nil
	}
	return "", fmt.Errorf("GPU %d: compute mode %d unknown to DetShare", gpu, m)
}

// SetComputeMode sets GPU gpu's compute mode.
func (NVMLComputeModes) SetComputeMode(gpu int, mode string) error {
	for m, n := range modeNames {
		if n != mode {
			continue
		}
		d, err := device(gpu)
		if err != nil {
			return err
		}
		if ret := d.SetComputeMode(m); ret != nvml.SUCCESS {
			return fmt.Errorf("nvmlDeviceSetComputeMode(%d, %s): %s", gpu, mode, nvml.ErrorString(ret))
		}
		return nil
	}
	return fmt.Errorf("GPU %d compute mode %q: allowed values are default, exclusive_process, prohibited", gpu, mode)
}
