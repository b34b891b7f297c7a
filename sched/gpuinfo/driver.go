package gpuinfo

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DriverFacts are what NVML tells of the driver and each GPU beyond discovery: the attributes DetShare's DRA driver
// publishes on each GPU's devices.
type DriverFacts struct {
	DriverVersion string // nvmlSystemGetDriverVersion, e.g. 580.95.05
	CUDAVersion   int    // nvmlSystemGetCudaDriverVersion, e.g. 13000 (13.0); 0 unknown
	GPUs          map[int]GPUFacts
}

// GPUFacts are one GPU's architecture and compute capability.
type GPUFacts struct {
	Architecture string // lower case: volta, turing, ampere, ada, hopper, blackwell, …; "" unknown
	CCMajor      int    // compute capability; -1 unknown
	CCMinor      int
}

var archNames = map[nvml.DeviceArchitecture]string{nvml.DEVICE_ARCH_KEPLER: "kepler", nvml.DEVICE_ARCH_MAXWELL: "maxwell",
	nvml.DEVICE_ARCH_PASCAL: "pascal", nvml.DEVICE_ARCH_VOLTA: "volta", nvml.DEVICE_ARCH_TURING: "turing",
	nvml.DEVICE_ARCH_AMPERE: "ampere", nvml.DEVICE_ARCH_ADA: "ada", nvml.DEVICE_ARCH_HOPPER: "hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "blackwell", nvml.DEVICE_ARCH_RUBIN: "rubin"}

// Facts asks NVML for the driver's facts and each GPU's (by NVML index). What a driver does not answer stays unknown.
func Facts() (f DriverFacts, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, err = DriverFacts{}, fmt.Errorf("NVML unusable: %v", r)
		}
	}()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return f, ErrNoDriver
		}
		return f, fmt.Errorf("nvmlInit: %s", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	f.DriverVersion, _ = nvml.SystemGetDriverVersion()
	if v, ret := nvml.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		f.CUDAVersion = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return f, fmt.Errorf("nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
	}
	f.GPUs = map[int]GPUFacts{}
	archKnown := nvml.Extensions().LookupSymbol("nvmlDeviceGetArchitecture") == nil
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g := GPUFacts{CCMajor: -1, CCMinor: -1}
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
