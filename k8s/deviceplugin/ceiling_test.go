package deviceplugin

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// container is what the runtime sees of one container scheduled through the device plugin: kubelet merges the two
// resources' Allocate annotations into its container annotations; pod annotations (when the runtime handler passes
// any, pod_annotations) land in the same OCI annotation map, and a pod's own keys there replace the plugin's.
func container(t *testing.T, inv Inventory, shares, mem []string, podAnn map[string]string, env ...string) (quota.Resolved, quota.Placement, error) {
	t.Helper()
	ann := map[string]string{}
	for _, a := range []struct {
		res string
		ids []string
	}{{ResourceShares, shares}, {ResourceMemory, mem}} {
		if len(a.ids) == 0 {
			continue
		}
		m, err := inv.Allocation(a.res, a.ids)
		if err != nil {
			t.Fatalf("Allocate %s %v: %v", a.res, a.ids, err)
		}
		for k, v := range m {
			ann[k] = v
		}
	}
	for k, v := range podAnn {
		ann[k] = v
	}
	r := quota.Inputs{Annotations: ann, Env: env}.Resolve()
	if r.Err != nil {
		return r, quota.Placement{}, r.Err
	}
	p, err := r.Quota.Place(table.GPUState{GPUInfo: table.GPUInfo{Index: 0, UUID: "SIM-0", SMCount: 132, MemTotal: 80 << 30},
		Split: table.EstimateSplit(132, table.DefaultSplitMinSize)})
	return r, p, err
}

func units(kind string, n int) []string {
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, deviceID(0, kind, i))
	}
	return ids
}

// (a) A pod that asks only for detshare.io/gpu-memory is a best-effort tenant with no guaranteed SMs, whatever its
// own environment says.
func TestMemoryOnlyPodCannotMakeItselfLatencyCritical(t *testing.T) {
	r, p, err := container(t, testInventory(), nil, units("mem", 2), nil,
		"DETSHARE_TIER=latency-critical", "DETSHARE_SMS=100%")
	if err != nil {
		t.Fatal(err)
	}
	if r.Quota.Tier != table.TierBestEffort || p.Groups != 0 || p.MemLimit != 2<<30 {
		t.Errorf("gpu-memory: 2 with DETSHARE_TIER=latency-critical DETSHARE_SMS=100%%: tier %s, %d SM groups, memory %d; "+
			"want best-effort, 0 groups, 2 GiB", r.Quota.Tier, p.Groups, p.MemLimit)
	}
}

// (c) The pod's own annotations (when the handler passes them) and environment cannot raise what the device plugin
// allocated: SMs, tier and memory stay what Kubernetes accounted for; lowering is allowed.
func TestPodCannotRaiseDevicePluginAllocation(t *testing.T) {
	inv := testInventory()
	r, p, err := container(t, inv, units("sm", 2), units("mem", 1),
		map[string]string{"detshare.io/sms": "100%", "detshare.io/tier": "latency-critical", "detshare.io/memory": "80Gi"},
		"DETSHARE_SMS=120", "DETSHARE_MEMORY=0")
	if err != nil {
		t.Fatal(err)
	}
	if r.Quota.Tier != table.TierBurstable || p.Groups != 2 || p.SMs != 16 || p.MemLimit != 1<<30 {
		t.Errorf("2 groups + 1 GiB, asking for the whole GPU: tier %s, %d groups (%d SMs), memory %d; want burstable, 2 (16), 1 GiB",
			r.Quota.Tier, p.Groups, p.SMs, p.MemLimit)
	}
	if len(r.Capped) < 2 { // tier and memory; 100% is capped on the GPU
		t.Errorf("capped fields not reported: %v", r.Capped)
	}
	r, p, err = container(t, inv, units("sm", 4), units("mem", 8), nil, "DETSHARE_SMS=8", "DETSHARE_MEMORY=2Gi")
	if err != nil || p.Groups != 1 || p.MemLimit != 2<<30 {
		t.Errorf("lowering to 8 SMs and 2 GiB: %d groups, memory %d (%v); want 1 group, 2 GiB", p.Groups, p.MemLimit, err)
	}
}

// (d) Weight and role stay within the host's limits; memory is what was allocated, and a container allocated SMs
// but no memory is refused rather than left unlimited.
func TestWeightRoleAndMemoryAreTheAllocations(t *testing.T) {
	inv := testInventory()
	r, _, err := container(t, inv, units("sm", 1), units("mem", 1), nil, "DETSHARE_WEIGHT=10000", "DETSHARE_ROLE=decode")
	if err != nil {
		t.Fatal(err)
	}
	if r.Quota.Weight != 1 || r.Quota.Role != table.RoleNone {
		t.Errorf("default host limits: weight %d role %s, want 1 and none", r.Quota.Weight, r.Quota.Role)
	}
	if _, _, err := container(t, inv, units("sm", 3), nil, nil); err == nil || !strings.Contains(err.Error(), "detshare.io/gpu-memory") {
		t.Errorf("detshare.io/gpu without detshare.io/gpu-memory: %v; want a refusal asking for detshare.io/gpu-memory", err)
	}
}
