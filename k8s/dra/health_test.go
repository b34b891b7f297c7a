package dra

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/detshare/detshare/internal/gpufacts"
	"github.com/detshare/detshare/k8s/deviceplugin"
)

// A GPU with a critical Xid is tainted xid-<n> with the configured effect (NoExecute evicts) but keeps
// mpsAvailable (its MPS did not fail); NoSchedule is the default effect.
func TestSlicesTaintXidWithTheConfiguredEffect(t *testing.T) {
	inv := testDriver(t).Inventory
	for _, effect := range []resourceapi.DeviceTaintEffect{"", resourceapi.DeviceTaintEffectNoExecute} {
		res := Slices(inv, map[int]string{0: deviceplugin.ReasonXid(79)}, SliceOptions{Taints: true, Consumable: true, TaintEffect: effect})
		want := effect
		if want == "" {
			want = resourceapi.DeviceTaintEffectNoSchedule
		}
		for _, d := range res.Pools["gpu0"].Slices[0].Devices {
			if len(d.Taints) != 1 || d.Taints[0].Value != "xid-79" || d.Taints[0].Effect != want || !*d.Attributes[AttrMPSAvailable].BoolValue {
				t.Errorf("effect %q: GPU 0 device %s taints %+v mpsAvailable %v, want %s=xid-79:%s and mpsAvailable true",
					effect, d.Name, d.Taints, *d.Attributes[AttrMPSAvailable].BoolValue, TaintKey, want)
			}
		}
	}
}

// The devices carry NVML's facts: architecture, compute capability, driver and CUDA driver versions as semantic
// versions (the apiserver's version attributes); without facts none of them.
func TestSlicesCarryNVMLFacts(t *testing.T) {
	inv := testDriver(t).Inventory
	facts := &gpufacts.Driver{Version: "580.95.05", CUDAVersion: 13010,
		GPUs: map[int]gpufacts.GPU{0: {Architecture: "hopper", CCMajor: 9, CCMinor: 0}, 1: {Architecture: "blackwell", CCMajor: 10, CCMinor: 0}}}
	for _, consumable := range []bool{false, true} {
		res := Slices(inv, nil, SliceOptions{Consumable: consumable, Partitionable: consumable, Facts: facts})
		for pool, arch := range map[string]string{"gpu0": "hopper", "gpu1": "blackwell"} {
			p := res.Pools[pool]
			devs := p.Slices[len(p.Slices)-1].Devices
			for _, d := range devs {
				a := d.Attributes
				cc := map[string]string{"hopper": "9.0.0", "blackwell": "10.0.0"}[arch]
				if a[AttrArchitecture].StringValue == nil || *a[AttrArchitecture].StringValue != arch ||
					a[AttrComputeCapability].VersionValue == nil || *a[AttrComputeCapability].VersionValue != cc ||
					a[AttrDriverVersion].VersionValue == nil || *a[AttrDriverVersion].VersionValue != "580.95.5" ||
					a[AttrCUDADriverVersion].VersionValue == nil || *a[AttrCUDADriverVersion].VersionValue != "13.1.0" {
					t.Errorf("consumable %v: %s device %s attributes %v, want %s, %s, driver 580.95.5, CUDA 13.1.0", consumable, pool, d.Name, a, arch, cc)
				}
			}
		}
	}
	d := Slices(inv, nil, SliceOptions{Consumable: true}).Pools["gpu0"].Slices[0].Devices[0]
	for _, k := range []resourceapi.QualifiedName{AttrArchitecture, AttrComputeCapability, AttrDriverVersion, AttrCUDADriverVersion} {
		if _, ok := d.Attributes[k]; ok {
			t.Errorf("without NVML facts the device has %s", k)
		}
	}
}

