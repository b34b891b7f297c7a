package table

import (
	"fmt"
	"sync/atomic"

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
// (ProcSet.Dead). One-shot: it maps each client page for this pass only (the scheduler keeps a Reaper).
func (t *Table) ReapWith(ps *ProcSet) (ReapReport, error) {
	r := t.NewReaper()
	defer r.Close()
	return r.Pass(ps)
}

// Reaper is what reaping keeps from one pass to the next: the client pages it has mapped (read-write: it frees
// process entries), each mapped once per registration and kept until its slot changes hands, instead of opened,
// mapped, scanned and unmapped on every pass. Not safe for concurrent use.
type Reaper struct {
	t     *Table
	pages map[int]reaperPage // slot -> page of the generation it was mapped for
}

type reaperPage struct {
	gen uint32
	cl  *Client
}

// NewReaper starts a reaper of t; Close unmaps what it mapped.
func (t *Table) NewReaper() *Reaper { return &Reaper{t: t, pages: map[int]reaperPage{}} }

// Close unmaps the pages the reaper mapped.
func (r *Reaper) Close() {
	for slot := range r.pages {
		r.drop(slot)
	}
}

func (r *Reaper) drop(slot int) {
	if p, ok := r.pages[slot]; ok {
		p.cl.Close()
		delete(r.pages, slot)
	}
}

// page returns reg's client page, mapped on first use; nil when it cannot be mapped or does not name reg's slot
// and generation (a reused slot's previous page must not be reaped for the new tenant).
func (r *Reaper) page(reg Registration) *Client {
	if p, ok := r.pages[reg.Slot]; ok {
		if p.gen == reg.Gen {
			return p.cl
		}
		r.drop(reg.Slot)
	}
	cl, err := OpenClientPage(reg.ClientPagePath)
	if err != nil {
		// Deregistered meanwhile, or damaged: nothing to credit; the next pass sees the new state.
		logrus.WithError(err).WithField("id", reg.ID).Debug("reap: client page")
		return nil
	}
	mine := false
	if err := Guard("reap: client page of "+reg.ID, func() {
		mine = cl.Page().Slot == uint32(reg.Slot) && cl.Page().SlotGen == reg.Gen
	}); err != nil || !mine {
		cl.Close()
		return nil
	}
	r.pages[reg.Slot] = reaperPage{gen: reg.Gen, cl: cl}
	return cl
}

// pageOfSlot returns the client page of slot's active tenant (nil when none, or when it cannot be mapped) and the
// slot's entry. A page already mapped for the slot's generation is used as it is, without
// reading the registration (a pass then allocates nothing for it); otherwise the registration is read (stably)
// and its page mapped.
func (r *Reaper) pageOfSlot(slot int) (*Client, *Container) {
	c := r.t.Container(slot)
	if atomic.LoadUint32(&c.State) != SlotActive {
		return nil, c
	}
	if p, ok := r.pages[slot]; ok && p.gen == atomic.LoadUint32(&c.Gen) {
		return p.cl, c
	}
	reg, ok := r.t.stableSnapshot(slot)
	if !ok {
		return nil, c
	}
	return r.page(reg), c
}

// Pass is one reaping pass: recover dead registrars' slots, deregister host tenants whose owner died (judged by ps
// when given, else by /proc/<pid>/stat), then free the process entries of processes ps proves dead in every active
// tenant's client page, crediting their memory (nil ps: slots only).
func (r *Reaper) Pass(ps *ProcSet) (ReapReport, error) {
	t := r.t
	var rep ReapReport
	if err := t.mustWrite("reap"); err != nil {
		return rep, err
	}
	n, err := t.Recover()
	if err != nil {
		return rep, err
	}
	rep.Recovered = n
	if rep.Tenants, err = t.reapDeadTenants(ps); err != nil {
		return rep, err
	}
	if ps == nil {
		return rep, nil
	}
	var live [MaxContainers]bool
	for slot := 0; slot < MaxContainers; slot++ {
		cl, c := r.pageOfSlot(slot)
		if cl == nil {
			continue
		}
		live[slot] = true
		var np int
		var b uint64
		// The tenant may truncate its page at any moment: Guard, and map it again (size-checked) next pass.
		if err := Guard("reap: client page", func() { np, b = cl.ReapDeadProcesses(ps) }); err != nil {
			logrus.WithError(err).WithField("id", cString(c.ID[:])).Warn("reap: client page truncated by its tenant")
			r.drop(slot)
			continue
		}
		rep.Processes += np
		rep.BytesCredited += b
		if np > 0 {
			logrus.WithFields(logrus.Fields{"id": cString(c.ID[:]), "processes": np, "bytes": b}).Info("reaped dead processes")
		}
	}
	for slot := range r.pages {
		if !live[slot] {
			r.drop(slot)
		}
	}
	return rep, nil
}
