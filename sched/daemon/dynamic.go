package daemon

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/policy"
)

// What the scheduler adds for performance determinism (issue 12): SLO sizing of a latency-critical tenant's
// expansion from the latency histogram its library keeps, the dispatch gate of throttled tenants, and the board's
// power (NVML, read-only).

// sloWindow is the shortest window over which a tenant's P99 is taken; a window with fewer than
// policy.MinLatencySamples completions is extended up to sloWindowMax.
const (
	sloWindow    = 250 * time.Millisecond
	sloWindowMax = 2 * time.Second
	powerEvery   = 100 * time.Millisecond
	// powerHysteresis: once near its limit, a board counts as near until it draws less than limit x (frac - this).
	powerHysteresis = 0.07
)

// sloState is a tenant's SLO sizing between passes (in its ledger entry, under the ledger's mu).
type sloState struct {
	shrink   int
	miss     bool
	lastHist [policy.LatencyBuckets]uint64
	winStart time.Time
}

// readLatency copies a client page's cumulative latency histogram (counters the library only increments).
func readLatency(pg *table.ClientPage) (h [policy.LatencyBuckets]uint64) {
	for i := range h {
		h[i] = atomic.LoadUint64(&pg.LatHist[i])
	}
	return h
}

// sizeSLO sets t.Shrink and t.SLOMiss for a latency-critical tenant with an SLO from the P99 of its last window.
func (l *ledger) sizeSLO(r tenantRow, t *policy.Tenant, nGroups int, now time.Time) {
	if t.Tier != table.TierLatencyCritical || t.Pinned || r.reg.SLOP99Us == 0 {
		return
	}
	slo := time.Duration(r.reg.SLOP99Us) * time.Microsecond
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.entryLocked(r.reg.ID)
	if st.slo.winStart.IsZero() {
		st.slo.winStart, st.slo.lastHist = now, r.lat
	}
	if age := now.Sub(st.slo.winStart); age >= sloWindow {
		p99, n := policy.HistP99(policy.HistDelta(r.lat, st.slo.lastHist))
		if n >= policy.MinLatencySamples || age >= sloWindowMax {
			st.slo.shrink, st.slo.miss = policy.NextShrink(st.slo.shrink, slo, p99, n, nGroups-t.Guarantee-1)
			st.ObservedP99 = p99
			st.slo.lastHist, st.slo.winStart = r.lat, now
		}
	}
	t.Shrink, t.SLOMiss = st.slo.shrink, st.slo.miss
}

// setGate publishes a tenant's dispatch gate when it changed. It is written before the grant of the same
// decision, so a tenant shrunk to its floor is gated by the time it rebinds.
func (s *Scheduler) setGate(r tenantRow, g policy.Gate) {
	depth, budget := g.Depth, uint32(g.Budget/time.Microsecond)
	if d, b := s.t.Gate(r.reg.Slot); d == depth && b == budget {
		return
	}
	if err := s.t.SetGate(r.reg.Slot, depth, budget); err != nil {
		logrus.WithError(err).WithField("id", r.reg.ID).Debug("set gate")
	}
}

// boardState is a GPU's last power sample: the power loop writes it, the decision loop and BoardOf read it.
type boardState struct {
	last atomic.Pointer[gpuinfo.Board]
	near atomic.Bool // near its power limit at the last sample: lower tiers are throttled
}

// record keeps sample b and tells whether the board crossed the threshold frac of its limit. Once near, it stays
// near until it draws less than (frac - powerHysteresis), so that a board hovering at the limit does not flap.
func (bs *boardState) record(b gpuinfo.Board, frac float64) (near, changed bool) {
	bs.last.Store(&b)
	was := bs.near.Load()
	near = b.Near(frac) || (was && b.Near(frac-powerHysteresis))
	if near != was {
		bs.near.Store(near)
	}
	return near, near != was
}

// BoardOf returns the last power/clock sample of GPU index (false when none was taken).
func (s *Scheduler) BoardOf(index int) (gpuinfo.Board, bool) {
	gs := s.gpus.get(index)
	if gs == nil {
		return gpuinfo.Board{}, false
	}
	b := gs.board.last.Load()
	if b == nil {
		return gpuinfo.Board{}, false
	}
	return *b, true
}

// powerLoop samples every GPU's board every powerEvery and rings the doorbell when one crosses the threshold, so
// that the policy reacts at once.
func (s *Scheduler) powerLoop(ctx context.Context) {
	sample := s.opts.Board
	if sample == nil {
		return
	}
	ticking(ctx, powerEvery, nil, func() bool {
		frac := s.Config().Scheduler.PowerNearLimit
		for _, gs := range s.gpus.list() {
			b, err := sample(gs.index)
			if err != nil {
				continue
			}
			if near, changed := gs.board.record(b, frac); changed {
				logrus.WithFields(logrus.Fields{"gpu": gs.index, "power_w": b.PowerW, "limit_w": b.LimitW,
					"sm_clock_mhz": b.SMClockMHz, "near_limit": near}).Info("board power")
				s.t.RingDoorbell()
			}
		}
		return true
	})
}
