package daemon

import (
	"testing"
	"time"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/sched/policy"
)

// TestPolicyOptions: internal/config spells the policy settings without importing the scheduler, so this is where
// they are tied to sched/policy: the configuration's defaults are policy.DefaultOptions, its policy names are
// policy.Kinds, and every setting arrives in policy.Options.
func TestPolicyOptions(t *testing.T) {
	if got, want := policyOptions(config.Default().PolicyOptions()), policy.DefaultOptions(); got != want {
		t.Fatalf("config.Default() gives %+v, policy.DefaultOptions() is %+v", got, want)
	}
	if len(config.Policies) != len(policy.Kinds) {
		t.Fatalf("config.Policies %q, policy.Kinds %q", config.Policies, policy.Kinds)
	}
	for i, name := range config.Policies {
		if k, err := policy.ParseKind(name); err != nil || k != policy.Kinds[i] {
			t.Errorf("config.Policies[%d] = %q: policy.ParseKind gives %q, %v; want %q", i, name, k, err, policy.Kinds[i])
		}
	}
	c, err := config.Parse("t", []byte("[scheduler]\npolicy = \"tpot-first\"\ndecode_boost = 7\nquantum = \"2ms\"\n"+
		"max_quantum = \"20ms\"\nbe_floor = 0\ngate_depth = 4\ngate_budget = \"100us\"\nlc_reserve = 0.25\n"+
		"lc_overlap = true\nshare_overlap = true\nnarrow_groups = 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := policy.Options{Kind: policy.TPOTFirst, DecodeBoost: 7, Quantum: 2 * time.Millisecond, MaxQuantum: 20 * time.Millisecond,
		Floor: 0, GateDepth: 4, GateBudget: 100 * time.Microsecond, LCReserve: 0.25,
		LCOverlap: true, ShareOverlap: true, NarrowGroups: 3}
	if got := policyOptions(c.PolicyOptions()); got != want {
		t.Fatalf("policyOptions = %+v, want %+v", got, want)
	}
}
