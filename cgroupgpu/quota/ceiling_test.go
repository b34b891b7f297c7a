package quota

import (
	"errors"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

func place(t *testing.T, in Inputs) (Resolved, Placement) {
	t.Helper()
	r := in.Resolve()
	if r.Err != nil {
		t.Fatalf("resolve %+v: %v", in, r.Err)
	}
	p, err := r.Quota.Place(h100())
	if err != nil {
		t.Fatalf("place: %v", err)
	}
	return r, p
}

// A ceiling is the quota's default and the most any field may be: annotations, labels and environment lower it,
// never raise it.
func TestCeilingIsDefaultAndMaximum(t *testing.T) {
	alloc := Ceiling{Tier: table.TierBurstable, SMs: 16, Memory: 4 << 30, GPU: GPUSelector{Index: 0}, MaxWeight: 10,
		Roles: []table.Role{table.RoleNone, table.RolePrefill}}

	// Nothing asked: the allocation itself.
	r, p := place(t, Inputs{Annotations: alloc.Annotations()})
	if !r.Asked || r.Quota.Tier != table.TierBurstable || p.SMs != 16 || p.MemLimit != 4<<30 || r.Quota.Weight != 1 || len(r.Capped) != 0 {
		t.Errorf("allocation alone: asked %v tier %s, %d SMs, memory %d, weight %d, capped %v; want burstable, 16, 4 GiB, 1, none",
			r.Asked, r.Quota.Tier, p.SMs, p.MemLimit, r.Quota.Weight, r.Capped)
	}

	// Everything asked above it, from every source: capped, each field named.
	r, p = place(t, Inputs{Annotations: merge(alloc.Annotations(), map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "120"}),
		Labels: map[string]string{"detshare.io/memory": "80Gi"},
		Env:    []string{"DETSHARE_WEIGHT=10000", "DETSHARE_ROLE=decode", "DETSHARE_GPU=1"}})
	if r.Quota.Tier != table.TierBurstable || p.SMs != 16 || p.MemLimit != 4<<30 || r.Quota.Weight != 10 ||
		r.Quota.Role != table.RoleNone || p.GPU != 0 || r.Quota.GPU.Index != 0 {
		t.Errorf("asked above: tier %s, %d SMs, memory %d, weight %d, role %s, GPU %v; want burstable, 16, 4 GiB, 10, none, 0",
			r.Quota.Tier, p.SMs, p.MemLimit, r.Quota.Weight, r.Quota.Role, r.Quota.GPU)
	}
	capped := strings.Join(r.Capped, "\n")
	for _, want := range []string{`detshare.io/tier="latency-critical" (annotation)`, `detshare.io/sms="120" (annotation)`,
		`detshare.io/memory="80Gi" (label)`, `DETSHARE_WEIGHT="10000" (env)`, `DETSHARE_ROLE="decode" (env)`, `DETSHARE_GPU="1" (env)`,
		"alloc.detshare.io/sms=16"} {
		if !strings.Contains(capped, want) {
			t.Errorf("capped messages lack %q:\n%s", want, capped)
		}
	}

	// Percents are capped on the GPU; "unlimited" is capped to what was allocated.
	r, p = place(t, Inputs{Annotations: alloc.Annotations(), Env: []string{"DETSHARE_SMS=100%", "DETSHARE_MEMORY=0"}})
	if p.SMs != 16 || p.MemLimit != 4<<30 {
		t.Errorf("100%% and memory 0 under the ceiling: %d SMs, memory %d; want 16 and 4 GiB", p.SMs, p.MemLimit)
	}
	r, p = place(t, Inputs{Annotations: alloc.Annotations(), Env: []string{"DETSHARE_MEMORY=50%"}})
	if p.MemLimit != 4<<30 {
		t.Errorf("memory 50%% (40 GiB) under a 4 GiB ceiling: %d", p.MemLimit)
	}

	// Lowering is the tenant's right.
	r, p = place(t, Inputs{Annotations: alloc.Annotations(), Env: []string{"DETSHARE_MEMORY=1Gi", "DETSHARE_TIER=best-effort", "DETSHARE_WEIGHT=5", "DETSHARE_ROLE=prefill"}})
	if r.Quota.Tier != table.TierBestEffort || p.SMs != 0 || p.MemLimit != 1<<30 || r.Quota.Weight != 5 || r.Quota.Role != table.RolePrefill || len(r.Capped) != 0 {
		t.Errorf("lowered: tier %s, %d SMs, memory %d, weight %d, role %s, capped %v", r.Quota.Tier, p.SMs, p.MemLimit,
			r.Quota.Weight, r.Quota.Role, r.Capped)
	}
	r, p = place(t, Inputs{Annotations: alloc.Annotations(), Env: []string{"DETSHARE_SMS=8", "DETSHARE_MEMORY=1Gi"}})
	if r.Quota.Tier != table.TierBurstable || p.SMs != 8 || p.MemLimit != 1<<30 {
		t.Errorf("lowered SMs: tier %s, %d SMs, memory %d; want burstable, 8, 1 GiB", r.Quota.Tier, p.SMs, p.MemLimit)
	}
}

