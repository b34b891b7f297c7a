package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/internal/table"
)

const (
	uuid0 = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
	uuid1 = "GPU-9d1b7c55-2a3e-5f4a-0c6d-1e2f3a4b5c6d"
)

// nvidiaHost is a node whose / is mounted at root (as in the plugin's pod): NVIDIA's CDI spec (as nvidia-ctk writes
// it, cgroupgpu/cdi/testdata) and the device nodes it names (symlinks to /dev/null: character devices 1:3).
func nvidiaHost(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	data, err := os.ReadFile("../../cgroupgpu/cdi/testdata/nvidia.yaml")
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "etc/cdi"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/cdi/nvidia.yaml"), data, 0o644)
	os.MkdirAll(filepath.Join(root, "dev"), 0o755)
	for _, n := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
		os.Symlink("/dev/null", filepath.Join(root, "dev", n))
	}
	return root
}

func allocate(t *testing.T, resource string, devices cdi.Source, inv Inventory, ids ...string) *pluginapi.ContainerAllocateResponse {
	t.Helper()
	p, err := New(resource, t.TempDir(), inv)
	if err != nil {
		t.Fatal(err)
	}
	p.Devices = devices
	resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ContainerResponses[0]
}

// Allocate hands out exactly the GPU the units are on: NVIDIA's CDI name for it, its node (not the other GPU's)
// and the control nodes by their host paths, the driver's files read-only.
func TestAllocateGivesTheAllocatedGPU(t *testing.T) {
	inv := FromInfo([]table.GPUInfo{{Index: 0, UUID: uuid0, SMCount: 132, MemTotal: 80 << 30},
		{Index: 1, UUID: uuid1, SMCount: 132, MemTotal: 80 << 30}})
	src := cdi.Host{Root: nvidiaHost(t), StripRoot: true}
	for _, c := range []struct {
		resource string
		ids      []string
	}{{ResourceShares, []string{"gpu1-sm-0", "gpu1-sm-1"}}, {ResourceMemory, []string{"gpu1-mem-0"}}} {
		cr := allocate(t, c.resource, src, inv, c.ids...)
		if cr.Annotations["alloc.detshare.io/gpu"] != "1" {
			t.Errorf("%s: annotations %v", c.resource, cr.Annotations)
		}
		if len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != "nvidia.com/gpu="+uuid1 {
			t.Errorf("%s: CDI devices %v, want nvidia.com/gpu=%s", c.resource, cr.CdiDevices, uuid1)
		}
		nodes := map[string]string{}
		for _, d := range cr.Devices {
			nodes[d.ContainerPath] = d.HostPath
			if d.Permissions != "rwm" {
				t.Errorf("device %+v", d)
			}
		}
		if nodes["/dev/nvidia1"] != "/dev/nvidia1" || nodes["/dev/nvidiactl"] != "/dev/nvidiactl" || nodes["/dev/nvidia-uvm"] != "/dev/nvidia-uvm" {
			t.Errorf("%s: devices %v: want GPU 1's node and the control nodes by their host paths", c.resource, nodes)
		}
		if _, ok := nodes["/dev/nvidia0"]; ok {
			t.Errorf("%s: GPU 0's node handed out for units of GPU 1", c.resource)
		}
		if len(cr.Mounts) == 0 {
			t.Errorf("%s: no driver mounts", c.resource)
		}
		for _, m := range cr.Mounts {
			if !m.ReadOnly || m.HostPath != m.ContainerPath {
				t.Errorf("%s: mount %+v: want read-only at the host path", c.resource, m)
			}
		}
		if cr.Envs["NVIDIA_VISIBLE_DEVICES"] != "void" {
			t.Errorf("%s: envs %v: the spec's env not handed out", c.resource, cr.Envs)
		}
	}
}

// The simulated GPU (a test double): GPU 0's node, no CDI name; a node where the edit fails still allocates
// (annotations only: the runtime handler adds the GPU at create).
func TestAllocateSimulatedGPUAndDegradesWithoutDriver(t *testing.T) {
	inv := testInventory()
	cr := allocate(t, ResourceShares, cdi.Simulated{}, inv, "gpu0-sm-0")
	if len(cr.Devices) != 1 || cr.Devices[0].ContainerPath != "/dev/detshare-simgpu0" || cr.Devices[0].HostPath != cdi.SimNodeHostPath ||
		len(cr.CdiDevices) != 0 {
		t.Errorf("simulated GPU: devices %v cdi %v", cr.Devices, cr.CdiDevices)
	}
	cr = allocate(t, ResourceShares, cdi.Host{Root: t.TempDir(), StripRoot: true}, inv, "gpu1-sm-0")
	if cr.Annotations["alloc.detshare.io/gpu"] != "1" || len(cr.Devices) != 0 {
		t.Errorf("without a driver: %+v", cr)
	}
}
