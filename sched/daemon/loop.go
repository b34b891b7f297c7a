package daemon

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/policy"
)

// loop is what the decision loop keeps between passes. Only the goroutine running Run (or a caller of Pass) touches
// it, so none of it is locked.
type loop struct {
	pages    map[int]*page // slot -> mapped client page of the current generation
	demand   demandBook    // trust.go
	lastReap time.Time
	// The walk of /proc behind reaping takes milliseconds; while the loop runs, scanLoop takes it on its own
	// goroutine and leaves the newest scan here, so that a doorbell is never answered late because a reap was
	// walking /proc (H100: latency-critical requests started up to 18 ms before their neighbours were throttled).
	scan     atomic.Pointer[table.ProcSet]
	scanning atomic.Bool
	// regs caches table.List() while the table generation stays regGen: a pass without a registration reads no slot.
	regs   []table.Registration
	regGen uint64
	regsOK bool
}

type page struct {
	gen uint32
	cl  *table.Client
}

func newLoop() loop {
	return loop{pages: map[int]*page{}, demand: demandBook{}}
}

// Run is the main loop until ctx ends.
func (s *Scheduler) Run(ctx context.Context) error {
	// Cancellation rings the doorbell to wake the loop; the ring must finish before Run returns (Close unmaps).
	rung := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { defer close(rung); s.t.RingDoorbell() })
	defer func() {
		if !stop() {
			<-rung
		}
	}()
	// MPS checks run external commands; they live beside the loop so they never delay a reaction.
	watchCtx, watchStop := context.WithCancel(ctx)
	mpsDone := make(chan struct{})
	go func() { defer close(mpsDone); s.mpsw.run(watchCtx, &s.gpus, s.lead.truncated) }()
	defer func() { watchStop(); <-mpsDone }()
	powerDone := make(chan struct{})
	go func() { defer close(powerDone); s.powerLoop(watchCtx) }()
	defer func() { watchStop(); <-powerDone }()
	scanDone := make(chan struct{})
	s.loop.scanning.Store(true)
	go func() { defer close(scanDone); s.scanLoop(watchCtx) }()
	defer func() { watchStop(); <-scanDone; s.loop.scanning.Store(false) }()
	seq := s.t.DoorbellSeq()
	if err := s.guardedPass(); err != nil {
		return err
	}
	if s.opts.Ready != nil {
		close(s.opts.Ready)
	}
	for ctx.Err() == nil {
		wait := s.nextWait()
		nseq, _, err := s.t.WaitDoorbell(seq, wait)
		if err != nil {
			return fmt.Errorf("scheduler: wait on doorbell: %w", err)
		}
		seq = nseq
		if ctx.Err() != nil {
			break
		}
		if err := s.guardedPass(); err != nil {
			return err
		}
	}
	return nil
}

// nextWait is how long the loop may sleep on the doorbell: until the next tick, reap or end of a quantum.
func (s *Scheduler) nextWait() time.Duration {
	c := s.Config()
	w := c.Scheduler.Tick.Duration
	if r := c.Scheduler.ReapEvery.Duration - time.Since(s.loop.lastReap); r < w {
		w = r
	}
	for _, g := range s.gpus.list() {
		if g.mode.Load() != table.ModeTemporal {
			continue
		}
		if r, held := g.token.left(); held && r < w {
			w = r
		}
	}
	if w < 50*time.Microsecond {
		w = 50 * time.Microsecond
	}
	return w
}

// Pass runs one decision round: heartbeat, reaping when due, then grants for every GPU.
func (s *Scheduler) Pass() {
	start := time.Now()
	s.t.Heartbeat()
	c := s.Config()
	if time.Since(s.loop.lastReap) >= c.Scheduler.ReapEvery.Duration {
		s.reap()
	}
	s.decide(start)
	s.stats.Passes.Add(1)
	s.stats.LastPassNs.Store(uint64(time.Since(start)))
}

// scanProcesses walks /proc; a variable so that a test can make the walk slow.
var scanProcesses = table.ScanProcesses

// scanLoop walks /proc every reap period beside the decision loop; reap applies the newest walk.
func (s *Scheduler) scanLoop(ctx context.Context) {
	scan := func() bool {
		if ps, err := scanProcesses(); err != nil {
			logrus.WithError(err).Debug("scan of /proc")
		} else {
			s.loop.scan.Store(ps)
		}
		return true
	}
	scan()
	ticking(ctx, s.Config().Scheduler.ReapEvery.Duration, nil, scan)
}

