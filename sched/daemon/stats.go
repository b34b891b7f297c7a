package daemon

import (
	"sync/atomic"
	"time"

	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/sched/metrics"
	"github.com/detshare/detshare/sched/table"
	"github.com/detshare/detshare/sched/view"
)

// Stats are the scheduler-wide counters (metrics).
type Stats struct {
	Passes        atomic.Uint64
	GrantChanges  atomic.Uint64
	Reaped        atomic.Uint64
	TokenHandoffs atomic.Uint64
	Reloads       atomic.Uint64
	LastPassNs    atomic.Uint64
}

// TenantStats are per-tenant counters only the scheduler knows.
type TenantStats struct {
	GrantChanges  uint64
	SLOViolations uint64
	Reason        string
	lastSeq       uint32
	answered      bool
	ObservedP99   time.Duration // P99 of the last SLO window (tenants with slo-p99)
	slo           sloState
}

// Stats returns the scheduler-wide counters.
func (s *Scheduler) Stats() *Stats { return &s.stats }

// TenantStats returns a copy of the per-tenant counters.
func (s *Scheduler) TenantStats() map[string]TenantStats {
	s.tenantMu.Lock()
	defer s.tenantMu.Unlock()
	out := make(map[string]TenantStats, len(s.tenants))
	for k, v := range s.tenants {
		out[k] = *v
	}
	return out
}

func (s *Scheduler) forgetGone(regs []table.Registration) {
	ids := make(map[string]bool, len(regs))
	for _, r := range regs {
		ids[r.ID] = true
	}
	s.tenantMu.Lock()
	for id := range s.tenants {
		if !ids[id] {
			delete(s.tenants, id)
		}
	}
	s.tenantMu.Unlock()
}

// MetricsSource returns what the metrics endpoint exports: a read-only snapshot plus the scheduler's own counters.
func (s *Scheduler) MetricsSource() metrics.Source {
	ro, err := table.OpenReadOnly(s.opts.RunDir)
	return func() (view.Snapshot, metrics.Extra) {
		var snap view.Snapshot
		if err == nil {
			snap = view.Take(ro)
		}
		ex := metrics.Extra{Passes: s.stats.Passes.Load(), GrantChanges: s.stats.GrantChanges.Load(),
			Reaped: s.stats.Reaped.Load(), TokenHandoffs: s.stats.TokenHandoffs.Load(), Reloads: s.stats.Reloads.Load(),
			LastPassSeconds: float64(s.stats.LastPassNs.Load()) / 1e9, FailOpens: failopen.Count(s.opts.RunDir),
			SLOViolations: map[string]uint64{}, Reasons: map[string]string{}}
		for id, st := range s.TenantStats() {
			ex.SLOViolations[id] = st.SLOViolations
			ex.Reasons[id] = st.Reason
		}
		return snap, ex
	}
}
