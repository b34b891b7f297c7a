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
