// Package daemon is the host scheduler: one leader per host (flock on sched.lock), a loop that sleeps on the
// doorbell futex, reads the tenants' demand from their client pages, asks sched/policy for grants and publishes what
// changed in the table. It also reaps dead processes and tenants, runs the MPS control daemons (sched/mps) and keeps
// the counters the metrics endpoint exports.
//
// Fail-static: everything a client needs is in the table. When the scheduler dies, grants and tokens stay as they
// were and tenants keep running on them; the next leader resumes from the table (the grants in it are its starting
// point, so nothing is reshuffled by a takeover).
//
// One file per job, each job with the state it owns, so that what a goroutine may touch is visible in the types:
// leader.go (the host lock and the table it leads, stepping down), loop.go (the decision loop: client pages,
// registrations, spatial grants), reaper.go (dead processes and tenants, beside the loop), temporal.go (the time token of GPUs without MPS), mpswatch.go (the MPS
// control daemons and their clients), stats.go (counters for metrics), trust.go (what a tenant says is checked before
// the policy sees it) and dynamic.go (SLO sizing, dispatch gate, board power). This file composes them.
package daemon

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/metrics"
	"github.com/detshare/detshare/sched/mps"
	"github.com/detshare/detshare/sched/policy"
)

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
	// ProcessMemory reads a GPU's per-process device memory (gpuinfo.ProcessMemorySampler), for the metrics'
	// memory a tenant holds outside the library (view.GPUMemory); nil: not exported.
	ProcessMemory func(index int) (map[int]uint64, error)
	// ComputeModes sets the GPUs' compute mode for mps.exclusive (computemode.go); nil: compute modes are left alone.
	ComputeModes ComputeModes
}

// Scheduler is a running leader.
type Scheduler struct {
	opts Options
	// t is the table the leadership opened (and closes); every job reads and writes through it.
	t     *table.Table
	lead  *leadership    // leader.go
	conf  settings       // read by every job, swapped by Reload
	gpus  gpuSet         // each GPU's state, split by job
	loop  loop           // loop.go: the Run goroutine only
	mpsw  mpsWatcher     // mpswatch.go: its own goroutine
	stats ledger         // stats.go: written by the jobs, read by the metrics endpoint
	modes map[int]string // compute modes setExclusive changed: GPU -> its previous mode (computemode.go)
}

// settings is the configuration in force: SIGHUP swaps it while the loop and the watchers read it.
type settings struct {
	mu  sync.Mutex
	cfg config.Config
	// popt is what the policy needs on every pass; atomic so that a pass never waits on a reload.
	popt atomic.Pointer[policy.Options]
}

func (c *settings) get() config.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg
}

func (c *settings) set(cfg config.Config) policy.Options {
	c.mu.Lock()
	c.cfg = cfg
	c.mu.Unlock()
	po := policyOptions(cfg.PolicyOptions())
	c.popt.Store(&po)
	return po
}

// policyOptions converts the configuration's policy settings (internal/config, which imports no scheduler code)
// for sched/policy. The kind is one of config.Policies, which config.Validate has checked.
func policyOptions(o config.PolicyOptions) policy.Options {
	return policy.Options{Kind: policy.Kind(o.Kind), DecodeBoost: o.DecodeBoost, Quantum: o.Quantum,
		MaxQuantum: o.MaxQuantum, Floor: o.Floor, GateDepth: o.GateDepth, GateBudget: o.GateBudget,
		LCReserve: o.LCReserve, LCOverlap: o.LCOverlap, ShareOverlap: o.ShareOverlap, NarrowGroups: o.NarrowGroups}
}

// gpuState is one GPU as the scheduler runs it; each part belongs to the job named beside it.
type gpuState struct {
	index int
	// mode is table.ModeSpatial while the GPU's MPS control daemon runs, else table.ModeTemporal: set where the daemon
	// is started (startGPU, the MPS watcher), read by the loop to choose between grants and the time token.
	mode  atomic.Uint32
	mps   mpsGPU     // mpswatch.go
	token token      // temporal.go
	board boardState // dynamic.go
}