func TestSemverOfDriverVersions(t *testing.T) {
	for in, want := range map[string]string{"580.95.05": "580.95.5", "535.104.12": "535.104.12", "580.00-simgpu": "580.0.0-simgpu",
		"550": "550.0.0", "": "", "r580.1": "", "1.2.3.4": "", "580.1-a.b": ""} {
		got, ok := semver(in)
		if got != want || ok != (want != "") {
			t.Errorf("semver(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// A GPU whose UUID a ResourceSlice of NVIDIA's DRA driver publishes on this node is not published at all (its pool
// is left out, so the resourceslice controller deletes it), and comes back when the slice goes.
func TestNVIDIADRASliceWithholdsTheGPU(t *testing.T) {
	inv := testDriver(t).Inventory
	node := "node-1"
	uuid := "sim-1" // NVIDIA's attribute, in another case
	nv := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "node-1-gpu.nvidia.com-x"},
		Spec: resourceapi.ResourceSliceSpec{Driver: NVIDIADriver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: &uuid}}}}}}
	if got := OtherDrivers(inv, []*resourceapi.ResourceSlice{nv}); len(got) != 1 || len(got[1]) != 1 || got[1][0] != "node-1-gpu.nvidia.com-x/gpu-0" {
		t.Fatalf("OtherDrivers: %v, want GPU 1 claimed by node-1-gpu.nvidia.com-x/gpu-0", got)
	}
	client := fake.NewSimpleClientset(nv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := OtherDriverHealth(ctx, client, node, inv)
	if err != nil {
		t.Fatal(err)
	}
	unhealthy := h()
	if unhealthy[1] != deviceplugin.ReasonClaimedElsewhere || len(unhealthy) != 1 {
		t.Fatalf("health with NVIDIA's slice: %v, want GPU 1 %s", unhealthy, deviceplugin.ReasonClaimedElsewhere)
	}
	res := Slices(inv, unhealthy, SliceOptions{Consumable: true, Taints: true})
	if _, ok := res.Pools["gpu1"]; ok || len(res.Pools) != 1 {
		t.Fatalf("pools %v: GPU 1 published while NVIDIA's driver publishes it", keysOf(res.Pools))
	}
	if err := client.ResourceV1().ResourceSlices().Delete(ctx, nv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(h()) > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	if got := h(); len(got) != 0 {
		t.Fatalf("after NVIDIA's slice went: %v, want every GPU published", got)
	}
}

// The node condition says what was found and is True while a GPU is published.
func TestNodeConditionReportsThePlatform(t *testing.T) {
	p := Platform{Driver: &gpufacts.Driver{Version: "580.95.05", CUDAVersion: 13000}, MPS: "GPU 0 running", Toolkit: "not found",
		CDI: "no nvidia.com/gpu spec", Kubernetes: "v1.36.3", Served: Served{ConsumableCapacity: true, DeviceTaints: true}, Published: []int{0}}
	c := p.Condition(time.Now())
	for _, want := range []string{"driver 580.95.05 (CUDA 13.0)", "MPS: GPU 0 running", "NVIDIA toolkit: not found", "CDI: no nvidia.com/gpu spec",
		"Kubernetes v1.36.3", "DRA features served: consumableCapacity, deviceTaints", "GPUs published: 0"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("condition message %q lacks %q", c.Message, want)
		}
	}
	if c.Type != ConditionType || c.Status != corev1.ConditionTrue || c.Reason != ReasonPublishing {
		t.Errorf("condition %+v, want %s True %s", c, ConditionType, ReasonPublishing)
	}
	p.Published, p.Withheld, p.Driver, p.DriverErr = nil, []string{"GPU 0 (GPU-a): claimed-by-other-plugin"}, nil, "no NVIDIA driver"
	c = p.Condition(time.Now())
	if c.Status != corev1.ConditionFalse || c.Reason != ReasonNoGPU || !strings.Contains(c.Message, "GPU 0 (GPU-a): claimed-by-other-plugin") ||
		!strings.Contains(c.Message, "NVML not reachable (no NVIDIA driver)") {
		t.Errorf("no GPU published: %+v", c)
	}
	client := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	if err := SetNodeCondition(context.Background(), client, "n", c); err != nil {
		t.Fatal(err)
	}
	n, _ := client.CoreV1().Nodes().Get(context.Background(), "n", metav1.GetOptions{})
	got := map[corev1.NodeConditionType]string{}
	for _, c := range n.Status.Conditions {
		got[c.Type] = c.Reason
	}
	if len(n.Status.Conditions) != 2 || got[ConditionType] != ReasonNoGPU || got[corev1.NodeReady] != "" {
		t.Errorf("node conditions after the patch: %+v, want Ready kept and %s added", n.Status.Conditions, ConditionType)
	}
}

// While nothing changes the condition is set again every beat: its heartbeat moves on, its transition time stays.
func TestNodeConditionHeartbeat(t *testing.T) {
	client := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	p := Platform{Published: []int{0}}
	first := time.Unix(1000, 0)
	if err := SetNodeCondition(context.Background(), client, "n", p.Condition(first)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go KeepNodeCondition(ctx, client, "n", 10*time.Millisecond, p.Condition)
	var c corev1.NodeCondition
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, _ := client.CoreV1().Nodes().Get(context.Background(), "n", metav1.GetOptions{})
		for _, x := range n.Status.Conditions {
			if x.Type == ConditionType {
				c = x
			}
		}
		if c.LastHeartbeatTime.After(first.Add(time.Hour)) {
			break
		}
	}
	if !c.LastHeartbeatTime.After(first.Add(time.Hour)) || !c.LastTransitionTime.Time.Equal(first) {
		t.Fatalf("condition after beats: heartbeat %v, transition %v; want a heartbeat now and the transition kept at %v",
			c.LastHeartbeatTime, c.LastTransitionTime, first)
	}
}
