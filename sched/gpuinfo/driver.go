package gpuinfo

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/detshare/detshare/internal/gpufacts"
)

var archNames = map[nvml.DeviceArchitecture]string{nvml.DEVICE_ARCH_KEPLER: "kepler", nvml.DEVICE_ARCH_MAXWELL: "maxwell",
	nvml.DEVICE_ARCH_PASCAL: "pascal", nvml.DEVICE_ARCH_VOLTA: "volta", nvml.DEVICE_ARCH_TURING: "turing",
	nvml.DEVICE_ARCH_AMPERE: "ampere", nvml.DEVICE_ARCH_ADA: "ada", nvml.DEVICE_ARCH_HOPPER: "hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "blackwell", nvml.DEVICE_ARCH_RUBIN: "rubin"}

// Facts asks NVML for the driver's facts and each GPU's (by NVML index): the attributes DetShare's DRA driver publishes
// on each GPU's devices. What a driver does not answer stays unknown.
func Facts() (f gpufacts.Driver, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, err = gpufacts.Driver{}, fmt.Errorf("NVML unusable: %v", r)
		}
	}()
	if err := initNVML(); err != nil {
		return f, err
	}
	defer nvml.Shutdown()
	f.Version, _ = nvml.SystemGetDriverVersion()
	if v, ret := nvml.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		f.CUDAVersion = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return f, fmt.Errorf("nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
	}
	f.GPUs = map[int]gpufacts.GPU{}
	archKnown := nvml.Extensions().LookupSymbol("nvmlDeviceGetArchitecture") == nil
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g := gpufacts.GPU{CCMajor: -1, CCMinor: -1}
		if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			g.CCMajor, g.CCMinor = major, minor
		}
		if archKnown {
			if a, ret := dev.GetArchitecture(); ret == nvml.SUCCESS {
				g.Architecture = archNames[a]
			}
		}
		f.GPUs[i] = g
	}
	return f, nil
}