// (a) Memory only: no tier, no SMs; a pod cannot make itself latency-critical on the whole GPU.
func TestCeilingMemoryOnlyIsBestEffort(t *testing.T) {
	alloc := Ceiling{Tier: table.TierBestEffort, Memory: 2 << 30, GPU: GPUSelector{Index: 0}, MaxWeight: 1}
	r, p := place(t, Inputs{Annotations: alloc.Annotations(), Env: []string{"DETSHARE_TIER=latency-critical", "DETSHARE_SMS=100%", "DETSHARE_LEND=false"}})
	if r.Quota.Tier != table.TierBestEffort || p.SMs != 0 || p.Groups != 0 || p.MemLimit != 2<<30 {
		t.Errorf("memory-only allocation with latency-critical 100%% in env: tier %s, %d groups, memory %d; want best-effort, 0, 2 GiB",
			r.Quota.Tier, p.Groups, p.MemLimit)
	}
}

// (d) An allocation without memory is refused, naming the key and what to ask for; a tenant is never unlimited.
func TestCeilingWithoutMemoryRefused(t *testing.T) {
	alloc := Ceiling{Tier: table.TierBurstable, SMs: 8, GPU: GPUSelector{Index: 0}, MaxWeight: 1}
	r := Inputs{Annotations: alloc.Annotations(), Env: []string{"DETSHARE_MEMORY=8Gi"}}.Resolve()
	if r.Err == nil || !strings.Contains(r.Err.Error(), "alloc.detshare.io/memory") || !strings.Contains(r.Err.Error(), "detshare.io/gpu-memory") {
		t.Errorf("allocation without memory: %v; want a refusal naming alloc.detshare.io/memory and detshare.io/gpu-memory", r.Err)
	}
}

// Two ceilings (annotations and CDI environment) give their minimum: a forged one only lowers.
func TestCeilingSourcesTakeTheMinimum(t *testing.T) {
	big := Ceiling{Tier: table.TierLatencyCritical, SMs: 120, Memory: 80 << 30, GPU: GPUSelector{Index: 0}, MaxWeight: 100,
		Roles: []table.Role{table.RoleNone, table.RoleDecode}}
	small := Ceiling{Tier: table.TierBurstable, SMs: 16, Memory: 4 << 30, GPU: GPUSelector{Index: 0}, MaxWeight: 2}
	for _, in := range []Inputs{{Annotations: big.Annotations(), Env: small.Env()}, {Annotations: small.Annotations(), Env: big.Env()}} {
		r, p := place(t, in)
		if c := r.Quota.Ceiling; c == nil || c.Tier != table.TierBurstable || c.SMs != 16 || c.Memory != 4<<30 ||
			c.MaxWeight != 2 || len(c.Roles) != 1 || p.SMs != 16 {
			t.Errorf("two ceilings: %+v, placed %d SMs; want burstable, 16 SMs, 4 GiB, weight 2, roles [none]", c, p.SMs)
		}
	}
	other := small
	other.GPU = GPUSelector{Index: 1}
	if r := (Inputs{Annotations: small.Annotations(), Env: other.Env()}).Resolve(); r.Err == nil || !strings.Contains(r.Err.Error(), "two GPUs") {
		t.Errorf("ceilings naming GPUs 0 and 1: %v, want a refusal", r.Err)
	}
}

