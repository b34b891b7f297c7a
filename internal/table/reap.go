package table

import (
	"fmt"

	"github.com/sirupsen/logrus"
)

// ReapReport says what one Reap pass cleaned up.
type ReapReport struct {
	Recovered     int      // slots left RESERVED/DRAINING by dead registrars
	Tenants       []string // host tenants whose owner died, deregistered
	Processes     int      // process entries of dead processes freed
	BytesCredited uint64   // device memory credited back by those entries
}

// Reap is the reaper's whole pass: recover dead registrars' slots, deregister host tenants whose owner died, then
// scan /proc once and free the process entries of dead processes in every active tenant's client page, crediting
// their memory.
func (t *Table) Reap() (ReapReport, error) {
	ps, err := ScanProcesses()
	if err != nil {
		return ReapReport{}, fmt.Errorf("reap: %w", err)
	}
	return t.ReapWith(ps)
}

// ReapWith is Reap with a scan of /proc taken earlier (nil: no process entries are freed this pass). The walk of
// /proc takes milliseconds (2.4 ms with 64 processes, more on a GPU host full of workers), so the scheduler takes it
// beside its decision loop and applies it here; a process that started after the scan is never taken for dead
// (ProcSet.Dead).
func (t *Table) ReapWith(ps *ProcSet) (ReapReport, error) {
	var rep ReapReport
	if err := t.mustWrite("reap"); err != nil {
		return rep, err
	}
	n, err := t.Recover()
	if err != nil {
		return rep, err
	}
	rep.Recovered = n
	if rep.Tenants, err = t.ReapDeadTenants(); err != nil {
		return rep, err
	}
	if ps == nil {
		return rep, nil
	}
	for _, reg := range t.List() {
		cl, err := OpenClientPage(reg.ClientPagePath)
		if err != nil {
			// Deregistered meanwhile, or damaged: nothing to credit; the next pass sees the new state.
			logrus.WithError(err).WithField("id", reg.ID).Debug("reap: client page")
			continue
		}
		var np int
		var b uint64
		// The tenant may truncate its page at any moment (even between the size check and here): Guard.
		err = Guard("reap "+reg.ID, func() {
			if cl.Page().Slot == uint32(reg.Slot) && cl.Page().SlotGen == reg.Gen {
				np, b = cl.ReapDeadProcesses(ps)
			}
		})
		cl.Close()
		if err != nil {
			logrus.WithError(err).WithField("id", reg.ID).Warn("reap: client page truncated by its tenant")
			continue
		}
		rep.Processes += np
		rep.BytesCredited += b
		if np > 0 {
			logrus.WithFields(logrus.Fields{"id": reg.ID, "processes": np, "bytes": b}).Info("reaped dead processes")
		}
	}
	return rep, nil
}
