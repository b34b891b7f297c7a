// Package daemon is the host scheduler: one leader per host (flock on sched.lock), a loop that sleeps on the
// doorbell futex, reads the tenants' demand from their client pages, asks sched/policy for grants and publishes what
// changed in the table. It also reaps dead processes and tenants, runs the MPS control daemons (sched/mps) and keeps
// the counters the metrics endpoint exports.
//
// Fail-static: everything a client needs is in the table. When the scheduler dies, grants and tokens stay as they
// were and tenants keep running on them; the next leader resumes from the table (the grants in it are its starting
// point, so nothing is reshuffled by a takeover).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/sched/config"
	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/metrics"
	"github.com/detshare/detshare/sched/mps"
	"github.com/detshare/detshare/sched/policy"
	"github.com/detshare/detshare/sched/table"
	"github.com/detshare/detshare/sched/view"
)

// ErrNotLeader is returned by Run when another scheduler holds the host lock.
var ErrNotLeader = errors.New("another scheduler is the leader on this host")

// Options configure a scheduler.
type Options struct {
	RunDir string
	Config config.Config
	// Discover lists the host's GPUs (the backend cmd chose: NVML, or the simulated GPU, a test double). Nil: keep
	// what the table knows.
	Discover func() ([]table.GPUInfo, error)
	// MPS manages the control daemons; nil builds one from Config.MPS (simulated when SimulatedGPU is set).
	MPS *mps.Manager
	// SimulatedGPU says cmd chose the simulated GPU (a test double) as the GPU backend: the MPS daemons are its.
	SimulatedGPU bool
	// Ready, if set, is closed once the scheduler leads and has published its first decision.
	Ready chan<- struct{}
	// StopMPSOnExit quits, at a clean exit, the MPS control daemons of GPUs that have no tenant left (scripts and
	// tests that must leave the card as they found it). By default daemons outlive the scheduler (fail-static).
	StopMPSOnExit bool
	// MPSCheckEvery is the period of the MPS watcher (daemon liveness, faulted servers, orphan clients); 0 = 1 s.
	MPSCheckEvery time.Duration
	// Board samples a GPU's power and SM clock (gpuinfo.BoardSampler in production); nil: no power input.
	Board func(index int) (gpuinfo.Board, error)
}

// orphanChecks is how many consecutive MPS checks a client must match no live tenant process before it is
// terminated: a process may reach the MPS server a moment before its library attaches to the client page.
const orphanChecks = 3

// Scheduler is a running leader.
type Scheduler struct {
	opts    Options
	t       *table.Table
	lock    *os.File
	mps     *mps.Manager
	pages   map[int]*page        // slot -> mapped client page of the current generation
	demand  map[int]*demandState // slot -> the library counters last seen (trust.go); loop only
	mpsWake chan struct{}        // a registration changed: the MPS watcher re-applies the memory limits at once
	// gpus is written by the loop (a GPU recorded later by a registration) and read by the MPS watcher.
	gpusMu sync.Mutex
	gpus   map[int]*gpuState

	cfgMu sync.Mutex
	cfg   config.Config
	popt  atomic.Pointer[policy.Options]

	lastReap time.Time
	regs     []table.Registration // cached List(), valid while the table generation is regGen
	regGen   uint64
	regsOK   bool
	tableIno uint64
	lost     error // set when the table file was removed, replaced or truncated: the scheduler steps down
	lostMu   sync.Mutex
	stats    Stats
	tenantMu sync.Mutex
	tenants  map[string]*TenantStats
}

type page struct {
	gen uint32
	cl  *table.Client
}