func (s *Scheduler) reap() {
	s.loop.lastReap = time.Now()
	if !s.lead.stillOurs() {
		return
	}
	// Housekeeping, not the launch path: a doorbell a tenant truncated within its first page, chmodded or scribbled
	// over faults nobody, so only this check notices it (issue 27).
	if fixed, err := s.t.RepairDoorbell(); err != nil {
		logrus.WithError(err).Warn("doorbell damaged and not repaired; waiting by timeout")
	} else if fixed {
		logrus.Warn("doorbell was damaged by a tenant (size, mode or magic); repaired")
	}
	// A client page written past its end (it would fill the run directory's filesystem), truncated, chmodded or with
	// its identity overwritten: put back from the table's copy. libdetshare refuses a process that starts on such a
	// page, so this is what lets the tenant's next processes run again (issue 27).
	fixedPages, perr := s.t.RepairClientPages()
	if perr != nil {
		logrus.WithError(perr).Warn("client page damaged and not repaired")
	}
	for _, r := range fixedPages {
		logrus.WithFields(logrus.Fields{"id": r.ID, "size_found": r.Size, "mode": r.Mode, "header": r.Header}).
			Warn("client page was damaged by its tenant; repaired")
	}
	var rep table.ReapReport
	var err error
	if s.loop.scanning.Load() {
		rep, err = s.t.ReapWith(s.loop.scan.Swap(nil)) // each walk is applied once; none yet: slots only
	} else {
		rep, err = s.t.Reap() // a pass outside Run (tests, one-shot callers): walk /proc here
	}
	if err != nil {
		logrus.WithError(err).Warn("reap pass failed")
		return
	}
	n := uint64(rep.Processes + len(rep.Tenants) + rep.Recovered)
	if n > 0 {
		s.stats.Reaped.Add(n)
		logrus.WithFields(logrus.Fields{"tenants": rep.Tenants, "processes": rep.Processes,
			"bytes": rep.BytesCredited, "recovered": rep.Recovered}).Info("reaped")
	}
}

// tenantRow is one registration as this pass sees it: checked (trust.go) and with its page read once.
type tenantRow struct {
	reg    table.Registration
	demand uint32
	seq    uint32
	since  uint64
	grant  table.Grant
	lat    [policy.LatencyBuckets]uint64 // cumulative latency histograms of its client page (SLO tenants only)
	fine   [policy.FineBuckets]uint64
}

// pageOf maps reg's client page once per registration; a page that does not name reg's slot and generation is not
// read (a reused slot's previous tenant cannot speak for the new one).
func (l *loop) pageOf(reg table.Registration) *table.Client {
	if p, ok := l.pages[reg.Slot]; ok {
		if p.gen == reg.Gen {
			return p.cl
		}
		l.dropPage(reg.Slot)
	}
	cl, err := table.OpenClientPageReadOnly(reg.ClientPagePath)
	if err != nil {
		return nil
	}
	mine := false
	if err := table.Guard("client page of "+reg.ID, func() {
		pg := cl.Page()
		mine = pg.Slot == uint32(reg.Slot) && pg.SlotGen == reg.Gen
	}); err != nil || !mine {
		cl.Close()
		return nil
	}
	l.pages[reg.Slot] = &page{gen: reg.Gen, cl: cl}
	return cl
}

func (l *loop) dropPage(slot int) {
	if p, ok := l.pages[slot]; ok {
		p.cl.Close()
		delete(l.pages, slot)
	}
}

// forget drops what the loop keeps of slots that are no longer registered.
func (l *loop) forget(live map[int]bool) {
	for slot := range l.pages {
		if !live[slot] {
			l.dropPage(slot)
		}
	}
	l.demand.forget(live)
}

func (l *loop) closePages() {
	for slot := range l.pages {
		l.dropPage(slot)
	}
}

// registrations returns the active registrations, re-reading the table only when its generation moved (registration
// bumps it after the slot turns ACTIVE or FREE, so reading the generation first can only cause an extra re-read).
func (s *Scheduler) registrations() []table.Registration {
	l := &s.loop
	gen := s.t.Generation()
	if !l.regsOK || gen != l.regGen {
		l.regs, l.regGen, l.regsOK = s.t.List(), gen, true
		s.mpsw.notify()
	}
	return l.regs
}

