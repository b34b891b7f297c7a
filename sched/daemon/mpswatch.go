package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

// orphanChecks is how many consecutive MPS checks a client must match no live tenant process before it is
// terminated: a process may reach the MPS server a moment before its library attaches to the client page.
const orphanChecks = 3

// mpsWatcher keeps each GPU's MPS control daemon running and its server honest (memory limit, orphan clients,
// faulted servers). Its checks run external commands, so it runs beside the loop, never inside a pass.
type mpsWatcher struct {
	mgr   *mps.Manager
	t     *table.Table
	stats *Stats
	every time.Duration
	// wake: a registration changed, so the memory limits are re-applied at once rather than at the next tick.
	wake chan struct{}
}

// mpsGPU is one GPU's MPS state. Once the GPU is started only the watcher's goroutine touches it (and Main after Run
// returned).
type mpsGPU struct {
	daemon  *mps.Daemon
	orphans map[int]int // MPS client PID -> consecutive checks matching no tenant
	// ended: clients already sent terminate_client (by process identity, so a reused PID is a new client). A client
	// is never sent it twice: a process that does not take the termination (one whose launches libdetshare holds)
	// stays listed, and on the H100 a second terminate_client for it wedged the control daemon, so that no new
	// client of the GPU could connect (integration/gpu/trust.sh, BENCHMARKS.md issue 13).
	ended  map[table.ProcIdentity]int // -> the client's PID
	memCap uint64                     // server-side per-client memory limit applied
	memSet bool                       // memCap is in force (a restarted daemon starts without one)
}

func newMPSWatcher(m *mps.Manager, t *table.Table, stats *Stats, every time.Duration) mpsWatcher {
	if every <= 0 {
		every = time.Second
	}
	return mpsWatcher{mgr: m, t: t, stats: stats, every: every, wake: make(chan struct{}, 1)}
}

// start brings up g's control daemon (adopting a running one) and records the mode it allows; without MPS the GPU
// runs temporal quanta.
func (w *mpsWatcher) start(g *gpuState, uuid string, enabled bool) {
	g.mps.orphans = map[int]int{}
	g.mps.ended = map[table.ProcIdentity]int{}
	if !enabled {
		_ = w.t.SetMPS(g.index, table.MPSAbsent, table.ModeTemporal, "")
		return
	}
	d, err := w.mgr.Start(g.index, uuid)
	switch {
	case err == nil:
		g.mps.daemon = d
		g.mode.Store(table.ModeSpatial)
		_ = w.t.SetMPS(g.index, table.MPSRunning, table.ModeSpatial, d.PipeDir)
		logrus.WithFields(logrus.Fields{"gpu": g.index, "pipe": d.PipeDir, "adopted": d.Adopted,
			"simulated": w.mgr.Simulated}).Info("MPS control daemon running")
	case errors.Is(err, mps.ErrAbsent):
		_ = w.t.SetMPS(g.index, table.MPSAbsent, table.ModeTemporal, "")
		logrus.WithError(err).WithField("gpu", g.index).Warn("MPS unavailable: temporal quanta")
	default:
		_ = w.t.SetMPS(g.index, table.MPSFailed, table.ModeTemporal, "")
		logrus.WithError(err).WithField("gpu", g.index).Error("MPS failed to start: temporal quanta")
	}
}

// notify asks for a check now; a check already pending covers this one.
func (w *mpsWatcher) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run checks every period and on notify until ctx ends. A table truncated under the mapping ends it: lost is told,
// and the loop steps down at its next pass.
func (w *mpsWatcher) run(ctx context.Context, gpus *gpuSet, lost func(error)) {
	ticking(ctx, w.every, w.wake, func() bool {
		if err := table.Guard("MPS check", func() { w.check(gpus.list()) }); err != nil {
			lost(err)
			return false
		}
		return true
	})
}

