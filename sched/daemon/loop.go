package daemon

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/policy"
)

// loop is what the decision loop keeps between passes. Only the goroutine running Run (or a caller of Pass) touches
// it, so none of it is locked. Everything a pass needs is kept here and reused, so that a pass allocates nothing
// whatever the number of tenants (BenchmarkPass): reaping and liveness are not its business (reaper.go).
type loop struct {
	pages  [table.MaxContainers]page // by slot: mapped client page of the current generation (cl nil: none)
	demand demandBook                // trust.go
	// regs caches table.List() while the table generation stays regGen: a pass without a registration reads no slot.
	regs   []table.Registration
	regGen uint64
	regsOK bool
	// rows[gpu] is this pass's tenants of each GPU; dec[gpu] decides it.
	rows [table.MaxGPUs][]tenantRow
	dec  [table.MaxGPUs]gpuDecider
	// entries[slot] is the ledger entry of the slot's tenant (stats.go), for the generation recorded.
	entries [table.MaxContainers]struct {
		gen uint32
		st  *TenantStats
	}
	// gpus caches table.GPUs() while the GPU entries' fingerprint stays gpuFP.
	gpus   []table.GPUState
	gpuFP  [table.MaxGPUs]gpuPrint
	nGPU   uint32
	gpusOK bool
}

// gpuPrint is what of a GPU entry decides whether the cached GPUState is still right.
type gpuPrint struct{ state, splitState, nGroups, smCount, index uint32 }

// gpuDecider is one GPU's policy state between passes: a Decider (buffers, reasons) and the inputs of the last
// decision it published, so that a pass whose inputs did not change (a tick, or a doorbell for another GPU)
// repeats nothing: the policy is pure, so the same inputs give the grants already in the table.
type gpuDecider struct {
	dc     policy.Decider
	ts     []policy.Tenant
	last   []decisionInput
	opt    policy.Options
	groups []uint32
	valid  bool // last and opt describe what the table holds
}

// decisionInput is what a decision of one tenant depends on, with what its answer records (demand seq and since).
type decisionInput struct {
	t     policy.Tenant
	gen   uint32
	seq   uint32
	since uint64
}

// unchanged tells whether ts (aligned with rows) under popt and groups are the inputs of the last decision.
func (d *gpuDecider) unchanged(ts []policy.Tenant, rows []tenantRow, popt policy.Options, groups []uint32) bool {
	if !d.valid || d.opt != popt || len(d.last) != len(ts) || !slices.Equal(d.groups, groups) {
		return false
	}
	for i := range ts {
		if d.last[i] != (decisionInput{ts[i], rows[i].reg.Gen, rows[i].seq, rows[i].since}) {
			return false
		}
	}
	return true
}

// remember records the inputs of a decision that was published in full.
func (d *gpuDecider) remember(ts []policy.Tenant, rows []tenantRow, popt policy.Options, groups []uint32) {
	d.last = d.last[:0]
	for i := range ts {
		d.last = append(d.last, decisionInput{ts[i], rows[i].reg.Gen, rows[i].seq, rows[i].since})
	}
	d.opt, d.groups, d.valid = popt, append(d.groups[:0], groups...), true
}

type page struct {
	gen uint32
	cl  *table.Client
}

