package dra

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/k8s/deviceplugin"
)

func testDriver(t *testing.T) *Driver {
	inv := deviceplugin.FromInfo([]table.GPUInfo{{Index: 0, UUID: "SIM-0", SMCount: 132, MemTotal: 80 << 30},
		{Index: 1, UUID: "SIM-1", SMCount: 132, MemTotal: 80 << 30}})
	return &Driver{Inventory: inv, CDIDir: t.TempDir()}
}

func claimFor(devices []string, pool string, config string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}}}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DriverName, Pool: pool, Device: d})
	}
	if config != "" {
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName,
				Parameters: runtime.RawExtension{Raw: []byte(config)}}}}}
	}
	return c
}

// Each GPU is a pool named after the node and the GPU (node-1/gpu1): the scheduler tells devices apart by driver,
// pool and name across nodes. A claim allocated a device of another node's pool is refused.
func TestSlicesOnePoolPerGPU(t *testing.T) {
	d := testDriver(t)
	d.Node = "node-1"
	named := Slices(d.Inventory, nil, SliceOptions{Node: "node-1", Consumable: true})
	if _, ok := named.Pools["node-1/gpu1"]; !ok || len(named.Pools) != 2 {
		t.Fatalf("pools %v, want node-1/gpu0 and node-1/gpu1", keysOf(named.Pools))
	}
	if _, _, err := d.Env(claimFor([]string{"gpu1"}, "node-1/gpu1", "")); err != nil {
		t.Errorf("claim on node-1/gpu1: %v", err)
	}
	if _, _, err := d.Env(claimFor([]string{"gpu1"}, "node-2/gpu1", "")); err == nil || !strings.Contains(err.Error(), "no such device on this node") {
		t.Errorf("claim on another node's pool node-2/gpu1: %v, want a refusal", err)
	}

	res := Slices(testDriver(t).Inventory, nil, SliceOptions{Taints: true})
	if len(res.Pools) != 2 || len(res.Pools["gpu1"].Slices[0].Devices) != 15 {
		t.Fatalf("pools: %+v", res.Pools)
	}
	dev := res.Pools["gpu1"].Slices[0].Devices[3]
	sms := dev.Capacity["sms"].Value
	if dev.Name != "gpu1-sm-3" || *dev.Attributes["uuid"].StringValue != "SIM-1" || sms.Value() != 8 {
		t.Errorf("device: %+v", dev)
	}
}

