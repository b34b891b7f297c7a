package dra

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// tenantOf is what the runtime makes of a container with claim: its CDI env (which replaces the pod's variables of
// the same names) after the pod's own environment, and the pod's annotations when the runtime handler passes them.
func tenantOf(t *testing.T, d *Driver, claim *resourceapi.ResourceClaim, podAnn map[string]string, podEnv ...string) (quota.Quota, quota.Placement) {
	t.Helper()
	env, _, err := d.Env(claim)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	r := quota.Inputs{Annotations: podAnn, Env: append(podEnv, env...)}.Resolve()
	if r.Err != nil {
		t.Fatalf("resolve: %v", r.Err)
	}
	p, err := r.Quota.Place(table.GPUState{GPUInfo: table.GPUInfo{Index: 0, UUID: "SIM-0", SMCount: 132, MemTotal: 80 << 30},
		Split: table.EstimateSplit(132, table.DefaultSplitMinSize)})
	if err != nil {
		t.Fatalf("place: %v", err)
	}
	return r.Quota, p
}

const cfgHead = `{"apiVersion":"detshare.io/v1alpha1","kind":"DetShareConfig"`

// (b) A claim's sms is bounded by the devices allocated: one group and sms 100% is one group.
func TestClaimSMsBoundedByDevices(t *testing.T) {
	q, p := tenantOf(t, testDriver(t), claimFor([]string{"gpu0-sm-0"}, "gpu0", cfgHead+`,"tier":"latency-critical","sms":"100%","memory":"4Gi"}`), nil)
	if q.Tier != table.TierLatencyCritical || p.Groups != 1 || p.SMs != 8 {
		t.Errorf("1 device + sms 100%%: tier %s, %d groups (%d SMs); want latency-critical on 1 group (8 SMs)", q.Tier, p.Groups, p.SMs)
	}
}

// (c) Pod annotations and environment cannot override a claim's settings upward; they may lower them.
func TestPodCannotOverrideClaimUpward(t *testing.T) {
	d := testDriver(t)
	claim := claimFor([]string{"gpu0-sm-0", "gpu0-sm-1"}, "gpu0", cfgHead+`,"tier":"burstable","memory":"4Gi"}`)
	q, p := tenantOf(t, d, claim,
		map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "100%", "detshare.io/memory": "80Gi", "detshare.io/weight": "10000"},
		"DETSHARE_ALLOC_SMS=132", "DETSHARE_ALLOC_TIER=latency-critical")
	if q.Tier != table.TierBurstable || p.Groups != 2 || p.MemLimit != 4<<30 || q.Weight != 1 {
		t.Errorf("claim of 2 groups, burstable, 4 GiB under pod annotations for the whole GPU: tier %s, %d groups, memory %d, weight %d; "+
			"want burstable, 2, 4 GiB, 1", q.Tier, p.Groups, p.MemLimit, q.Weight)
	}
	q, p = tenantOf(t, d, claim, map[string]string{"detshare.io/tier": "best-effort", "detshare.io/memory": "1Gi"})
	if q.Tier != table.TierBestEffort || p.Groups != 0 || p.MemLimit != 1<<30 {
		t.Errorf("lowered by annotation: tier %s, %d groups, memory %d; want best-effort, 0, 1 GiB", q.Tier, p.Groups, p.MemLimit)
	}
	// A class's config bounds the claim's: a claim cannot make itself latency-critical under a burstable class.
	claim = claimFor([]string{"gpu0-sm-0"}, "gpu0", cfgHead+`,"tier":"latency-critical","memory":"16Gi"}`)
	claim.Status.Allocation.Devices.Config = append(claim.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(cfgHead + `,"tier":"burstable","memory":"8Gi"}`)}}}})
	if q, p = tenantOf(t, d, claim, nil); q.Tier != table.TierBurstable || p.MemLimit != 8<<30 {
		t.Errorf("class burstable 8Gi, claim latency-critical 16Gi: tier %s, memory %d; want burstable, 8 GiB", q.Tier, p.MemLimit)
	}
}

// (d) A claim that names no memory gets its groups' share of the GPU's memory, never unlimited, even if the pod
// asks for unlimited.
func TestClaimMemoryDefaultsToItsShare(t *testing.T) {
	_, p := tenantOf(t, testDriver(t), claimFor([]string{"gpu0-sm-0", "gpu0-sm-1", "gpu0-sm-2"}, "gpu0", ""), nil, "DETSHARE_MEMORY=0")
	if want := uint64(80<<30) * 3 / 15 &^ (1<<20 - 1); p.MemLimit != want {
		t.Errorf("3 of 15 groups, no memory in the claim: memory limit %d, want %d (3/15 of 80 GiB)", p.MemLimit, want)
	}
}