type gpuState struct {
	index   int
	daemon  *mps.Daemon   // touched only by the MPS watcher goroutine after start
	mode    atomic.Uint32 // table.ModeSpatial while MPS runs, else table.ModeTemporal
	holder  int           // temporal: slot holding the token, -1 none
	holdGen uint32
	until   time.Time
	orphans map[int]int // MPS client PID -> consecutive checks matching no tenant (MPS watcher only)
	memCap  uint64      // server-side per-client memory limit applied (MPS watcher only; capUnset before)
	memSet  bool
	// board power (dynamic.go: powerLoop writes, the loop reads)
	board     atomic.Pointer[gpuinfo.Board]
	powerNear atomic.Bool
}

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

// Acquire takes the leader lock of runDir without blocking.
func Acquire(runDir string) (*os.File, error) {
	p := table.NewPaths(runDir)
	if err := os.MkdirAll(runDir, table.RunDirMode); err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	f, err := os.OpenFile(p.SchedLock(), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p.SchedLock(), err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrNotLeader
		}
		return nil, fmt.Errorf("flock %s: %w", p.SchedLock(), err)
	}
	return f, nil
}

// New becomes the leader of opts.RunDir: lock, open (or create) the table, record the GPUs and start MPS. A table of
// another ABI version or a corrupt one is refused (the error wraps table.ErrVersionMismatch or table.ErrCorrupt)
// and left untouched.
func New(opts Options) (*Scheduler, error) {
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	lock, err := Acquire(opts.RunDir)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{opts: opts, lock: lock, pages: map[int]*page{}, demand: map[int]*demandState{}, mpsWake: make(chan struct{}, 1), gpus: map[int]*gpuState{}, cfg: opts.Config,
		tenants: map[string]*TenantStats{}}
	po := opts.Config.PolicyOptions()
	s.popt.Store(&po)
	fail := func(err error) (*Scheduler, error) {
		if s.t != nil {
			s.t.Close()
		}
		lock.Close()
		return nil, err
	}
	t, err := table.Create(opts.RunDir)
	if err != nil {
		return fail(fmt.Errorf("scheduler: %w", err))
	}
	s.t = t
	s.tableIno = inode(t.Paths().Table())
	if _, err := t.Recover(); err != nil {
		return fail(fmt.Errorf("scheduler: %w", err))
	}
	if opts.Discover != nil {
		infos, err := opts.Discover()
		switch {
		case err != nil && len(t.GPUs()) == 0:
			logrus.WithError(err).Warn("no GPUs discovered; tenants run fail-static until a GPU is found")
		case err != nil:
			logrus.WithError(err).Warn("GPU discovery failed; keeping the GPUs recorded in the table")
		default:
			if err := t.SetGPUs(infos); err != nil {
				return fail(fmt.Errorf("scheduler: %w", err))
			}
		}
	}
	s.mps = opts.MPS
	if s.mps == nil {
		s.mps = &mps.Manager{Paths: t.Paths(), Control: opts.Config.MPS.Control, Simulated: opts.SimulatedGPU}
	}
	for _, g := range t.GPUs() {
		s.gpus[g.Index] = s.startGPU(g)
	}
	// Recorded last, so that a leader seen in the table has its GPUs' modes set up.
	t.SetPolicy(po.Kind.ID())
	li, err := t.SetLeader(os.Getpid())
	if err != nil {
		return fail(fmt.Errorf("scheduler: %w", err))
	}
	logrus.WithFields(logrus.Fields{"run_dir": opts.RunDir, "epoch": li.Epoch, "gpus": len(s.gpus),
		"policy": po.Kind}).Info("scheduler leads")
	return s, nil
}

