package specmod

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/cdi"
)

func u32(v uint32) *uint32 { return &v }

// gpuEdit is GPU index's edit as cdi.Driver generates it (nodes with numbers, a library, the loader hook).
func gpuEdit(index int, minor int64) cdi.Edit {
	node := "/dev/nvidia" + string(rune('0'+minor))
	return cdi.Edit{GPU: cdi.GPU{Index: index, UUID: "GPU-x"}, From: "driver files under /", Node: node,
		Edits: cdi.ContainerEdits{
			DeviceNodes: []cdi.DeviceNode{{Path: node, Type: "c", Major: 195, Minor: minor, FileMode: u32(0o666)},
				{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255, FileMode: u32(0o666)},
				{Path: "/dev/nvidia-uvm", Type: "c", Major: 508, Minor: 0, FileMode: u32(0o666)}},
			Mounts: []cdi.Mount{{HostPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
				ContainerPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Type: "bind", Options: cdi.MountOptions}},
			Hooks: []cdi.Hook{{HookName: "createContainer", Path: "/usr/bin/detshare-hook",
				Args: []string{"detshare-hook", "ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"}}},
		}}
}

func mustParse(t *testing.T, s string) *Spec {
	t.Helper()
	sp, err := Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func TestForGPUAddsExactlyThePlacedGPUOnce(t *testing.T) {
	s := mustParse(t, `{"process":{"env":["PATH=/bin"]},"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}`)
	e := gpuEdit(1, 1)
	for i := 0; i < 3; i++ { // a retried create applies it again
		if err := ForGPU(e).Modify(s); err != nil {
			t.Fatal(err)
		}
	}
	devs := s.Devices()
	want := []LinuxDevice{{"/dev/nvidia1", "c", 195, 1}, {"/dev/nvidiactl", "c", 195, 255}, {"/dev/nvidia-uvm", "c", 508, 0}}
	if len(devs) != len(want) {
		t.Fatalf("devices %+v, want %+v", devs, want)
	}
	for i := range want {
		if devs[i] != want[i] {
			t.Errorf("device %d = %+v, want %+v", i, devs[i], want[i])
		}
	}
	data, _ := s.Bytes()
	js := string(data)
	for _, rule := range []string{`{"access":"rwm","allow":true,"major":195,"minor":1,"type":"c"}`,
		`{"access":"rwm","allow":true,"major":508,"minor":0,"type":"c"}`} {
		if strings.Count(js, rule) != 1 {
			t.Errorf("allow rule %s appears %d times:\n%s", rule, strings.Count(js, rule), js)
		}
	}
	if strings.Count(js, `"/usr/lib/x86_64-linux-gnu/libcuda.so.1"`) != 1 || len(s.Hooks("createContainer")) != 1 {
		t.Errorf("library mount or loader hook duplicated:\n%s", js)
	}
	if strings.Contains(js, "nvidia0") {
		t.Errorf("another GPU's node in the spec:\n%s", js)
	}
	if s.Annotations()[GPUAnnotation] != "/dev/nvidia1" {
		t.Errorf("annotation %q", s.Annotations()[GPUAnnotation])
	}
}

// docker --gpus through CDI (or the NVIDIA device plugin) already put the placed GPU in: only the missing pieces
// are added and NVIDIA's own entries stay as they are.
func TestForGPUComposesWithNVIDIAInjectedGPU(t *testing.T) {
	s := mustParse(t, `{"process":{"env":["NVIDIA_VISIBLE_DEVICES=void"]},
		"mounts":[{"destination":"/usr/lib/x86_64-linux-gnu/libcuda.so.1","type":"bind","source":"/nvidia/own","options":["ro"]}],
		"linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":1}],
		"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":1,"access":"mrw"}]}}}`)
	if err := ForGPU(gpuEdit(1, 1)).Modify(s); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Devices()); n != 3 {
		t.Errorf("%d devices, want the existing GPU node plus nvidiactl and nvidia-uvm", n)
	}
	data, _ := s.Bytes()
	if c := strings.Count(string(data), `"minor":1,`); c != 2 { // the node and its one rule
		t.Errorf("GPU node or rule duplicated (%d):\n%s", c, data)
	}
	if m := s.Mounts(); len(m) != 1 || m[0].Source != "/nvidia/own" {
		t.Errorf("NVIDIA's library mount replaced: %+v", m)
	}
}

