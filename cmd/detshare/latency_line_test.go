package main

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/sched/view"
)

func TestStatusLatencyLine(t *testing.T) {
	if s := latencyLine(view.Tenant{ID: "be"}); s != "" {
		t.Fatalf("nothing to say, got %q", s)
	}
	s := latencyLine(view.Tenant{Pinned: true, SLOP99Ms: 5, LatencyCount: 200, LatencyP99Ms: 4.096, SLOAttainment: 0.995,
		GateDepth: 2, GateBudgetUs: 500, GateWaits: 3, GateWaitNs: 1_500_000})
	for _, want := range []string{"pinned", "SLO p99 5ms", "observed p99 <= 4.1ms", "99.5% of 200 completions within",
		"gate 2 kernels / 500us", "3 launches held"} {
		if !strings.Contains(s, want) {
			t.Errorf("%q missing %q", s, want)
		}
	}
}

// The SLO controller's choice and why (issue 26): what the neighbours were left, the last window, the floor, and an
// SLO that cannot be reached said in capitals.
func TestStatusSLOControllerLine(t *testing.T) {
	base := view.Tenant{SLOP99Ms: 2, LatencyCount: 100, LatencyP99Ms: 1.5}
	for _, c := range []struct {
		state string
		want  []string
	}{
		{"starting", []string{"controller: starting"}},
		{"meeting", []string{"within the SLO", "5 groups of the GPU left to lower tiers", "p99 1.2ms at the most protective share"}},
		{"missing", []string{"above the SLO", "5 groups left to lower tiers"}},
		{"infeasible", []string{"NOT ATTAINABLE", "floor measured 1.2ms", "never cut", "; 5 groups left to lower tiers"}},
		{"holding", []string{"NOT ATTAINABLE", "floor measured 1.2ms", "holding 5 groups for lower tiers, the largest share whose p99 was within 10% of the floor"}},
	} {
		tn := base
		tn.SLOState, tn.SLOGivenBackGroups, tn.SLOWindowP99Ms, tn.SLOFloorMs = c.state, 5, 1.8, 1.2
		if c.state == "holding" {
			tn.SLOState, tn.SLOHolding = "infeasible", true
		}
		s := latencyLine(tn)
		for _, w := range c.want {
			if !strings.Contains(s, w) {
				t.Errorf("state %s: %q missing %q", c.state, s, w)
			}
		}
	}
	if s := latencyLine(view.Tenant{SLOP99Ms: 2}); strings.Contains(s, "controller") {
		t.Fatalf("no controller state, yet %q", s)
	}
}