// check restarts a dead control daemon (tenants on that GPU fall back to temporal meanwhile) and shuts down
// faulted servers once their clients are gone.
func (w *mpsWatcher) check(gpus []*gpuState) {
	for _, g := range gpus {
		if g.mps.daemon == nil {
			continue
		}
		if !w.mgr.Alive(g.mps.daemon) {
			logrus.WithField("gpu", g.index).Warn("MPS control daemon died; restarting it")
			d, err := w.mgr.Start(g.index, g.mps.daemon.UUID)
			if err != nil {
				_ = w.t.SetMPS(g.index, table.MPSFailed, table.ModeTemporal, "")
				g.mode.Store(table.ModeTemporal)
				g.mps.daemon = nil
				logrus.WithError(err).WithField("gpu", g.index).Error("MPS restart failed: temporal quanta")
				continue
			}
			g.mps.daemon = d
			g.mps.memSet = false
			_ = w.t.SetMPS(g.index, table.MPSRunning, table.ModeSpatial, d.PipeDir)
			g.mode.Store(table.ModeSpatial)
			continue
		}
		w.applyMemCap(g)
		if !w.mgr.Simulated {
			w.terminateOrphans(g)
			if _, err := w.mgr.RestartIdleFailedServers(g.mps.daemon); err != nil {
				logrus.WithError(err).WithField("gpu", g.index).Debug("MPS server check")
			}
		}
	}
}

// terminateOrphans asks the MPS server to terminate clients that belong to no live tenant process: leftovers of
// dead containers, which could otherwise wedge the server for every tenant of the GPU. Only DetShare tenants can
// reach this daemon (its pipe directory is private and mounted only into tenants), so such a client is ours to end.
func (w *mpsWatcher) terminateOrphans(g *gpuState) {
	servers, err := w.mgr.Servers(g.mps.daemon)
	if err != nil || len(servers) == 0 {
		return
	}
	known := map[table.ProcIdentity]bool{}
	for _, r := range w.t.List() {
		cl, err := table.OpenClientPageReadOnly(r.ClientPagePath)
		if err != nil {
			continue
		}
		pg := cl.Page()
		_ = table.Guard("MPS clients of "+r.ID, func() { // the tenant may truncate its page meanwhile
			if pg.Slot != uint32(r.Slot) || pg.SlotGen != r.Gen {
				return // not this registration's page (damaged, or a reused slot's): it speaks for no client
			}
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
	orphans := g.mps.orphans
	seen := map[int]bool{}
	for _, srv := range servers {
		clients, err := w.mgr.Clients(g.mps.daemon, srv)
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
				delete(orphans, pid)
				continue
			}
			if _, done := g.mps.ended[id]; done {
				continue
			}
			orphans[pid]++
			if orphans[pid] < orphanChecks {
				continue
			}
			// Sent once whatever the answer: a command that timed out may still be running in the control daemon.
			g.mps.ended[id] = pid
			delete(orphans, pid)
			if _, err := w.mgr.Command(g.mps.daemon, fmt.Sprintf("terminate_client %d %d", srv, pid)); err != nil {
				logrus.WithError(err).WithFields(logrus.Fields{"gpu": g.index, "pid": pid}).Warn(
					"terminate_client failed; not sent again for this client")
				continue
			}
			w.stats.Reaped.Add(1)
			logrus.WithFields(logrus.Fields{"gpu": g.index, "server": srv, "pid": pid}).Warn("MPS client of no live tenant terminated")
		}
	}
	for pid := range orphans {
		if !seen[pid] {
			delete(orphans, pid)
		}
	}
	for id, pid := range g.mps.ended {
		if !seen[pid] {
			delete(g.mps.ended, id)
		}
	}
}

// stopIdle quits the control daemons of GPUs without tenants. Only once the watcher has stopped: it owns the daemons.
func (w *mpsWatcher) stopIdle(regs []table.Registration, gpus []*gpuState) {
	used := map[int]bool{}
	for _, r := range regs {
		used[r.GPU] = true
	}
	for _, g := range gpus {
		if g.mps.daemon == nil {
			continue
		}
		if used[g.index] {
			logrus.WithField("gpu", g.index).Warn("MPS control daemon left running: tenants still use the GPU")
			continue
		}
		if err := w.mgr.Stop(g.mps.daemon); err != nil {
			logrus.WithError(err).WithField("gpu", g.index).Warn("MPS control daemon did not quit")
			continue
		}
		_ = w.t.SetMPS(g.index, table.MPSUnknown, table.ModeNone, "")
		logrus.WithField("gpu", g.index).Info("MPS control daemon stopped")
	}
}
