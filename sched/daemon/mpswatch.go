package daemon

import (
	"fmt"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/sched/table"
)

// orphanChecks is how many consecutive MPS checks a client must match no live tenant process before it is
// terminated: a process may reach the MPS server a moment before its library attaches to the client page.
const orphanChecks = 3

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
