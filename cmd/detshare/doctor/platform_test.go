package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/kubeletdevices"
)

// The platform checks report what a Kubernetes node has around DetShare: the toolkit, the CDI specs by kind, the
// kubelet's version, the device plugins and DRA drivers registered with kubelet; a GPU advertised by DetShare's
// device plugin and NVIDIA's fails the report naming both and the fix; absent pieces are only Info.
func TestPlatformReportsToolkitCDIKubeletPluginsAndDrivers(t *testing.T) {
	drv := DriverInfo{DriverVersion: "580.1", CUDAVersion: 13000, GPUs: []GPU{{Index: 0, UUID: "GPU-aaaa"}, {Index: 1, UUID: "GPU-bbbb"}}}
	env := fakeEnv(t, map[string]string{"nvidia-ctk": "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: x",
		"kubelet": "Kubernetes v1.34.4\n"}, nil, drv)
	env.ReadFile = os.ReadFile
	kubelet := t.TempDir()
	cdi1, cdi2, dp, preg := t.TempDir(), t.TempDir(), t.TempDir(), filepath.Join(kubelet, "plugins_registry")
	os.MkdirAll(preg, 0o755)
	os.MkdirAll(filepath.Join(kubelet, "plugins/gpu.detshare.io"), 0o755)
	os.WriteFile(filepath.Join(kubelet, "plugins/gpu.detshare.io", kubeletdevices.PlatformFile), []byte(`{"kubernetes": "v1.36.3",
		"served": ["consumableCapacity", "partitionableDevices", "deviceTaints"], "published": [0], "withheld": ["GPU 1 (GPU-bbbb): xid-79"]}`), 0o644)
	env.CDIDirs, env.DevicePluginDir, env.PluginsRegistry = []string{cdi1, cdi2}, dp, preg
	os.WriteFile(filepath.Join(cdi1, "nvidia.yaml"), []byte("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: []\n"), 0o644)
	for _, n := range []string{"a.json", "b.json"} {
		os.WriteFile(filepath.Join(cdi2, n), []byte(`{"cdiVersion":"0.6.0","kind":"detshare.io/gpu","devices":[]}`), 0o644)
	}
	os.WriteFile(filepath.Join(dp, kubeletdevices.CheckpointFile), []byte(`{"Data":{"RegisteredDevices":{
		"detshare.io/gpu":["gpu0-sm-0","gpu0-sm-1"],"detshare.io/gpu-memory":["gpu0-mem-0"],"nvidia.com/gpu":["GPU-bbbb"]}},"Checksum":1}`), 0o644)
	for _, s := range []string{"gpu.detshare.io-reg.sock", "gpu.nvidia.com-reg.sock", "other.txt"} {
		os.WriteFile(filepath.Join(preg, s), nil, 0o644)
	}
	r := Run(env)
	for name, want := range map[string][]string{
		"nvidia toolkit": {"nvidia-ctk", "1.17.8"},
		"cdi":            {"nvidia.com/gpu (" + filepath.Join(cdi1, "nvidia.yaml") + ")", "detshare.io/gpu (2 specs)"},
		"kubernetes":     {"Kubernetes v1.34.4"},
		"device plugins": {"detshare.io/gpu: 2", "nvidia.com/gpu: 1", "GPU 1 (GPU-bbbb): nvidia.com/gpu"},
		"dra drivers": {"gpu.detshare.io, gpu.nvidia.com", "gpu.detshare.io found Kubernetes v1.36.3 serving DRA features: " +
			"consumableCapacity, partitionableDevices, deviceTaints", "GPU 1 (GPU-bbbb): xid-79"},
	} {
		c := find(r, name)
		for _, w := range want {
			if !strings.Contains(c.Found, w) {
				t.Errorf("%s: found %q, want it to name %q", name, c.Found, w)
			}
		}
	}
	if c := find(r, "device plugins"); c.Status != OK {
		t.Errorf("device plugins on different GPUs: %+v, want ok", c)
	}
	if c := find(r, "dra drivers"); c.Status != Warn || !strings.Contains(c.Fix, "NVIDIA") {
		t.Errorf("both DRA drivers: %+v, want a warning saying what to do", c)
	}

	// NVIDIA's plugin advertises GPU 0, which DetShare's serves too.
	os.WriteFile(filepath.Join(dp, kubeletdevices.CheckpointFile), []byte(`{"Data":{"RegisteredDevices":{
		"detshare.io/gpu":["gpu0-sm-0"],"nvidia.com/gpu":["GPU-aaaa::0","GPU-aaaa::1"]}},"Checksum":1}`), 0o644)
	r = Run(env)
	c := find(r, "device plugins")
	if c.Status != Fail || !strings.Contains(c.Found, "GPU 0 (GPU-aaaa): detshare.io/gpu and nvidia.com/gpu") ||
		!strings.Contains(c.Fix, "--gpus") || r.Ready {
		t.Errorf("GPU 0 advertised twice: %+v (ready %v), want a failure naming the GPU, both resources and the fix", c, r.Ready)
	}

	// A node without any of it: Info, and the report stays ready.
	env = fakeEnv(t, nil, nil, drv)
	env.DevicePluginDir, env.PluginsRegistry = t.TempDir(), filepath.Join(t.TempDir(), "missing")
	r = Run(env)
	for _, name := range []string{"nvidia toolkit", "cdi", "kubernetes", "device plugins", "dra drivers"} {
		if c := find(r, name); c.Status != Info {
			t.Errorf("%s on a node without it: %+v, want info", name, c)
		}
	}
}