func TestForGPURefusesAContainerHoldingAnotherGPU(t *testing.T) {
	s := mustParse(t, `{"linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}`)
	before, _ := s.Bytes()
	err := ForGPU(gpuEdit(1, 1)).Modify(s)
	if err == nil || !strings.Contains(err.Error(), "/dev/nvidia0") || !strings.Contains(err.Error(), "/dev/nvidia1") ||
		!strings.Contains(err.Error(), "detshare.io/gpu") {
		t.Fatalf("err = %v; want both GPUs and the fix named", err)
	}
	after, _ := s.Bytes()
	if string(before) != string(after) {
		t.Errorf("spec changed on refusal")
	}
}

// NVIDIA's legacy hook injects NVIDIA_VISIBLE_DEVICES itself: DetShare adds nothing when that includes the placed
// GPU and refuses when it does not.
func TestForGPUWithNVIDIALegacyHook(t *testing.T) {
	spec := func(visible string) *Spec {
		return mustParse(t, `{"process":{"env":["NVIDIA_VISIBLE_DEVICES=`+visible+`"]},
			"hooks":{"prestart":[{"path":"/usr/bin/nvidia-container-runtime-hook","args":["nvidia-container-runtime-hook","prestart"]}]}}`)
	}
	for _, v := range []string{"all", "1", "0,1", "GPU-x"} {
		s := spec(v)
		if err := ForGPU(gpuEdit(1, 1)).Modify(s); err != nil {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%s: %v", v, err)
		}
		if len(s.Devices()) != 0 || len(s.Mounts()) != 0 {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%s: DetShare added entries beside NVIDIA's hook", v)
		}
		if !GPUProvided(s) {
			t.Error("GPUProvided false with NVIDIA's hook")
		}
	}
	if err := ForGPU(gpuEdit(1, 1)).Modify(spec("0")); err == nil || !strings.Contains(err.Error(), "NVIDIA_VISIBLE_DEVICES") {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=0 for a tenant on GPU 1: %v", err)
	}
}

// A CDI node without numbers (nvidia-ctk writes paths only) is numbered from the host node; bad nodes are refused.
func TestCDIEditsNumbersAndRefusals(t *testing.T) {
	s := mustParse(t, `{}`)
	if err := CDIEdits(cdi.ContainerEdits{DeviceNodes: []cdi.DeviceNode{{Path: "/dev/x-null", HostPath: "/dev/null"}},
		Env: []string{"A=1"}}).Modify(s); err != nil {
		t.Fatal(err)
	}
	if d := s.Devices(); len(d) != 1 || d[0] != (LinuxDevice{"/dev/x-null", "c", 1, 3}) || s.Env()[0] != "A=1" {
		t.Errorf("devices %+v env %v", d, s.Env())
	}
	for _, e := range []cdi.ContainerEdits{{DeviceNodes: []cdi.DeviceNode{{Path: "dev/rel", Major: 1}}},
		{DeviceNodes: []cdi.DeviceNode{{Path: "/dev/missing", HostPath: "/nonexistent"}}},
		{Env: []string{"NOEQUALS"}}} {
		if err := CDIEdits(e).Modify(mustParse(t, `{}`)); err == nil {
			t.Errorf("accepted %+v", e)
		}
	}
	if err := ForGPU(cdi.Edit{From: "x"}).Modify(s); err == nil {
		t.Error("an edit without a GPU node accepted")
	}
}