func TestEnvFromAllocationAndConfig(t *testing.T) {
	d := testDriver(t)
	env, devs, err := d.Env(claimFor([]string{"gpu1-sm-0", "gpu1-sm-1"}, "gpu1", ""))
	if err != nil {
		t.Fatal(err)
	}
	// 2 of 15 groups: 2/15 of 80 GiB, in whole MiB.
	if want := []string{"DETSHARE_ALLOC_TIER=burstable", "DETSHARE_ALLOC_SMS=16", "DETSHARE_ALLOC_MEMORY=10922Mi",
		"DETSHARE_ALLOC_GPU=1", "DETSHARE_ALLOC_WEIGHT=1", "DETSHARE_ALLOC_ROLE=none"}; !reflect.DeepEqual(env, want) {
		t.Errorf("env = %v, want %v", env, want)
	}
	if len(devs) != 2 || devs[0].CDIDeviceIDs[0] != "detshare.io/gpu=uid-1" {
		t.Errorf("devices = %+v", devs)
	}
	env, _, err = d.Env(claimFor([]string{"gpu0-sm-0"}, "gpu0",
		`{"apiVersion":"detshare.io/v1alpha1","kind":"DetShareConfig","tier":"latency-critical","sms":"25%","memory":"8Gi","sloP99":"20ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"DETSHARE_ALLOC_TIER=latency-critical", "DETSHARE_ALLOC_SMS=8", "DETSHARE_ALLOC_MEMORY=8Gi",
		"DETSHARE_ALLOC_GPU=0", "DETSHARE_ALLOC_WEIGHT=1", "DETSHARE_ALLOC_ROLE=none", "DETSHARE_SMS=25%", "DETSHARE_SLO_P99=20ms"}; !reflect.DeepEqual(env, want) {
		t.Errorf("env = %v, want %v", env, want)
	}
}

// Claims and their opaque parameters are written by users: anything malformed is refused with the reason and no
// CDI spec is written.
func TestBadClaimsRefused(t *testing.T) {
	d := testDriver(t)
	ok := `{"apiVersion":"detshare.io/v1alpha1","kind":"DetShareConfig"`
	for _, c := range []struct {
		devs   []string
		pool   string
		config string
		want   string
	}{
		{[]string{"gpu0-sm-0", "gpu1-sm-0"}, "gpu0", "", "no such device"},
		{[]string{"gpu0-sm-15"}, "gpu0", "", "no such device"},
		{[]string{"gpu0-sm-01"}, "gpu0", "", "not one of"},
		{[]string{"gpu7"}, "gpu7", "", "no such device"},
		{[]string{"../../x"}, "gpu0", "", "not one of"},
		{nil, "gpu0", "", "no gpu.detshare.io device"},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"tier":"gold"}`, `tier="gold"`},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"memory":"lots"}`, `memory="lots"`},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"memory":"0"}`, `memory="0"`},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"memory":"81Gi"}`, "up to GPU 0's 80Gi"},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"sms":"200%"}`, `DETSHARE_SMS="200%"`},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"tier":"best-effort","sms":"8"}`, "best-effort tenant has no guaranteed SMs"},
		{[]string{"gpu0-sm-0"}, "gpu0", ok + `,"privileged":true}`, "unknown field"},
		{[]string{"gpu0-sm-0"}, "gpu0", `{"apiVersion":"v1","kind":"Pod"}`, "want DetShareConfig"},
	} {
		claim := claimFor(c.devs, c.pool, c.config)
		res, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
		if err := res[claim.UID].Err; err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %s: err = %v, want %q", c.devs, c.config, err, c.want)
		}
	}
	if ents, _ := os.ReadDir(d.CDIDir); len(ents) != 0 {
		t.Errorf("CDI specs written for refused claims: %v", ents)
	}
}

func TestPrepareWritesAndUnprepareRemovesSpec(t *testing.T) {
	d := testDriver(t)
	claim := claimFor([]string{"gpu0-sm-0"}, "gpu0", "")
	res, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if res[claim.UID].Err != nil {
		t.Fatal(res[claim.UID].Err)
	}
	data, err := os.ReadFile(d.specPath(claim.UID))
	if err != nil || !strings.Contains(string(data), `"DETSHARE_ALLOC_SMS=8"`) || !strings.Contains(string(data), `"kind":"detshare.io/gpu"`) {
		t.Fatalf("CDI spec: %s (%v)", data, err)
	}
	d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: claim.UID}})
	if _, err := os.Stat(d.specPath(claim.UID)); !os.IsNotExist(err) {
		t.Errorf("CDI spec left after unprepare: %v", err)
	}
}

// The claim's CDI spec gives the claim's GPU: its device node (the simulated GPU's, a test double of /dev/nvidia<N>)
// with its numbers, beside the quota env.
func TestPrepareSpecHasTheGPUDeviceNode(t *testing.T) {
	d := testDriver(t)
	d.Devices = cdi.Simulated{}
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claimFor([]string{"gpu1-sm-0"}, "gpu1", "")})
	if err != nil || res["uid-1"].Err != nil {
		t.Fatalf("prepare: %v %v", err, res["uid-1"].Err)
	}
	s, err := cdi.Load(d.specPath("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	e, ok := s.Device("uid-1")
	if !ok || len(e.DeviceNodes) != 1 {
		t.Fatalf("spec %+v", s)
	}
	n := e.DeviceNodes[0]
	if n.Path != "/dev/detshare-simgpu1" || n.HostPath != cdi.SimNodeHostPath || n.Type != "c" || n.Major != 1 || n.Minor != 3 {
		t.Errorf("device node %+v, want GPU 1's", n)
	}
	if !reflect.DeepEqual(e.Env, []string{"DETSHARE_ALLOC_TIER=burstable", "DETSHARE_ALLOC_SMS=8", "DETSHARE_ALLOC_MEMORY=5461Mi",
		"DETSHARE_ALLOC_GPU=1", "DETSHARE_ALLOC_WEIGHT=1", "DETSHARE_ALLOC_ROLE=none"}) {
		t.Errorf("env %v", e.Env)
	}
}

// A GPU the scheduler reports unhealthy (its MPS control daemon failed) has its devices tainted NoSchedule, with the reason,
// where device taints are on; the other GPU's devices are not; off, no device is tainted.
func TestSlicesTaintUnhealthyGPU(t *testing.T) {
	inv := testDriver(t).Inventory
	res := Slices(inv, map[int]string{1: deviceplugin.ReasonMPSFailed}, SliceOptions{Taints: true})
	for _, d := range res.Pools["gpu1"].Slices[0].Devices {
		if len(d.Taints) != 1 || d.Taints[0].Key != TaintKey || d.Taints[0].Value != "mps-failed" || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Fatalf("GPU 1 device %s taints %+v, want %s=mps-failed:NoSchedule", d.Name, d.Taints, TaintKey)
		}
	}
	for _, d := range res.Pools["gpu0"].Slices[0].Devices {
		if len(d.Taints) != 0 {
			t.Fatalf("healthy GPU 0 device %s tainted: %+v", d.Name, d.Taints)
		}
	}
	for _, p := range Slices(inv, map[int]string{1: deviceplugin.ReasonMPSFailed}, SliceOptions{}).Pools {
		for _, d := range p.Slices[0].Devices {
			if len(d.Taints) != 0 {
				t.Fatalf("device taints off, yet %s is tainted", d.Name)
			}
		}
	}
}

// On Kubernetes 1.36+ (consumable capacity) each GPU is one device many claims share, with capacity sms (min and
// step one SM group, max the GPU's guaranteed SMs) and memory (step 1 MiB); a claim's consumedCapacity is its
// ceiling: its config may lower the memory, never raise it, and a consumption that is not whole groups is refused.
func TestConsumableCapacity(t *testing.T) {
	d := testDriver(t)
	res := Slices(d.Inventory, nil, SliceOptions{Consumable: true})
	devs := res.Pools["gpu1"].Slices[0].Devices
	if len(devs) != 1 || devs[0].Name != "gpu1" || devs[0].AllowMultipleAllocations == nil || !*devs[0].AllowMultipleAllocations {
		t.Fatalf("GPU 1: devices %+v, want one shared device gpu1", devs)
	}
	sms, mem := devs[0].Capacity[CapacitySMs], devs[0].Capacity[CapacityMemory]
	r := sms.RequestPolicy
	if sms.Value.Value() != 120 || r == nil || r.Default.Value() != 8 || r.ValidRange.Min.Value() != 8 || r.ValidRange.Step.Value() != 8 ||
		r.ValidRange.Max.Value() != 120 {
		t.Errorf("sms capacity %+v (policy %+v), want 120 with default, min and step 8, max 120", sms.Value, r)
	}
	m := mem.RequestPolicy
	if mem.Value.Value() != 80<<30 || m == nil || m.ValidRange.Step.Value() != 1<<20 || m.ValidRange.Min.Value() != 1<<20 ||
		m.Default.Value() != (80<<30)/15&^(1<<20-1) {
		t.Errorf("memory capacity %+v (policy %+v), want 80 GiB, step and min 1 MiB, default one group's share", mem.Value, m)
	}
	if v := devs[0].Attributes["smGroupSize"].IntValue; v == nil || *v != 8 {
		t.Errorf("attribute smGroupSize %v, want 8", v)
	}

	claim := func(consumed map[resourceapi.QualifiedName]string, config string) *resourceapi.ResourceClaim {
		c := claimFor([]string{"gpu1"}, "gpu1", config)
		if consumed != nil {
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
			for k, v := range consumed {
				c.Status.Allocation.Devices.Results[0].ConsumedCapacity[k] = resource.MustParse(v)
			}
		}
		return c
	}
	for _, tc := range []struct {
		consumed map[resourceapi.QualifiedName]string
		config   string
		want     []string
	}{
		{map[resourceapi.QualifiedName]string{"sms": "40", "memory": "12Gi"}, "", []string{"DETSHARE_ALLOC_SMS=40", "DETSHARE_ALLOC_MEMORY=12Gi"}},
		{map[resourceapi.QualifiedName]string{"sms": "40", "memory": "12Gi"}, cfgHead + `,"memory":"16Gi"}`, []string{"DETSHARE_ALLOC_MEMORY=12Gi"}},
		{map[resourceapi.QualifiedName]string{"sms": "40", "memory": "12Gi"}, cfgHead + `,"memory":"8Gi"}`, []string{"DETSHARE_ALLOC_MEMORY=8Gi"}},
		{nil, "", []string{"DETSHARE_ALLOC_SMS=120", "DETSHARE_ALLOC_MEMORY=80Gi"}}, // allocated whole
	} {
		env, _, err := d.Env(claim(tc.consumed, tc.config))
		if err != nil {
			t.Errorf("%v %s: %v", tc.consumed, tc.config, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(strings.Join(env, " "), w) {
				t.Errorf("%v %s: env %v, want %s", tc.consumed, tc.config, env, w)
			}
		}
	}
	for _, bad := range []map[resourceapi.QualifiedName]string{{"sms": "12", "memory": "1Gi"}, {"sms": "128", "memory": "1Gi"},
		{"sms": "8", "memory": "81Gi"}, {"sms": "8"}} {
		if _, _, err := d.Env(claim(bad, "")); err == nil || !strings.Contains(err.Error(), "consumed") {
			t.Errorf("consumed %v: %v, want a refusal", bad, err)
		}
	}
}

// Where partitionable devices are served, each GPU's pool has a counter set (its SMs and memory) in its own slice,
// and two devices that both consume all of it: the shared gpu<i> and gpu<i>-whole, so the scheduler gives the GPU to
// SM claims or to one whole-GPU claim, never both. Every device carries wholeGPU (the DeviceClasses select on it),
// product and mpsAvailable (false while the GPU's MPS is failed). A whole-GPU allocation is the whole GPU's ceiling
// and its device metadata says so; a whole-GPU allocation claiming consumed capacity is refused.
func TestPartitionableWholeGPU(t *testing.T) {
	d := testDriver(t)
	d.Inventory.GPUs[1].Product = "NVIDIA H100 80GB HBM3"
	res := Slices(d.Inventory, map[int]string{1: deviceplugin.ReasonMPSFailed}, SliceOptions{Consumable: true, Partitionable: true, Taints: true})
	sl := res.Pools["gpu1"].Slices
	if len(sl) != 2 || len(sl[0].Devices) != 0 || len(sl[0].SharedCounters) != 1 || len(sl[1].SharedCounters) != 0 {
		t.Fatalf("GPU 1 slices %+v, want a counters-only slice then a devices-only slice", sl)
	}
	cs := sl[0].SharedCounters[0]
	val := func(c map[string]resourceapi.Counter, k string) int64 { q := c[k].Value; return q.Value() }
	if cs.Name != "gpu1" || val(cs.Counters, "sms") != 120 || val(cs.Counters, "memory") != 80<<30 {
		t.Errorf("counter set %+v, want gpu1 with sms 120 and memory 80 GiB", cs)
	}
	devs := sl[1].Devices
	if len(devs) != 2 || devs[0].Name != "gpu1" || devs[1].Name != "gpu1-whole" || devs[1].AllowMultipleAllocations != nil {
		t.Fatalf("GPU 1 devices %+v, want shared gpu1 and exclusive gpu1-whole", devs)
	}
	for i, whole := range []bool{false, true} {
		dv := devs[i]
		if len(dv.ConsumesCounters) != 1 || dv.ConsumesCounters[0].CounterSet != "gpu1" || val(dv.ConsumesCounters[0].Counters, "sms") != 120 ||
			val(dv.ConsumesCounters[0].Counters, "memory") != 80<<30 {
			t.Errorf("%s consumes %+v, want all of gpu1's counters", dv.Name, dv.ConsumesCounters)
		}
		if w := dv.Attributes[AttrWhole].BoolValue; w == nil || *w != whole {
			t.Errorf("%s wholeGPU %v, want %v", dv.Name, w, whole)
		}
		if p := dv.Attributes[AttrProduct].StringValue; p == nil || *p != "NVIDIA H100 80GB HBM3" {
			t.Errorf("%s product %v", dv.Name, p)
		}
		if m := dv.Attributes[AttrMPSAvailable].BoolValue; m == nil || *m {
			t.Errorf("%s of the GPU whose MPS failed: mpsAvailable %v, want false", dv.Name, m)
		}
		if len(dv.Taints) != 1 || dv.Taints[0].Key != TaintKey {
			t.Errorf("%s taints %+v, want %s", dv.Name, dv.Taints, TaintKey)
		}
	}
	for _, dv := range Slices(d.Inventory, nil, SliceOptions{}).Pools["gpu0"].Slices[0].Devices {
		if w := dv.Attributes[AttrWhole].BoolValue; w == nil || *w {
			t.Fatalf("per-group device %s: wholeGPU %v, want false (the class selectors read it)", dv.Name, w)
		}
	}

	claim := claimFor([]string{"gpu1-whole"}, "gpu1", cfgHead+`,"tier":"latency-critical"}`)
	env, _, c, err := d.resolve(claim)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"DETSHARE_ALLOC_SMS=120", "DETSHARE_ALLOC_MEMORY=80Gi", "DETSHARE_ALLOC_TIER=latency-critical", "DETSHARE_ALLOC_GPU=1"} {
		if !strings.Contains(strings.Join(env, " "), w) {
			t.Errorf("whole GPU 1: env %v, want %s", env, w)
		}
	}
	md := d.metadata(c).Attributes
	if *md[MetaGrantedSMs].IntValue != 120 || *md[MetaTier].StringValue != "latency-critical" || *md[MetaMemoryLimit].IntValue != 80<<30 ||
		*md[AttrUUID].StringValue != "SIM-1" || *md[AttrGPU].IntValue != 1 {
		t.Errorf("whole GPU 1 metadata %+v", md)
	}
	claim.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"sms": resource.MustParse("8")}
	if _, _, err := d.Env(claim); err == nil || !strings.Contains(err.Error(), "not shared") {
		t.Errorf("whole GPU with consumed capacity: %v, want a refusal", err)
	}
}

// Prepare hands the device metadata (KEP-5304) of what the claim was granted to the kubelet plugin helper, and the
// allocation's share ID of a shared device back to kubelet.
func TestPrepareGivesMetadataAndShareID(t *testing.T) {
	d := testDriver(t)
	claim := claimFor([]string{"gpu0"}, "gpu0", "")
	share := types.UID("share-1")
	r := &claim.Status.Allocation.Devices.Results[0]
	r.ShareID = &share
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"sms": resource.MustParse("40"), "memory": resource.MustParse("12Gi")}
	out, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil || out[claim.UID].Err != nil {
		t.Fatal(err, out[claim.UID].Err)
	}
	dev := out[claim.UID].Devices[0]
	if dev.ShareID == nil || *dev.ShareID != share {
		t.Errorf("share ID %v, want %s", dev.ShareID, share)
	}
	if dev.Metadata == nil {
		t.Fatal("no device metadata")
	}
	md := dev.Metadata.Attributes
	if *md[MetaGrantedSMs].IntValue != 40 || *md[MetaTier].StringValue != "burstable" || *md[MetaMemoryLimit].IntValue != 12<<30 {
		t.Errorf("metadata %+v, want 40 SMs, burstable, 12 GiB", md)
	}
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