func (s *Scheduler) decide(now time.Time) {
	regs := s.registrations()
	live := make(map[int]bool, len(regs))
	byGPU := map[int][]tenantRow{}
	tcfg := s.Config().Tenants
	for _, r := range regs {
		live[r.Slot] = true
		row := tenantRow{reg: s.loop.demand.ceilings(r, tcfg)}
		if cl := s.loop.pageOf(r); cl != nil {
			pg := cl.Page()
			if err := table.Guard("demand of "+r.ID, func() {
				row.demand = s.loop.demand.observed(r, pg, now, tcfg.DemandWindow.Duration)
				row.seq = atomic.LoadUint32(&pg.DemandSeq)
				row.since = atomic.LoadUint64(&pg.DemandSinceNs)
				if r.Tier == table.TierLatencyCritical {
					row.lat, row.fine = readLatency(pg)
				}
			}); err != nil {
				// The tenant truncated its own page: it loses its demand hint (keeps its guarantee and current
				// grant); the page is mapped again, size-checked, at the next pass.
				logrus.WithError(err).WithField("id", r.ID).Warn("client page truncated by its tenant; demand ignored")
				row = tenantRow{reg: s.loop.demand.ceilings(r, tcfg)}
				s.loop.dropPage(r.Slot)
			}
		}
		row.grant, _ = s.t.ReadGrant(r.Slot)
		byGPU[r.GPU] = append(byGPU[r.GPU], row)
	}
	s.loop.forget(live)
	s.stats.forget(regs)
	popt := *s.conf.popt.Load()
	states := s.t.GPUs()
	sort.Slice(states, func(i, j int) bool { return states[i].Index < states[j].Index })
	for _, g := range states {
		gs := s.gpus.get(g.Index)
		if gs == nil {
			// A GPU recorded after start (a registration discovered it): set it up once, then decide as usual.
			gs = s.startGPU(g)
			s.gpus.add(gs)
		}
		rows := byGPU[g.Index]
		if len(rows) == 0 {
			continue
		}
		popt.PowerNearLimit = gs.board.near.Load()
		if gs.mode.Load() == table.ModeSpatial {
			s.decideSpatial(g, rows, popt)
		} else {
			s.decideTemporal(g, &gs.token, rows, popt, now)
		}
	}
}

func toPolicy(r tenantRow) policy.Tenant {
	t := policy.Tenant{Slot: r.reg.Slot, ID: r.reg.ID, Weight: r.reg.Weight, Guarantee: int(r.reg.SMGroups),
		Lend: r.reg.Flags&table.FlagLend != 0, Busy: r.demand > 0, Prev: r.grant.Groups,
		Pinned: r.reg.Flags&table.FlagPinned != 0}
	// the table refuses values outside the enums at registration; a damaged slot reads as the lowest
	if r.reg.Tier.Valid() {
		t.Tier = r.reg.Tier
	}
	if r.reg.Role.Valid() {
		t.Role = r.reg.Role
	}
	if r.grant.Mode != table.ModeSpatial {
		t.Prev = 0
	}
	return t
}

func (s *Scheduler) decideSpatial(g table.GPUState, rows []tenantRow, popt policy.Options) {
	ts := make([]policy.Tenant, len(rows))
	now := time.Now()
	for i, r := range rows {
		ts[i] = toPolicy(r)
		s.stats.sizeSLO(r, &ts[i], len(g.Split.Groups), popt, now)
	}
	d := policy.Decide(g.Split.Groups, ts, popt)
	for i, r := range rows {
		s.setGate(r, d.Grants[i].Gate)
		s.setSLOReport(r)
		ng := table.Grant{Groups: d.Grants[i].Groups, SMs: d.Grants[i].SMs, Mode: table.ModeSpatial}
		s.publish(r, ng, d.Grants[i].Reason)
	}
}

// publish writes a grant when it differs from the one in the table, and accounts the answer to the tenant's
// latest demand (SLO violations of the latency tiers).
func (s *Scheduler) publish(r tenantRow, ng table.Grant, reason string) {
	changed := ng.Groups != r.grant.Groups || ng.SMs != r.grant.SMs || ng.Mode != r.grant.Mode
	c := s.t.Container(r.reg.Slot)
	if r.demand > 0 && r.since != 0 && atomic.LoadUint64(&c.DemandSeenNs) != r.since {
		atomic.StoreUint64(&c.DemandSeenNs, r.since) // the demand this grant answers
	}
	if changed {
		// Pin the grant to the registration it was decided for: if the slot changed hands since the snapshot, the
		// table drops it instead of handing the old tenant's SMs to the new one.
		ng.Gen = r.reg.Gen
		if err := s.t.PublishGrant(r.reg.Slot, ng); err != nil {
			logrus.WithError(err).WithField("id", r.reg.ID).Debug("publish grant")
			return
		}
		s.stats.GrantChanges.Add(1)
		logrus.WithFields(logrus.Fields{"id": r.reg.ID, "groups": fmt.Sprintf("%#x", ng.Groups), "sms": ng.SMs,
			"mode": ng.Mode, "reason": reason}).Debug("grant")
	}
	// A busy latency-tier tenant that needed a new grant and got it later than the SLO after its demand rose is a
	// violation (counted once per rise, by the ledger).
	late := false
	if r.demand > 0 && changed && r.reg.Tier != table.TierBestEffort && r.since != 0 {
		lat := table.MonotonicNs() - r.since
		late = int64(lat) > int64(s.Config().Scheduler.LatencySLO.Duration) && int64(lat) < int64(time.Hour)
	}
	s.stats.answered(r, changed, reason, late)
}
