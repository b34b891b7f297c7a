package daemon

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/metrics"
	"github.com/detshare/detshare/sched/policy"
	"github.com/detshare/detshare/sched/view"
)

// Stats are the scheduler-wide counters (metrics).
type Stats struct {
	Passes        atomic.Uint64
	GrantChanges  atomic.Uint64
	Reaped        atomic.Uint64
	MemoryKills   atomic.Uint64 // processes killed for memory past the library beyond their tenant's quota
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
	ObservedP99   time.Duration // P99 of the last SLO window (tenants with slo-p99)
	// SLO is the SLO controller's state after its last window (tenants with slo-p99): the share given back, and
	// whether the SLO is attainable.
	SLO policy.SLOControl
	slo sloState
}

// ledger is the scheduler's accounting. The counters are atomic: the loop and the MPS watcher add to them while the
// metrics endpoint reads. A tenant's entry is under mu because its fields change together (SLO sizing, answers).
type ledger struct {
	Stats
	mu      sync.Mutex
	tenants map[string]*TenantStats
}

// entryLocked returns id's entry, made on first use (mu held).
func (l *ledger) entryLocked(id string) *TenantStats {
	st := l.tenants[id]
	if st == nil {
		st = &TenantStats{}
		l.tenants[id] = st
	}
	return st
}

// entry returns id's entry, made on first use. The pointer stays id's until forget drops it.
func (l *ledger) entry(id string) *TenantStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.entryLocked(id)
}

// answered accounts a pass's answer to tenant r (its entry st): whether its grant changed, why it is what it is,
// and whether the change came later than the SLO after the demand rose (late). A violation counts once per rise of
// the demand.
func (l *ledger) answered(st *TenantStats, r *tenantRow, changed bool, reason string, late bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if changed {
		st.GrantChanges++
	}
	st.Reason = reason
	if r.demand > 0 && r.seq != st.lastSeq {
		st.lastSeq = r.seq
		if late {
			st.SLOViolations++
		}
	}
}

// forget drops the entries of tenants no longer registered.
func (l *ledger) forget(regs []table.Registration) {
	ids := make(map[string]bool, len(regs))
	for _, r := range regs {
		ids[r.ID] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.tenants {
		if !ids[id] {
			delete(l.tenants, id)
		}
	}
}

func (l *ledger) snapshot() map[string]TenantStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]TenantStats, len(l.tenants))
	for k, v := range l.tenants {
		out[k] = *v
	}
	return out
}

// Stats returns the scheduler-wide counters.
func (s *Scheduler) Stats() *Stats { return &s.stats.Stats }

// TenantStats returns a copy of the per-tenant counters.
func (s *Scheduler) TenantStats() map[string]TenantStats { return s.stats.snapshot() }

// MetricsSource returns what the metrics endpoint exports: a read-only snapshot plus the scheduler's own counters.
func (s *Scheduler) MetricsSource() metrics.Source {
	ro, err := table.OpenReadOnly(s.opts.RunDir)
	return func() (view.Snapshot, metrics.Extra) {
		var snap view.Snapshot
		if err == nil {
			snap = view.Take(ro)
			if err := view.GPUMemory(&snap, ro, s.opts.ProcessMemory); err != nil {
				logrus.WithError(err).Debug("per-process GPU memory not read")
			}
		}
		c := &s.stats.Stats
		ex := metrics.Extra{Passes: c.Passes.Load(), GrantChanges: c.GrantChanges.Load(),
			Reaped: c.Reaped.Load(), MemoryKills: c.MemoryKills.Load(), TokenHandoffs: c.TokenHandoffs.Load(), Reloads: c.Reloads.Load(),
			LastPassSeconds: float64(c.LastPassNs.Load()) / 1e9, FailOpens: failopen.Count(s.opts.RunDir),
			SLOViolations: map[string]uint64{}, Reasons: map[string]string{}}
		for id, st := range s.stats.snapshot() {
			ex.SLOViolations[id] = st.SLOViolations
			ex.Reasons[id] = st.Reason
		}
		return snap, ex
	}
}