func newLoop() loop {
	return loop{demand: demandBook{}}
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
	// Reaping and liveness (walks of /proc, the registration lock, every client page) run beside the loop too;
	// they hand their results over through the table and ring the doorbell (reaper.go).
	reapDone := make(chan struct{})
	go func() { defer close(reapDone); s.reapLoop(watchCtx) }()
	defer func() { watchStop(); <-reapDone }()
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

// nextWait is how long the loop may sleep on the doorbell: until the next tick or the end of a quantum.
func (s *Scheduler) nextWait() time.Duration {
	w := s.Config().Scheduler.Tick.Duration
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

// Pass runs one decision round: heartbeat, then grants for every GPU. It never reaps: the reaper runs beside the
// loop (reaper.go) and the loop never waits for it.
func (s *Scheduler) Pass() {
	start := time.Now()
	s.t.Heartbeat()
	s.decide(start)
	s.stats.Passes.Add(1)
	s.stats.LastPassNs.Store(uint64(time.Since(start)))
}

// tenantRow is one registration as this pass sees it: checked (trust.go) and with its page read once.
type tenantRow struct {
	reg    table.Registration
	demand uint32
	seq    uint32
	since  uint64
	grant  table.Grant
	lat    [policy.LatencyBuckets]uint64 // cumulative latency histograms of its client page (latency-critical only)
	fine   [policy.FineBuckets]uint64
	st     *TenantStats // its ledger entry
}

// pageOf maps reg's client page once per registration; a page that does not name reg's slot and generation is not
// read (a reused slot's previous tenant cannot speak for the new one).
func (l *loop) pageOf(reg table.Registration) *table.Client {
	if p := &l.pages[reg.Slot]; p.cl != nil {
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
	l.pages[reg.Slot] = page{gen: reg.Gen, cl: cl}
	return cl
}

func (l *loop) dropPage(slot int) {
	if p := &l.pages[slot]; p.cl != nil {
		p.cl.Close()
		*p = page{}
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
// What the loop keeps of slots no longer registered is dropped then, not on every pass.
func (s *Scheduler) registrations() []table.Registration {
	l := &s.loop
	gen := s.t.Generation()
	if !l.regsOK || gen != l.regGen {
		l.regs, l.regGen, l.regsOK = s.t.List(), gen, true
		live := make(map[int]bool, len(l.regs))
		for _, r := range l.regs {
			live[r.Slot] = true
		}
		l.forget(live)
		s.stats.forget(l.regs)
		clear(l.entries[:]) // the ledger dropped the entries of tenants gone
		s.mpsw.notify()
	}
	return l.regs
}

// gpuStates returns the present GPUs in index order, re-reading them only when an entry's state, split or size
// changed (a pass otherwise copies no names or splits).
func (s *Scheduler) gpuStates() []table.GPUState {
	l := &s.loop
	n := min(atomic.LoadUint32(&s.t.Header().NGPUs), table.MaxGPUs)
	var fp [table.MaxGPUs]gpuPrint
	for i := range n {
		e := s.t.GPU(int(i))
		fp[i] = gpuPrint{atomic.LoadUint32(&e.State), atomic.LoadUint32(&e.SplitState), atomic.LoadUint32(&e.NGroups),
			atomic.LoadUint32(&e.SMCount), atomic.LoadUint32(&e.Index)}
	}
	if !l.gpusOK || n != l.nGPU || fp != l.gpuFP {
		l.gpus = s.t.GPUs()
		sort.Slice(l.gpus, func(i, j int) bool { return l.gpus[i].Index < l.gpus[j].Index })
		l.nGPU, l.gpuFP, l.gpusOK = n, fp, true
	}
	return l.gpus
}

func (s *Scheduler) decide(now time.Time) {
	l := &s.loop
	regs := s.registrations()
	tcfg := s.Config().Tenants
	maxTier := ceilingTier(tcfg)
	read := func(guard bool) {
		for g := range l.rows {
			l.rows[g] = l.rows[g][:0]
		}
		for _, r := range regs {
			if r.GPU < 0 || r.GPU >= table.MaxGPUs {
				continue // the table refuses such a registration; a damaged slot is not scheduled
			}
			l.rows[r.GPU] = append(l.rows[r.GPU], tenantRow{})
			s.readRow(&l.rows[r.GPU][len(l.rows[r.GPU])-1], r, tcfg, maxTier, now, guard)
		}
	}
	// One guard over every page; only when a tenant has truncated its page are they read again one guard each, to
	// find whose it was (reading a page twice in a pass changes nothing: the counters seen are the same).
	if table.Guard("client pages", func() { read(false) }) != nil {
		read(true)
	}
	popt := *s.conf.popt.Load()
	for _, g := range s.gpuStates() {
		gs := s.gpus.get(g.Index)
		if gs == nil {
			// A GPU recorded after start (a registration discovered it): set it up once, then decide as usual.
			gs = s.startGPU(g)
			s.gpus.add(gs)
		}
		if g.Index < 0 || g.Index >= table.MaxGPUs {
			continue
		}
		rows := l.rows[g.Index]
		if len(rows) == 0 {
			continue
		}
		popt.PowerNearLimit = gs.board.near.Load()
		if gs.mode.Load() == table.ModeSpatial {
			s.decideSpatial(g, &l.dec[g.Index], rows, popt)
		} else {
			l.dec[g.Index].valid = false
			s.decideTemporal(g, &gs.token, rows, popt, now)
		}
	}
}

// readRow fills row with registration r as this pass sees it: ceilings applied and its client page read once.
// With guard, a page its tenant truncated costs it its demand hint instead of faulting the caller.
func (s *Scheduler) readRow(row *tenantRow, r table.Registration, tcfg config.Tenants, maxTier table.Tier, now time.Time, guard bool) {
	l := &s.loop
	row.reg = l.demand.ceilings(r, tcfg, maxTier)
	row.st = l.entry(&s.stats, r)
	if cl := l.pageOf(r); cl != nil {
		pg := cl.Page()
		// only the SLO controller reads the histograms (a latency-critical tenant with slo-p99)
		slo := r.Tier == table.TierLatencyCritical && r.SLOP99Us != 0
		read := func() {
			row.demand = l.demand.observed(r, pg, now, tcfg.DemandWindow.Duration)
			row.seq = atomic.LoadUint32(&pg.DemandSeq)
			row.since = atomic.LoadUint64(&pg.DemandSinceNs)
			if slo {
				row.lat, row.fine = readLatency(pg)
			}
		}
		if !guard {
			read()
		} else if err := table.Guard("demand of a client page", read); err != nil {
			// The tenant truncated its own page: it loses its demand hint (keeps its guarantee and current
			// grant); the page is mapped again, size-checked, at the next pass.
			logrus.WithError(err).WithField("id", r.ID).Warn("client page truncated by its tenant; demand ignored")
			*row = tenantRow{reg: l.demand.ceilings(r, tcfg, maxTier), st: row.st}
			l.dropPage(r.Slot)
		}
	}
	row.grant, _ = s.t.ReadGrant(r.Slot)
}

// entry returns r's ledger entry, kept per slot and generation so that a pass looks up no tenant by name.
func (l *loop) entry(ld *ledger, r table.Registration) *TenantStats {
	e := &l.entries[r.Slot%table.MaxContainers]
	if e.st == nil || e.gen != r.Gen {
		e.gen, e.st = r.Gen, ld.entry(r.ID)
	}
	return e.st
}

func toPolicy(r *tenantRow) policy.Tenant {
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

func (s *Scheduler) decideSpatial(g table.GPUState, d *gpuDecider, rows []tenantRow, popt policy.Options) {
	ts := d.ts[:0]
	now := time.Now()
	// Rows are handled in place: a row holds the latency histograms (2 KB and more), and copying each one a few
	// times per pass was the largest cost of a pass at 256 tenants.
	for i := range rows {
		r := &rows[i]
		ts = append(ts, toPolicy(r))
		s.stats.sizeSLO(r, &ts[i], len(g.Split.Groups), popt, now)
	}
	d.ts = ts
	if d.unchanged(ts, rows, popt, g.Split.Groups) {
		// The grants and gates in the table are this decision's; the SLO controllers' reports may still have moved.
		for i := range rows {
			s.setSLOReport(&rows[i])
		}
		return
	}
	dec := d.dc.Decide(g.Split.Groups, ts, popt)
	slo := s.Config().Scheduler.LatencySLO.Duration
	ok := true
	for i := range rows {
		r := &rows[i]
		s.setGate(r, dec.Grants[i].Gate)
		s.setNarrow(r, dec.Grants[i].Narrow)
		s.setSLOReport(r)
		ng := table.Grant{Groups: dec.Grants[i].Groups, SMs: dec.Grants[i].SMs, Mode: table.ModeSpatial}
		ok = s.publish(r, ng, dec.Grants[i].Reason, slo) && ok
	}
	d.valid = false
	if ok {
		d.remember(ts, rows, popt, g.Split.Groups)
	}
}

// publish writes a grant when it differs from the one in the table, and accounts the answer to the tenant's
// latest demand (SLO violations of the latency tiers).
// It reports false when the grant could not be published (the slot changed hands meanwhile).
func (s *Scheduler) publish(r *tenantRow, ng table.Grant, reason string, slo time.Duration) bool {
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
			return false
		}
		s.stats.GrantChanges.Add(1)
		if logrus.IsLevelEnabled(logrus.DebugLevel) {
			logrus.WithFields(logrus.Fields{"id": r.reg.ID, "groups": fmt.Sprintf("%#x", ng.Groups), "sms": ng.SMs,
				"mode": ng.Mode, "reason": reason}).Debug("grant")
		}
	}
	// A busy latency-tier tenant that needed a new grant and got it later than the SLO after its demand rose is a
	// violation (counted once per rise, by the ledger).
	late := false
	if r.demand > 0 && changed && r.reg.Tier != table.TierBestEffort && r.since != 0 {
		lat := table.MonotonicNs() - r.since
		late = int64(lat) > int64(slo) && int64(lat) < int64(time.Hour)
	}
	s.stats.answered(r.st, r, changed, reason, late)
	return true
}