// startGPU brings up MPS for one GPU and records the mode; the temporal token state is resumed from the table.
func (s *Scheduler) startGPU(g table.GPUState) *gpuState {
	st := &gpuState{index: g.Index, holder: -1, orphans: map[int]int{}}
	st.mode.Store(table.ModeTemporal)
	if tok := s.t.ReadToken(g.Index); tok.Holder >= 0 {
		st.holder, st.holdGen = tok.Holder, tok.HolderGen
		st.until = time.Now().Add(time.Duration(int64(tok.DeadlineNs) - int64(table.MonotonicNs())))
	}
	if !s.cfg.MPS.Enable {
		_ = s.t.SetMPS(g.Index, table.MPSAbsent, table.ModeTemporal, "")
		return st
	}
	d, err := s.mps.Start(g.Index, g.UUID)
	switch {
	case err == nil:
		st.daemon = d
		st.mode.Store(table.ModeSpatial)
		_ = s.t.SetMPS(g.Index, table.MPSRunning, table.ModeSpatial, d.PipeDir)
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "pipe": d.PipeDir, "adopted": d.Adopted,
			"simulated": s.mps.Simulated}).Info("MPS control daemon running")
	case errors.Is(err, mps.ErrAbsent):
		_ = s.t.SetMPS(g.Index, table.MPSAbsent, table.ModeTemporal, "")
		logrus.WithError(err).WithField("gpu", g.Index).Warn("MPS unavailable: temporal quanta")
	default:
		_ = s.t.SetMPS(g.Index, table.MPSFailed, table.ModeTemporal, "")
		logrus.WithError(err).WithField("gpu", g.Index).Error("MPS failed to start: temporal quanta")
	}
	return st
}

// Table returns the scheduler's table mapping.
func (s *Scheduler) Table() *table.Table { return s.t }

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

// Config returns the configuration in force.
func (s *Scheduler) Config() config.Config {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	return s.cfg
}

// Reload swaps in a new configuration (SIGHUP). A configuration that fails validation is refused and the old one
// stays. Running tenants are not disturbed: the next pass decides with the new policy from their current grants.
func (s *Scheduler) Reload(c config.Config) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("reload refused, previous configuration kept: %w", err)
	}
	s.cfgMu.Lock()
	s.cfg = c
	s.cfgMu.Unlock()
	po := c.PolicyOptions()
	s.popt.Store(&po)
	s.t.SetPolicy(po.Kind.ID())
	s.stats.Reloads.Add(1)
	s.t.RingDoorbell()
	logrus.WithField("policy", po.Kind).Info("configuration reloaded")
	return nil
}

// Close releases the leadership; grants, tokens and MPS daemons stay (fail-static).
func (s *Scheduler) Close() error {
	_ = table.Guard("clear leader", func() { s.t.ClearLeader(os.Getpid()) }) // the table may have been truncated
	for _, p := range s.pages {
		p.cl.Close()
	}
	s.pages = map[int]*page{}
	err := s.t.Close()
	s.lock.Close()
	return err
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
	mpsCtx, mpsStop := context.WithCancel(ctx)
	mpsDone := make(chan struct{})
	go func() {
		defer close(mpsDone)
		every := s.opts.MPSCheckEvery
		if every <= 0 {
			every = time.Second
		}
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-mpsCtx.Done():
				return
			case <-tk.C:
				if err := table.Guard("MPS check", func() { s.checkMPS(s.gpuList()) }); err != nil {
					s.tableLost(err) // the loop steps down at its next pass
					return
				}
			case <-s.mpsWake:
				if err := table.Guard("MPS check", func() { s.checkMPS(s.gpuList()) }); err != nil {
					s.tableLost(err)
					return
				}
			}
		}
	}()
	defer func() { mpsStop(); <-mpsDone }()
	powerDone := make(chan struct{})
	go func() { defer close(powerDone); s.powerLoop(mpsCtx) }()
	defer func() { mpsStop(); <-powerDone }()
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

// guardedPass runs Pass, and steps down (an error, never a SIGBUS) when the table was truncated under the mapping:
// only root on the host can do that, and nothing can be scheduled through it any more. Tenants keep their last
// grant (libdetshare survives the truncation, docs/threat-model.md).
func (s *Scheduler) guardedPass() error {
	if err := table.Guard("scheduler pass", s.Pass); err != nil {
		s.tableLost(err)
	}
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	return s.lost
}

