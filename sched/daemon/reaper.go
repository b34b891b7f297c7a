package daemon

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
)

// The reaper: housekeeping that must never delay a grant (issue 28). Every reap_every it checks that the table is
// still the one this leader opened, repairs a damaged doorbell and damaged client pages (issue 27), walks /proc once and applies that walk: dead
// registrars' slots, host tenants whose owner died (judged by the walk's start times, not a read per tenant) and
// dead processes' entries in every client page (mapped once per registration and kept, table.Reaper), then publishes
// each GPU's pressure from those pages for gpu=auto placement. It runs on
// its own goroutine and owns all of that state. Its results reach the decision loop the way every tenant's do:
// through the table (a freed slot moves the generation, a freed entry the page's demand) and the doorbell, which
// it rings when it changed anything. The loop never waits for it and never takes its lock on the way.

// scanProcesses walks /proc; a variable so that a test can make the walk slow.
var scanProcesses = table.ScanProcesses

// reapStarting is called by the reaper after its walk of /proc and before it applies it; a test blocks in it to
// show that the loop answers doorbells while the reaper is stuck.
var reapStarting = func() {}

// reapLoop runs housekeeping at once and then every reap_every until ctx ends.
func (s *Scheduler) reapLoop(ctx context.Context) {
	r := s.t.NewReaper()
	defer r.Close()
	round := func() bool {
		if err := table.Guard("reaper", func() { s.housekeep(r) }); err != nil {
			s.lead.truncated(err)
		}
		if s.lead.err() != nil {
			s.t.RingDoorbell() // wake the loop so that it steps down now
			return false
		}
		return true
	}
	if !round() {
		return
	}
	ticking(ctx, s.Config().Scheduler.ReapEvery.Duration, nil, round)
}

// housekeep is one reaper round.
func (s *Scheduler) housekeep(r *table.Reaper) {
	if !s.lead.stillOurs() {
		return
	}
	// A doorbell a tenant truncated within its first page, chmodded or scribbled over faults nobody, so only this
	// check notices it (issue 27).
	if fixed, err := s.t.RepairDoorbell(); err != nil {
		logrus.WithError(err).Warn("doorbell damaged and not repaired; waiting by timeout")
	} else if fixed {
		logrus.Warn("doorbell was damaged by a tenant (size, mode or magic); repaired")
		s.t.RingDoorbell()
	}
	// A client page written past its end (it would fill the run directory's filesystem), truncated, chmodded or with
	// its identity overwritten: put back from the table's copy. libdetshare refuses a process that starts on such a
	// page, so this is what lets the tenant's next processes run again (issue 27).
	fixedPages, perr := s.t.RepairClientPages()
	if perr != nil {
		logrus.WithError(perr).Warn("client page damaged and not repaired")
	}
	for _, fp := range fixedPages {
		logrus.WithFields(logrus.Fields{"id": fp.ID, "size_found": fp.Size, "mode": fp.Mode, "header": fp.Header}).
			Warn("client page was damaged by its tenant; repaired")
	}
	if n := s.enforceMemoryOutside(); n > 0 {
		s.stats.MemoryKills.Add(uint64(n))
	}
	ps, err := scanProcesses()
	if err != nil {
		logrus.WithError(err).Warn("scan of /proc failed; reaping slots only")
		ps = nil
	}
	reapStarting()
	rep, err := r.Pass(ps)
	// gpu=auto placement reads this instead of every tenant's page (issue 28); after the pass, without the dead
	r.PublishPressure(time.Now())
	if err != nil {
		logrus.WithError(err).Warn("reap pass failed")
		return
	}
	n := uint64(rep.Processes + len(rep.Tenants) + rep.Recovered)
	if n == 0 {
		return
	}
	s.stats.Reaped.Add(n)
	logrus.WithFields(logrus.Fields{"tenants": rep.Tenants, "processes": rep.Processes,
		"bytes": rep.BytesCredited, "recovered": rep.Recovered}).Info("reaped")
	s.t.RingDoorbell() // the loop decides again at once: demand withdrawn, guarantees freed
}
