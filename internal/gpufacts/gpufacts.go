// Package gpufacts holds what NVML tells of the driver and each GPU beyond discovery (sched/gpuinfo reads them;
// the DRA plugin publishes them as device attributes): data only, so both wings can use it.
package gpufacts

// Driver is the driver's facts and each GPU's, by NVML index.
type Driver struct {
	Version     string // nvmlSystemGetDriverVersion, e.g. 580.95.05
	CUDAVersion int    // nvmlSystemGetCudaDriverVersion, e.g. 13000 (13.0); 0 unknown
	GPUs        map[int]GPU
}

// GPU is one GPU's architecture and compute capability.
type GPU struct {
	Architecture string // lower case: volta, turing, ampere, ada, hopper, blackwell, …; "" unknown
	CCMajor      int    // compute capability; -1 unknown
	CCMinor      int
}

// AllGPUs is the GPU index of an event that concerns every GPU of the host: NVML reporting a GPU lost
// (nvmlEventSetWait's NVML_ERROR_GPU_IS_LOST names none).
const AllGPUs = -1