// gpuSet is the GPUs the scheduler runs. The loop adds a GPU recorded after start; the MPS watcher and the power
// loop walk the set from their own goroutines.
type gpuSet struct {
	mu sync.Mutex
	m  map[int]*gpuState
}

func (s *gpuSet) get(index int) *gpuState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[index]
}

func (s *gpuSet) add(g *gpuState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[int]*gpuState{}
	}
	s.m[g.index] = g
}

func (s *gpuSet) list() []*gpuState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*gpuState, 0, len(s.m))
	for _, g := range s.m {
		out = append(out, g)
	}
	return out
}

// ticking calls f every period, and at once whenever wake delivers (nil: never), until ctx ends or f returns false.
// The watchers beside the loop run on it.
func ticking(ctx context.Context, period time.Duration, wake <-chan struct{}, f func() bool) {
	tk := time.NewTicker(period)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		case <-wake:
		}
		if !f() {
			return
		}
	}
}

// New becomes the leader of opts.RunDir: lock, open (or create) the table, record the GPUs and start MPS. A table of
// another ABI version or a corrupt one is refused (the error wraps table.ErrVersionMismatch or table.ErrCorrupt)
// and left untouched.
func New(opts Options) (*Scheduler, error) {
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	t, lead, err := takeLead(opts)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{opts: opts, t: t, lead: lead, loop: newLoop(), stats: ledger{tenants: map[string]*TenantStats{}}}
	po := s.conf.set(opts.Config)
	m := opts.MPS
	if m == nil {
		m = &mps.Manager{Paths: t.Paths(), Control: opts.Config.MPS.Control, Simulated: opts.SimulatedGPU}
	}
	s.mpsw = newMPSWatcher(m, t, &s.stats.Stats, opts.MPSCheckEvery)
	s.setExclusive() // before the MPS daemons start: their servers then hold the GPUs' only contexts
	for _, g := range t.GPUs() {
		s.gpus.add(s.startGPU(g))
	}
	// Recorded last, so that a leader seen in the table has its GPUs' modes set up.
	t.SetPolicy(po.Kind.ID())
	t.SetPageMounts(opts.Config.Tenants.PageMountsFor(opts.RunDir))
	li, err := t.SetLeader(os.Getpid())
	if err != nil {
		_ = lead.release(t)
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	logrus.WithFields(logrus.Fields{"run_dir": opts.RunDir, "epoch": li.Epoch, "gpus": len(s.gpus.list()),
		"policy": po.Kind}).Info("scheduler leads")
	return s, nil
}

// startGPU brings up MPS for one GPU and records the mode; the temporal token state is resumed from the table.
func (s *Scheduler) startGPU(g table.GPUState) *gpuState {
	gs := &gpuState{index: g.Index}
	gs.mode.Store(table.ModeTemporal)
	gs.token.resume(s.t.ReadToken(g.Index))
	s.mpsw.start(gs, g.UUID, s.conf.get().MPS.Enable)
	return gs
}

// Table returns the scheduler's table mapping.
func (s *Scheduler) Table() *table.Table { return s.t }

// Config returns the configuration in force.
func (s *Scheduler) Config() config.Config { return s.conf.get() }

// Reload swaps in a new configuration (SIGHUP). A configuration that fails validation is refused and the old one
// stays. Running tenants are not disturbed: the next pass decides with the new policy from their current grants.
func (s *Scheduler) Reload(c config.Config) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("reload refused, previous configuration kept: %w", err)
	}
	po := s.conf.set(c)
	s.t.SetPolicy(po.Kind.ID())
	s.t.SetPageMounts(c.Tenants.PageMountsFor(s.t.Paths().Dir))
	s.stats.Reloads.Add(1)
	s.t.RingDoorbell()
	logrus.WithField("policy", po.Kind).Info("configuration reloaded")
	return nil
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
		// Run has returned, so the MPS watcher no longer touches the daemons.
		s.mpsw.stopIdle(s.t.List(), s.gpus.list())
	}
	return err
}
