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
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/sched/config"
	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/metrics"
	"github.com/detshare/detshare/sched/mps"
	"github.com/detshare/detshare/sched/policy"
	"github.com/detshare/detshare/sched/table"
)

// Options configure a scheduler.
type Options struct {
	RunDir string
	Config config.Config
	// Discover lists the host's GPUs (sched/gpuinfo.DiscoverHost in production). Nil: keep what the table knows.
	Discover func() ([]table.GPUInfo, error)
	// MPS manages the control daemons; nil builds one from Config.MPS (simulated when the simulated GPU is selected).
	MPS *mps.Manager
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
		s.mps = &mps.Manager{Paths: t.Paths(), Control: opts.Config.MPS.Control, Simulated: table.SimGPUSelected(os.Environ())}
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
