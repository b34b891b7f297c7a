package simgpu

import (
	"fmt"

	"github.com/detshare/detshare/cgroupgpu/cdi"
)

// NodeHostPath is the host node whose numbers the simulated GPU's device nodes take (/dev/null's): the runtime
// creates /dev/detshare-simgpu<N> in the container as a character device, as it creates /dev/nvidia<N> for a GPU.
const NodeHostPath = "/dev/null"

// EnvDeviceDir names the directory where the simulated libcuda.so.1 (a test double) looks for its device nodes
// (detshare-simgpu<N>). Unset, every simulated GPU is visible (host tests, like a host with the driver loaded);
// set (the container tests set /dev), cuInit fails with CUDA_ERROR_NO_DEVICE unless a node is there, as the real
// driver does in a container that was not given /dev/nvidia<N>.
const EnvDeviceDir = "DETSHARE_SIMGPU_DEVICE_DIR"

// Devices is the simulated GPU's device source (a test double of cdi.Host): GPU N's edit is its device node
// /dev/detshare-simgpu<N>, numbered as NodeHostPath. The shim, the runc wrapper and the Kubernetes plugins take it
// when the environment selects the simulated GPU, and apply it through the same modifier as a real GPU's edit.
type Devices struct{}

// Edit implements cdi.Source.
func (Devices) Edit(gpu cdi.GPU) (cdi.Edit, error) {
	if gpu.Index < 0 {
		return cdi.Edit{}, fmt.Errorf("simulated GPU (test double): index %d", gpu.Index)
	}
	path := fmt.Sprintf("%s%d", cdi.SimNodePrefix, gpu.Index)
	n, err := cdi.NodeFor(path, NodeHostPath)
	if err != nil {
		return cdi.Edit{}, fmt.Errorf("simulated GPU (test double): %w", err)
	}
	return cdi.Edit{GPU: gpu, From: "simulated GPU (test double)", Node: path,
		Edits: cdi.ContainerEdits{DeviceNodes: []cdi.DeviceNode{n}}}, nil
}