func (s *Scheduler) tableLost(err error) {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	if s.lost == nil {
		s.lost = fmt.Errorf("scheduler: table %s was truncated (%w); stepping down", s.t.Paths().Table(), err)
	}
}

func (s *Scheduler) gpuList() []*gpuState {
	s.gpusMu.Lock()
	defer s.gpusMu.Unlock()
	out := make([]*gpuState, 0, len(s.gpus))
	for _, g := range s.gpus {
		out = append(out, g)
	}
	return out
}

func (s *Scheduler) nextWait() time.Duration {
	c := s.Config()
	w := c.Scheduler.Tick.Duration
	if r := c.Scheduler.ReapEvery.Duration - time.Since(s.lastReap); r < w {
		w = r
	}
	for _, g := range s.gpuList() {
		if g.mode.Load() == table.ModeTemporal && g.holder >= 0 {
			if r := time.Until(g.until); r < w {
				w = r
			}
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
	if time.Since(s.lastReap) >= c.Scheduler.ReapEvery.Duration {
		s.reap()
	}
	s.decide(start)
	s.stats.Passes.Add(1)
	s.stats.LastPassNs.Store(uint64(time.Since(start)))
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

func (s *Scheduler) reap() {
	s.lastReap = time.Now()
	// A run directory that was removed (tests, uninstall) or a table replaced by an operator is no longer ours.
	if ino := inode(s.t.Paths().Table()); ino == 0 || ino != s.tableIno {
		s.lostMu.Lock()
		s.lost = fmt.Errorf("scheduler: table %s was removed or replaced; stepping down", s.t.Paths().Table())
		s.lostMu.Unlock()
		return
	}
	// Host PIDs of processes about to be reaped, for MPS terminate_client (a process may linger as an MPS client
	// after its container is gone).
	rep, err := s.t.Reap()
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

// checkMPS restarts a dead control daemon (tenants on that GPU fall back to temporal meanwhile) and shuts down
// faulted servers once their clients are gone. Throttled to once a second per GPU: it runs external commands.
func (s *Scheduler) checkMPS(gpus []*gpuState) {
	for _, g := range gpus {
		if g.daemon == nil {
			continue
		}
		if !s.mps.Alive(g.daemon) {
			logrus.WithField("gpu", g.index).Warn("MPS control daemon died; restarting it")
			d, err := s.mps.Start(g.index, g.daemon.UUID)
			if err != nil {
				_ = s.t.SetMPS(g.index, table.MPSFailed, table.ModeTemporal, "")
				g.mode.Store(table.ModeTemporal)
				g.daemon = nil
				logrus.WithError(err).WithField("gpu", g.index).Error("MPS restart failed: temporal quanta")
				continue
			}
			g.daemon = d
			g.memSet = false
			_ = s.t.SetMPS(g.index, table.MPSRunning, table.ModeSpatial, d.PipeDir)
			g.mode.Store(table.ModeSpatial)
			continue
		}
		s.applyMemCap(g)
		if !s.mps.Simulated {
			s.terminateOrphans(g)
			if _, err := s.mps.RestartIdleFailedServers(g.daemon); err != nil {
				logrus.WithError(err).WithField("gpu", g.index).Debug("MPS server check")
			}
		}
	}
}

// terminateOrphans asks the MPS server to terminate clients that belong to no live tenant process: leftovers of
// dead containers, which could otherwise wedge the server for every tenant of the GPU. Only DetShare tenants can
// reach this daemon (its pipe directory is private and mounted only into tenants), so such a client is ours to end.
func (s *Scheduler) terminateOrphans(g *gpuState) {
	servers, err := s.mps.Servers(g.daemon)
	if err != nil || len(servers) == 0 {
		return
	}
	known := map[table.ProcIdentity]bool{}
	for _, r := range s.t.List() {
		cl, err := table.OpenClientPageReadOnly(r.ClientPagePath)
		if err != nil {
			continue
		}
		pg := cl.Page()
		_ = table.Guard("MPS clients of "+r.ID, func() { // the tenant may truncate its page meanwhile
			for i := range pg.Procs {
				p := &pg.Procs[i]
				if st := atomic.LoadUint32(&p.State); st == table.ProcLive || st == table.ProcClaiming {
					known[table.ProcIdentity{NSPid: atomic.LoadUint32(&p.NSPid), PidNSIno: atomic.LoadUint64(&p.PidNSIno),
						StartTime: atomic.LoadUint64(&p.StartTime)}] = true
				}
			}
		})
		cl.Close()
	}
	seen := map[int]bool{}
	for _, srv := range servers {
		clients, err := s.mps.Clients(g.daemon, srv)
		if err != nil {
			continue
		}
		for _, pid := range clients {
			seen[pid] = true
			id, err := table.PidIdentity(pid)
			if err != nil {
				continue // gone already
			}
			id.HostPID = 0
			if known[id] {
				delete(g.orphans, pid)
				continue
			}
			g.orphans[pid]++
			if g.orphans[pid] < orphanChecks {
				continue
			}
			if _, err := s.mps.Command(g.daemon, fmt.Sprintf("terminate_client %d %d", srv, pid)); err != nil {
				logrus.WithError(err).WithFields(logrus.Fields{"gpu": g.index, "pid": pid}).Warn("terminate_client failed")
				continue
			}
			s.stats.Reaped.Add(1)
			delete(g.orphans, pid)
			logrus.WithFields(logrus.Fields{"gpu": g.index, "server": srv, "pid": pid}).Warn("MPS client of no live tenant terminated")
		}
	}
	for pid := range g.orphans {
		if !seen[pid] {
			delete(g.orphans, pid)
		}
	}
}

type tenantRow struct {
	reg    table.Registration
	demand uint32
	seq    uint32
	since  uint64
	grant  table.Grant
	lat    [policy.LatencyBuckets]uint64 // cumulative latency histogram of its client page
}

func (s *Scheduler) pageOf(reg table.Registration) *table.Client {
	if p, ok := s.pages[reg.Slot]; ok {
		if p.gen == reg.Gen {
			return p.cl
		}
		p.cl.Close()
		delete(s.pages, reg.Slot)
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
	s.pages[reg.Slot] = &page{gen: reg.Gen, cl: cl}
	return cl
}

// registrations returns the active registrations, re-reading the table only when its generation moved (registration
// bumps it after the slot turns ACTIVE or FREE, so reading the generation first can only cause an extra re-read).
func (s *Scheduler) registrations() []table.Registration {
	gen := s.t.Generation()
	if !s.regsOK || gen != s.regGen {
		s.regs, s.regGen, s.regsOK = s.t.List(), gen, true
		select {
		case s.mpsWake <- struct{}{}:
		default:
		}
	}
	return s.regs
}

func (s *Scheduler) decide(now time.Time) {
	regs := s.registrations()
	live := make(map[int]bool, len(regs))
	byGPU := map[int][]tenantRow{}
	tcfg := s.Config().Tenants
	for _, r := range regs {
		live[r.Slot] = true
		row := tenantRow{reg: s.ceilings(r, tcfg)}
		if cl := s.pageOf(r); cl != nil {
			pg := cl.Page()
			if err := table.Guard("demand of "+r.ID, func() {
				row.demand = s.observedDemand(r, pg, now, tcfg.DemandWindow.Duration)
				row.seq = atomic.LoadUint32(&pg.DemandSeq)
				row.since = atomic.LoadUint64(&pg.DemandSinceNs)
				row.lat = readLatency(pg)
			}); err != nil {
				// The tenant truncated its own page: it loses its demand hint (keeps its guarantee and current
				// grant); the page is mapped again, size-checked, at the next pass.
				logrus.WithError(err).WithField("id", r.ID).Warn("client page truncated by its tenant; demand ignored")
				row = tenantRow{reg: s.ceilings(r, tcfg)}
				cl.Close()
				delete(s.pages, r.Slot)
			}
		}
		row.grant, _ = s.t.ReadGrant(r.Slot)
		byGPU[r.GPU] = append(byGPU[r.GPU], row)
	}
	for slot, p := range s.pages {
		if !live[slot] {
			p.cl.Close()
			delete(s.pages, slot)
		}
	}
	for slot := range s.demand {
		if !live[slot] {
			delete(s.demand, slot)
		}
	}
	s.forgetGone(regs)
	popt := *s.popt.Load()
	states := s.t.GPUs()
	sort.Slice(states, func(i, j int) bool { return states[i].Index < states[j].Index })
	for _, g := range states {
		s.gpusMu.Lock()
		gs := s.gpus[g.Index]
		s.gpusMu.Unlock()
		if gs == nil {
			// A GPU recorded after start (a registration discovered it): set it up once, then decide as usual.
			gs = s.startGPU(g)
			s.gpusMu.Lock()
			s.gpus[g.Index] = gs
			s.gpusMu.Unlock()
		}
		rows := byGPU[g.Index]
		if len(rows) == 0 {
			continue
		}
		if gs.mode.Load() == table.ModeSpatial {
			popt.PowerNearLimit = gs.powerNear.Load()
			s.decideSpatial(g, rows, popt)
		} else {
			s.decideTemporal(g, gs, rows, popt, now)
		}
	}
}

func toPolicy(r tenantRow) policy.Tenant {
	t := policy.Tenant{Slot: r.reg.Slot, ID: r.reg.ID, Weight: r.reg.Weight, Guarantee: int(r.reg.SMGroups),
		Lend: r.reg.Flags&table.FlagLend != 0, Busy: r.demand > 0, Prev: r.grant.Groups,
		Pinned: r.reg.Flags&table.FlagPinned != 0}
	switch r.reg.Tier {
	case table.TierLatencyCritical:
		t.Tier = policy.LatencyCritical
	case table.TierBurstable:
		t.Tier = policy.Burstable
	default:
		t.Tier = policy.BestEffort
	}
	switch r.reg.Role {
	case table.RolePrefill:
		t.Role = policy.RolePrefill
	case table.RoleDecode:
		t.Role = policy.RoleDecode
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
		s.sizeSLO(r, &ts[i], len(g.Split.Groups), now)
	}
	d := policy.Decide(g.Split.Groups, ts, popt)
	for i, r := range rows {
		s.setGate(r, d.Grants[i].Gate)
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
	s.tenantMu.Lock()
	st := s.tenants[r.reg.ID]
	if st == nil {
		st = &TenantStats{}
		s.tenants[r.reg.ID] = st
	}
	if changed {
		st.GrantChanges++
	}
	st.Reason = reason
	// A busy latency-tier tenant that needed a new grant and got it later than the SLO after its demand rose is a
	// violation (once per rise).
	if r.demand > 0 && r.seq != st.lastSeq {
		st.lastSeq = r.seq
		if changed && r.reg.Tier != table.TierBestEffort && r.since != 0 {
			if lat := table.MonotonicNs() - r.since; int64(lat) > int64(s.Config().Scheduler.LatencySLO.Duration) && int64(lat) < int64(time.Hour) {
				st.SLOViolations++
			}
		}
	}
	s.tenantMu.Unlock()
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

// decideTemporal hands the GPU's time token around the busy tenants. Every tenant's grant says temporal mode over
// the whole split; the token says who may run now. A latency-critical tenant that becomes busy takes the token at
// once from a lower tier (the holder finishes its in-flight kernel; nothing is preempted).
func (s *Scheduler) decideTemporal(g table.GPUState, gs *gpuState, rows []tenantRow, popt policy.Options, now time.Time) {
	var all uint64
	for i := range g.Split.Groups {
		all |= 1 << i
	}
	ts := make([]policy.Tenant, len(rows))
	for i, r := range rows {
		ts[i] = toPolicy(r)
		s.publish(r, table.Grant{Groups: all, SMs: g.Split.TotalSMs(), Mode: table.ModeTemporal}, "temporal: runs while holding the token")
	}
	turns := policy.Rotation(ts, popt)
	tierOf := map[int]policy.Tier{}
	genOf := map[int]uint32{}
	for i, r := range rows {
		tierOf[r.reg.Slot] = ts[i].Tier
		genOf[r.reg.Slot] = r.reg.Gen
	}
	pos := -1
	for i, tn := range turns {
		if tn.Slot == gs.holder && genOf[tn.Slot] == gs.holdGen {
			pos = i
		}
	}
	next := -1
	switch {
	case len(turns) == 0:
		next = -1
	case pos < 0:
		next = 0
	case tierOf[turns[0].Slot] > tierOf[gs.holder]:
		next = 0 // a higher tier became busy: it goes first
	case !now.Before(gs.until):
		next = (pos + 1) % len(turns)
	default:
		return // quantum not over
	}
	if next < 0 {
		if gs.holder >= 0 {
			gs.holder = -1
			_ = s.t.PublishToken(g.Index, -1, 0)
		}
		return
	}
	tn := turns[next]
	if tn.Slot == gs.holder && pos == next && genOf[tn.Slot] == gs.holdGen {
		gs.until = now.Add(tn.Quantum) // alone: keep it, extend
		_ = s.t.PublishToken(g.Index, tn.Slot, table.MonotonicNs()+uint64(tn.Quantum))
		return
	}
	gs.holder, gs.holdGen, gs.until = tn.Slot, genOf[tn.Slot], now.Add(tn.Quantum)
	if err := s.t.PublishToken(g.Index, tn.Slot, table.MonotonicNs()+uint64(tn.Quantum)); err != nil {
		logrus.WithError(err).WithField("gpu", g.Index).Warn("publish token")
		return
	}
	s.stats.TokenHandoffs.Add(1)
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

// Main is `detshare sched`: lead until ctx ends, reloading the configuration from configPath on SIGHUP.
func Main(ctx context.Context, opts Options, configPath string, hup <-chan os.Signal) error {
	s, err := New(opts)
	if err != nil {
		return err
	}
	defer s.Close()
	if addr := s.Config().Metrics.Listen; addr != "" {
		a, err := metrics.Serve(ctx, addr, s.MetricsSource())
		if err != nil {
			// Observability must not take scheduling down.
			logrus.WithError(err).Error("metrics endpoint not started")
		} else {
			logrus.WithField("address", a.String()).Info("metrics endpoint listening")
		}
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				c, err := config.Load(configPath)
				if err == nil {
					err = s.Reload(c)
				}
				if err != nil {
					logrus.WithError(err).Error("SIGHUP: configuration not reloaded")
				}
			}
		}
	}()
	err = s.Run(ctx)
	if s.opts.StopMPSOnExit {
		s.stopIdleMPS()
	}
	return err
}

// stopIdleMPS quits the control daemons of GPUs without tenants (after Run: the MPS watcher has stopped).
func (s *Scheduler) stopIdleMPS() {
	used := map[int]bool{}
	for _, r := range s.t.List() {
		used[r.GPU] = true
	}
	for _, g := range s.gpuList() {
		if g.daemon == nil {
			continue
		}
		if used[g.index] {
			logrus.WithField("gpu", g.index).Warn("MPS control daemon left running: tenants still use the GPU")
			continue
		}
		if err := s.mps.Stop(g.daemon); err != nil {
			logrus.WithError(err).WithField("gpu", g.index).Warn("MPS control daemon did not quit")
			continue
		}
		_ = s.t.SetMPS(g.index, table.MPSUnknown, table.ModeNone, "")
		logrus.WithField("gpu", g.index).Info("MPS control daemon stopped")
	}
}