// Bad ceiling values and unknown ceiling keys are refused with the key and what is allowed.
func TestCeilingBadKeys(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		env  []string
		want string
	}{
		{map[string]string{"alloc.detshare.io/sms": "50%", "alloc.detshare.io/memory": "1Gi"}, nil, `alloc.detshare.io/sms="50%" (allocation): a number of SMs`},
		{map[string]string{"alloc.detshare.io/memory": "0"}, nil, `alloc.detshare.io/memory="0" (allocation): bytes`},
		{map[string]string{"alloc.detshare.io/memory": "1Gi", "alloc.detshare.io/role": "boss"}, nil, `alloc.detshare.io/role="boss"`},
		{map[string]string{"alloc.detshare.io/memory": "1Gi", "alloc.detshare.io/smz": "8"}, nil, "alloc.detshare.io/smz"},
		{nil, []string{"DETSHARE_ALLOC_MEMORY=1Gi", "DETSHARE_ALLOC_TEIR=burstable"}, "DETSHARE_ALLOC_TEIR"},
	} {
		r := Inputs{Annotations: tc.ann, Env: tc.env}.Resolve()
		if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) {
			t.Errorf("%v %v: %v; want an error containing %q", tc.ann, tc.env, r.Err, tc.want)
		}
	}
	// The rendered forms parse back to the same ceiling.
	c := Ceiling{Tier: table.TierLatencyCritical, SMs: 40, Memory: 12 << 30, GPU: GPUSelector{UUID: "GPU-abc"}, MaxWeight: 7,
		Roles: []table.Role{table.RolePrefill, table.RoleDecode}}
	for _, in := range []Inputs{{Annotations: c.Annotations()}, {Env: c.Env()}} {
		got, ok, err := ceilingOf(in.Annotations, envMap(in.Env))
		if !ok || err != nil || got.Tier != c.Tier || got.SMs != c.SMs || got.Memory != c.Memory || got.GPU != c.GPU ||
			got.MaxWeight != c.MaxWeight || len(got.Roles) != 2 {
			t.Errorf("round trip of %+v: %+v %v %v", c, got, ok, err)
		}
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// A Kubernetes container (CRI annotations) with no allocation may not choose its own quota: every way it can ask
// (environment, pod annotation, label) is refused, naming the key and the missing allocation. Asking nothing, it is
// no tenant; with an allocation it may lower it; a pod's sandbox and a container outside Kubernetes are unaffected.
func TestKubernetesContainerWithoutAllocationRefused(t *testing.T) {
	for _, cri := range []map[string]string{{"io.kubernetes.cri.container-type": "container"}, {"io.kubernetes.cri-o.ContainerType": "container"}} {
		for _, in := range []Inputs{
			{Annotations: cri, Env: []string{"DETSHARE_TIER=latency-critical", "DETSHARE_SMS=100%"}},
			{Annotations: merge(cri, map[string]string{"detshare.io/memory": "1Gi"})},
			{Annotations: cri, Labels: map[string]string{"detshare.io/tier": "best-effort"}},
		} {
			r := in.Resolve()
			if r.Err == nil {
				t.Errorf("%+v: resolved to %+v, want a refusal", in, r.Quota)
				continue
			}
			var fe *FieldError
			if !errors.As(r.Err, &fe) || !strings.Contains(r.Err.Error(), "no DetShare allocation") ||
				!strings.Contains(r.Err.Error(), "detshare.io/gpu-memory") || !strings.Contains(r.Err.Error(), "gpu.detshare.io") {
				t.Errorf("%+v: error %v, want a field error naming the missing allocation and what to ask for", in, r.Err)
			}
			for _, k := range []string{"DETSHARE_TIER", "detshare.io/memory", "detshare.io/tier"} {
				if (strings.Contains(strings.Join(in.Env, " "), k) || in.Annotations[k] != "" || in.Labels[k] != "") &&
					!strings.Contains(r.Err.Error(), k) {
					t.Errorf("%+v: error %v does not name %s", in, r.Err, k)
				}
			}
		}
		if r := (Inputs{Annotations: cri, Env: []string{"DETSHARE_SIMGPU_DEVICE_DIR=/dev", "PATH=/bin"}}).Resolve(); r.Asked || r.Err != nil {
			t.Errorf("no quota key: asked %v, err %v; want no tenant and no error", r.Asked, r.Err)
		}
		alloc := Ceiling{Tier: table.TierBurstable, SMs: 16, Memory: 4 << 30, GPU: GPUSelector{Index: 0}, MaxWeight: 1,
			Roles: []table.Role{table.RoleNone}}
		if _, p := place(t, Inputs{Annotations: merge(cri, alloc.Annotations()), Env: []string{"DETSHARE_MEMORY=1Gi"}}); p.MemLimit != 1<<30 {
			t.Errorf("allocated, lowering memory: %d bytes, want 1 GiB", p.MemLimit)
		}
		if _, p := place(t, Inputs{Annotations: cri, Env: append(alloc.Env(), "DETSHARE_SMS=8")}); p.SMs != 8 {
			t.Errorf("DRA allocation, lowering SMs: %d, want 8", p.SMs)
		}
	}
	for _, ann := range []map[string]string{nil, {"io.kubernetes.cri.container-type": "sandbox", "detshare.io/tier": "burstable"}} {
		if r := (Inputs{Annotations: ann, Env: []string{"DETSHARE_TIER=burstable"}}).Resolve(); r.Err != nil {
			t.Errorf("annotations %v: %v, want the container's own quota (not a Kubernetes workload container)", ann, r.Err)
		}
	}
}
