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

// What the scheduler adds for performance determinism (issues 12 and 26): the size of a latency-critical tenant's
// partition (scheduler.lc_reserve, or the SLO controller from the latency histograms its library keeps), the
// dispatch gate of throttled tenants, and the board's power (NVML, read-only).

// sloWindow is the shortest window over which a tenant's P99 is taken; a window is extended until it holds
// policy.P99Samples completions, or policy.MissEvidence of them missed the SLO, up to sloWindowMax (where fewer than
// policy.MinLatencySamples count as an idle tenant).
const (
	sloWindow    = 250 * time.Millisecond
	sloWindowMax = 2 * time.Second
	powerEvery   = 100 * time.Millisecond
	// powerHysteresis: once near its limit, a board counts as near until it draws less than limit x (frac - this).
	powerHysteresis = 0.07
)

// sloState is a tenant's SLO window between passes (in its ledger entry, under the ledger's mu).
type sloState struct {
	ctl      policy.SLOControl
	lastHist [policy.LatencyBuckets]uint64
	lastFine [policy.FineBuckets]uint64
	winStart time.Time
	stepped  bool
	shrink   int // what ctl's position gives back of the partition (policy.SLOLadder)
}

// sloReport is what status, top and metrics show of a tenant's SLO controller.
func sloReport(st sloState) table.SLOReport {
	c := st.ctl
	r := table.SLOReport{GivenBack: uint32(max(st.shrink, 0)), WindowUs: usOf(c.LastP99), FloorUs: usOf(c.Floor)}
	if st.stepped {
		r.State |= table.SLOActive
	}
	if c.Miss {
		r.State |= table.SLOMiss
	}
	if c.Infeasible {
		r.State |= table.SLOInfeasible
	}
	if c.Holding {
		r.State |= table.SLOHolding
	}
	return r
}

func usOf(d time.Duration) uint32 {
	return uint32(min(d/time.Microsecond, time.Duration(^uint32(0))))
}

// setSLOReport publishes a tenant's SLO controller state when it changed.
func (s *Scheduler) setSLOReport(r *tenantRow) {
	if r.reg.SLOP99Us == 0 || r.reg.Tier != table.TierLatencyCritical || r.reg.Flags&table.FlagPinned != 0 {
		return
	}
	s.stats.mu.Lock()
	e := r.st
	if e == nil {
		e = s.stats.entryLocked(r.reg.ID)
	}
	st := e.slo
	s.stats.mu.Unlock()
	rep := sloReport(st)
	if s.t.SLOReportOf(r.reg.Slot) == rep {
		return
	}
	if err := s.t.SetSLOReport(r.reg.Slot, rep); err != nil {
		logrus.WithError(err).WithField("id", r.reg.ID).Debug("set SLO report")
	}
}

// readLatency copies a client page's cumulative latency histograms (counters the library only increments).
func readLatency(pg *table.ClientPage) (h [policy.LatencyBuckets]uint64, f [policy.FineBuckets]uint64) {
	for i := range h {
		h[i] = atomic.LoadUint64(&pg.LatHist[i])
	}
	for i := range f {
		f[i] = atomic.LoadUint64(&pg.LatFine[i])
	}
	return h, f
}

// sizeSLO sizes the partition of a latency-critical tenant (policy.Tenant.Sized). With slo-p99 the SLO controller
// (policy.SLOControl) steps once per window on the P99 of the completions in it, starting from the default
// reserve; without one it holds scheduler.lc_reserve of the GPU. What it may give back is everything beyond its
// guarantee less the floor lower tiers keep anyway: at the top it runs on exactly its guarantee. With
// lc_reserve = 0 a tenant without an SLO expands over throttled neighbours instead (issue 12).
func (l *ledger) sizeSLO(r *tenantRow, t *policy.Tenant, nGroups int, o policy.Options, now time.Time) {
	if t.Tier != table.TierLatencyCritical || t.Pinned {
		return
	}
	maxShrink := nGroups - t.Guarantee - max(o.Floor, 1)
	if r.reg.SLOP99Us == 0 {
		if o.LCReserve > 0 {
			t.Shrink, t.Sized = min(policy.ReserveShrink(t.Guarantee, nGroups, o), max(maxShrink, 0)), true
		}
		return
	}
	slo := time.Duration(r.reg.SLOP99Us) * time.Microsecond
	// the controller's position runs from the most protective share through the default partition, then widens
	// the neighbours' narrow part for memory-bound kernels, shrinks the partition, and widens that part to the end
	// (policy.SLOLadder)
	ladder := policy.NewSLOLadder(policy.ReserveShrink(t.Guarantee, nGroups, o), maxShrink, o)
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.entryLocked(r.reg.ID)
	if st.slo.winStart.IsZero() {
		// a new tenant starts on the default reserve (its guarantee if that is larger)
		st.slo.winStart, st.slo.lastHist, st.slo.lastFine = now, r.lat, r.fine
		st.slo.ctl.Shrink = ladder.Start
	}
	if age := now.Sub(st.slo.winStart); age >= sloWindow {
		coarse, fine := policy.HistDelta(r.lat, st.slo.lastHist), policy.FineDelta(r.fine, st.slo.lastFine)
		p99, n := policy.WindowP99(coarse, fine)
		if policy.WindowReady(n, policy.WindowAbove(coarse, fine, slo), age >= sloWindowMax) {
			st.slo.ctl.Step(slo, p99, n, ladder.Top())
			st.ObservedP99 = st.slo.ctl.LastP99
			st.SLO = st.slo.ctl
			st.slo.lastHist, st.slo.lastFine, st.slo.winStart = r.lat, r.fine, now
			st.slo.stepped = true
		}
	}
	t.Shrink, t.NarrowWiden = ladder.Levels(st.slo.ctl.Shrink)
	st.slo.shrink = t.Shrink
	t.SLOMiss, t.Sized = st.slo.ctl.Miss, true
}

// setGate publishes a tenant's dispatch gate when it changed. It is written before the grant of the same
// decision, so a tenant shrunk to its floor is gated by the time it rebinds.
func (s *Scheduler) setGate(r *tenantRow, g policy.Gate) {
	depth, budget := g.Depth, uint32(g.Budget/time.Microsecond)
	if d, b := s.t.Gate(r.reg.Slot); d == depth && b == budget {
		return
	}
	if err := s.t.SetGate(r.reg.Slot, depth, budget); err != nil {
		logrus.WithError(err).WithField("id", r.reg.ID).Debug("set gate")
	}
}

// setNarrow publishes how many groups of its grant a tenant's memory-bound kernels run on, when it changed; like the
// gate, before the grant of the same decision.
func (s *Scheduler) setNarrow(r *tenantRow, groups uint32) {
	if s.t.Narrow(r.reg.Slot) == groups {
		return
	}
	if err := s.t.SetNarrow(r.reg.Slot, groups); err != nil {
		logrus.WithError(err).WithField("id", r.reg.ID).Debug("set narrow")
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
