package table

import (
	"errors"
	"fmt"
	"iter"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// ErrExists is returned (wrapped) by Register when the ID is already registered; the existing registration is
// returned with it, so callers that retry (a hook run twice) can treat it as success.
var ErrExists = errors.New("tenant already registered")

// ErrNotFound is returned (wrapped) by Deregister and Lookup-based helpers when no active tenant has the ID.
var ErrNotFound = errors.New("tenant not registered")

// ErrFull is returned (wrapped) by Register when every slot is in use.
var ErrFull = errors.New("table full")

// RegisterRequest is one tenant's registration. Quota fields are already resolved and admitted values
// (cgroupgpu/quota); the table stores them as given.
type RegisterRequest struct {
	ID       string
	Tier     Tier
	Role     Role
	GPU      int    // GPU index
	Weight   uint32 // >= 1
	SMGroups uint32 // guaranteed groups (0 for best-effort)
	SMs      uint32 // guaranteed SMs after rounding
	MemLimit uint64 // bytes, 0 = unlimited
	Lend     bool
	Pinned   bool   // latency-critical: exactly its guarantee (DS_CF_PINNED)
	SLOP99Us uint32 // latency target in microseconds, 0 = none
	// OwnerPID makes this a host tenant (`detshare run`), reaped when that process dies. 0 for containers.
	OwnerPID int

	// Check runs under the registration lock, before a slot is reserved, with every active registration as
	// admission reads it (Active: the quota fields, read in place from the table; an ID only when asked for). It may
	// fill in the placement and quota fields of req (GPU, SMGroups, SMs, MemLimit); an error refuses the
	// registration. This is where admission runs, so that two registrations cannot both be admitted into the same
	// free capacity. active is valid only until Check returns.
	Check func(active *Active, req *RegisterRequest) error
	// Prepare runs under the lock with the slot RESERVED and the client page created (e.g. to write the quota
	// files in Paths.TenantDir). An error rolls the registration back; a crash is rolled back by the next
	// registration.
	Prepare func(reg Registration) error
}

// Registration is a snapshot of an active (or, inside Prepare, reserved) slot.
type Registration struct {
	Slot         int
	Gen          uint32
	ID           string
	Tier         Tier
	Role         Role
	GPU          int
	Weight       uint32
	SMGroups     uint32
	SMs          uint32
	MemLimit     uint64
	Flags        uint32
	SLOP99Us     uint32 // latency target (µs), 0 = none
	OwnerPID     int
	OwnerStart   uint64
	RegisteredNs uint64 // CLOCK_REALTIME
	State        uint32

	ClientPagePath string
	TenantDir      string
}

// HostTenant tells whether the registration belongs to `detshare run` (reaped when its owner dies).
func (r Registration) HostTenant() bool { return r.Flags&FlagHostTenant != 0 }

// Register registers a tenant: FREE -> RESERVED -> (client page, Prepare) -> ACTIVE, all under flock(table.lock).
// Returns the existing registration and an error wrapping ErrExists when the ID is already active.
func (t *Table) Register(req RegisterRequest) (Registration, error) {
	if err := t.mustWrite("register"); err != nil {
		return Registration{}, err
	}
	if err := ValidateID(req.ID); err != nil {
		return Registration{}, fmt.Errorf("register: %w", err)
	}
	if err := validateRequest(req); err != nil {
		return Registration{}, fmt.Errorf("register %s: %w", req.ID, err)
	}
	var ownerStart uint64
	if req.OwnerPID != 0 {
		st, err := ProcStartTime(req.OwnerPID)
		if err != nil {
			return Registration{}, fmt.Errorf("register %s: owner pid %d: %w", req.ID, req.OwnerPID, err)
		}
		ownerStart = st
	}
	unlock, err := lockFile(t.paths.Lock())
	if err != nil {
		return Registration{}, fmt.Errorf("register %s: %w", req.ID, err)
	}
	defer unlock()
	t.recoverLocked()

	// Host tenants whose owner died: while a scheduler leads, its reaper frees them within reap_every, so a
	// registration reaps them only when they stand in its way (their ID is taken, the table is full, or admission
	// refuses). Reaping reads /proc for every host tenant, which made each registration cost grow with the tenants
	// (0.3 ms for the 1st, 4.8 ms for the 256th, issue 28). With no scheduler alive nobody else would: reap now.
	if !t.leaderReaps() {
		t.reapDeadTenantsLocked(nil)
	}
	var free int
	active := &Active{t: t}
	for attempt := 0; ; attempt++ {
		var err error
		free, err = t.placeLocked(req, active)
		if err == nil && req.Check != nil {
			if err = req.Check(active, &req); err == nil {
				if err = validateRequest(req); err != nil {
					err = fmt.Errorf("register %s: %w", req.ID, err)
				}
			}
		}
		if err == nil && free < 0 {
			err = fmt.Errorf("register %s: %w: all %d slots are in use", req.ID, ErrFull, MaxContainers)
		}
		if err == nil {
			break
		}
		if attempt == 0 && len(t.reapDeadTenantsLocked(nil)) > 0 {
			continue
		}
		if errors.Is(err, ErrExists) {
			return t.snapshot(free), err
		}
		return Registration{}, err
	}

	c := t.Container(free)
	atomic.StoreUint32(&c.State, SlotReserved)
	gen := atomic.AddUint32(&c.Gen, 1)
	putCString(c.ID[:], req.ID)
	c.Tier, c.Role, c.GPU, c.Weight = uint32(req.Tier), uint32(req.Role), int32(req.GPU), req.Weight
	c.SMGroupsReq, c.SMReq, c.MemLimit = req.SMGroups, req.SMs, req.MemLimit
	c.RegisteredNs = uint64(time.Now().UnixNano())
	c.OwnerPID, c.OwnerStart = uint64(req.OwnerPID), ownerStart
	c.Flags = 0
	if req.Lend {
		c.Flags |= FlagLend
	}
	if req.OwnerPID != 0 {
		c.Flags |= FlagHostTenant
	}
	if req.Pinned {
		c.Flags |= FlagPinned
	}
	atomic.StoreUint32(&c.SLOP99Us, req.SLOP99Us)
	atomic.StoreUint32(&c.GateDepth, 0)
	atomic.StoreUint32(&c.GateBudgetUs, 0)
	atomic.StoreUint32(&c.NarrowGroups, 0)
	atomic.StoreUint32(&c.SLOState, 0)
	atomic.StoreUint32(&c.SLOGivenBack, 0)
	atomic.StoreUint32(&c.SLOWindowUs, 0)
	atomic.StoreUint32(&c.SLOFloorUs, 0)
	c.DemandSeenNs = 0
	// A new tenant starts with nothing granted; epoch and seq stay monotonic across generations so a stale
	// reader never mistakes the new grant for the one it cached.
	publishGrant(c, Grant{Mode: ModeNone})

	reg := t.snapshot(free)
	rollback := func() {
		t.releaseSlotLocked(free)
	}
	if err := t.createClientPage(reg); err != nil {
		rollback()
		return Registration{}, fmt.Errorf("register %s: %w", req.ID, err)
	}
	if req.Prepare != nil {
		if err := req.Prepare(reg); err != nil {
			rollback()
			return Registration{}, err
		}
	}
	atomic.StoreUint32(&c.State, SlotActive)
	atomic.AddUint64(&t.Header().Generation, 1)
	reg.State = SlotActive
	logrus.WithFields(logrus.Fields{"id": req.ID, "slot": free, "gen": gen}).Debug("tenant registered")
	return reg, nil
}

// leaderReaps tells whether a scheduler is recorded as leader and its process is alive (one read of /proc): its
// reaper reaps dead host tenants, so registrations need not.
func (t *Table) leaderReaps() bool {
	l := t.Leader()
	return l.PID != 0 && HostProcessAlive(l.PID, l.StartTime)
}

// placeLocked finds the first free slot for req (-1: none) and records the active slots in active. An ID already
// active is an error wrapping ErrExists, with free set to its slot. One pass over the slot array's states; an active
// slot's ID is compared in place, and nothing is copied or allocated per slot (issue 28: a Registration with its ID
// as a new string for every active slot made the n-th registration cost grow with n).
func (t *Table) placeLocked(req RegisterRequest, active *Active) (int, error) {
	free := -1
	active.reset()
	for slot := 0; slot < MaxContainers; slot++ {
		c := t.Container(slot)
		switch atomic.LoadUint32(&c.State) {
		case SlotActive:
			if cStringIs(c.ID[:], req.ID) {
				return slot, fmt.Errorf("register %s: %w in slot %d (generation %d)", req.ID, ErrExists, slot,
					atomic.LoadUint32(&c.Gen))
			}
			active.add(slot)
		case SlotFree:
			if free < 0 {
				free = slot
			}
		}
	}
	return free, nil
}

// Active is the active registrations as a registration's admission check (RegisterRequest.Check) sees them: the
// slots found active by the registration's scan, under the registration lock, whose fields are read in place from
// the table's mapping when enumerated. Nothing is copied per slot until asked for, so that admitting the 256th
// tenant costs what admitting the 1st does (issue 28). Valid only while Check runs (the lock is held and the table
// mapped); the fields cannot change meanwhile, since every writer of a slot takes the same lock.
type Active struct {
	t    *Table
	bits [MaxContainers / 64]uint64
	n    int
}

// ActiveSlot is one active registration's admission fields (from the table, which tenants cannot write).
type ActiveSlot struct {
	Slot     int
	Tier     Tier
	Role     Role
	GPU      int
	SMGroups uint32 // guaranteed groups
	SMs      uint32 // guaranteed SMs
	MemLimit uint64 // bytes, 0 = unlimited
	c        *Container
}

// ID reads the slot's tenant ID (a new string: callers ask for it to explain a refusal, not to admit). Only while
// the Check that got the slot runs.
func (s ActiveSlot) ID() string { return cString(s.c.ID[:]) }

func (a *Active) reset() { a.bits, a.n = [MaxContainers / 64]uint64{}, 0 }

func (a *Active) add(slot int) { a.bits[slot/64] |= 1 << (slot % 64); a.n++ }

// Len is the number of active registrations.
func (a *Active) Len() int { return a.n }

// All enumerates the active registrations in slot order.
func (a *Active) All() iter.Seq[ActiveSlot] {
	return func(yield func(ActiveSlot) bool) {
		for w, word := range a.bits {
			for word != 0 {
				slot := w*64 + bits.TrailingZeros64(word)
				word &= word - 1
				c := a.t.Container(slot)
				if !yield(ActiveSlot{Slot: slot, Tier: Tier(c.Tier), Role: Role(c.Role), GPU: int(c.GPU),
					SMGroups: c.SMGroupsReq, SMs: c.SMReq, MemLimit: c.MemLimit, c: c}) {
					return
				}
			}
		}
	}
}

func validateRequest(r RegisterRequest) error {
	switch {
	case r.Tier > TierLatencyCritical:
		return fmt.Errorf("tier %d: allowed %d..%d", r.Tier, TierBestEffort, TierLatencyCritical)
	case r.Role > RoleDecode:
		return fmt.Errorf("role %d: allowed %d..%d", r.Role, RoleNone, RoleDecode)
	case r.GPU < 0 || r.GPU >= MaxGPUs:
		return fmt.Errorf("gpu %d: allowed 0..%d", r.GPU, MaxGPUs-1)
	case r.Weight == 0:
		return fmt.Errorf("weight 0: must be >= 1")
	case r.SMGroups > MaxSMGroups:
		return fmt.Errorf("sm groups %d: allowed 0..%d", r.SMGroups, MaxSMGroups)
	case r.OwnerPID < 0:
		return fmt.Errorf("owner pid %d: must be >= 0", r.OwnerPID)
	}
	return nil
}

// Deregister removes tenant id: slot DRAINING, client page and tenant directory removed, slot FREE.
func (t *Table) Deregister(id string) error {
	if err := t.mustWrite("deregister"); err != nil {
		return err
	}
	if err := ValidateID(id); err != nil {
		return fmt.Errorf("deregister: %w", err)
	}
	unlock, err := lockFile(t.paths.Lock())
	if err != nil {
		return fmt.Errorf("deregister %s: %w", id, err)
	}
	defer unlock()
	t.recoverLocked()
	for slot := 0; slot < MaxContainers; slot++ {
		c := t.Container(slot)
		if atomic.LoadUint32(&c.State) == SlotActive && cStringIs(c.ID[:], id) {
			atomic.StoreUint32(&c.State, SlotDraining)
			t.releaseSlotLocked(slot)
			logrus.WithFields(logrus.Fields{"id": id, "slot": slot}).Debug("tenant deregistered")
			return nil
		}
	}
	return fmt.Errorf("deregister %s: %w", id, ErrNotFound)
}

// releaseSlotLocked removes a RESERVED or DRAINING slot's files and frees it. Files are removed only when no
// active slot has the same ID (a half-written ID must never delete another tenant's files).
func (t *Table) releaseSlotLocked(slot int) {
	c := t.Container(slot)
	id := cString(c.ID[:])
	if ValidateID(id) == nil && !t.activeIDLocked(id, slot) {
		unmountPage(t.paths.ClientPage(id)) // its own tmpfs (HeaderFlagPageMounts) goes with it
		if err := os.Remove(t.paths.ClientPage(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			logrus.WithError(err).WithField("id", id).Warn("remove client page")
		}
		if err := os.RemoveAll(t.paths.TenantDir(id)); err != nil {
			logrus.WithError(err).WithField("id", id).Warn("remove tenant directory")
		}
	}
	// Clear the ID first (byte 0), so a crash from here on leaves an empty ID, not a prefix of it.
	c.ID[0] = 0
	for i := range c.ID {
		c.ID[i] = 0
	}
	c.Tier, c.Role, c.GPU, c.Weight, c.SMGroupsReq, c.SMReq, c.MemLimit = 0, 0, 0, 0, 0, 0, 0
	c.OwnerPID, c.OwnerStart, c.Flags, c.RegisteredNs = 0, 0, 0, 0
	publishGrant(c, Grant{Mode: ModeNone})
	atomic.StoreUint32(&c.State, SlotFree)
	atomic.AddUint64(&t.Header().Generation, 1)
}

func (t *Table) activeIDLocked(id string, except int) bool {
	for s := 0; s < MaxContainers; s++ {
		if s == except {
			continue
		}
		c := t.Container(s)
		if atomic.LoadUint32(&c.State) == SlotActive && cStringIs(c.ID[:], id) {
			return true
		}
	}
	return false
}

// recoverLocked rolls back registrations and completes deregistrations left by a process that died holding the
// lock: with the lock held, no live process can own a RESERVED or DRAINING slot.
func (t *Table) recoverLocked() int {
	n := 0
	defer func() {
		// Temporaries of client pages are only written under the lock, with the slot RESERVED: any left now belong
		// to a dead registrar, whose slot was found above. Without one there is none to look for (a registration
		// no longer lists the clients directory, which grows with the tenants).
		if n == 0 {
			return
		}
		if tmps, err := filepath.Glob(filepath.Join(t.paths.ClientsDir(), ".*.tmp-*")); err == nil {
			for _, f := range tmps {
				unmountPage(f) // a page's staging tmpfs (createMountedPage)
				_ = os.RemoveAll(f)
			}
		}
	}()
	for slot := 0; slot < MaxContainers; slot++ {
		c := t.Container(slot)
		switch st := atomic.LoadUint32(&c.State); st {
		case SlotReserved, SlotDraining:
			logrus.WithFields(logrus.Fields{"slot": slot, "state": st, "id": cString(c.ID[:])}).
				Info("recovering a slot left by a registrar that died")
			t.releaseSlotLocked(slot)
			n++
		}
	}
	return n
}

// Recover takes the registration lock and cleans up after dead registrars (see recoverLocked). It returns the
// number of slots recovered. Register and Deregister do this themselves; the scheduler calls it at start.
func (t *Table) Recover() (int, error) {
	if err := t.mustWrite("recover"); err != nil {
		return 0, err
	}
	unlock, err := lockFile(t.paths.Lock())
	if err != nil {
		return 0, fmt.Errorf("recover: %w", err)
	}
	defer unlock()
	return t.recoverLocked(), nil
}

// snapshot reads slot's registration fields (callers hold the lock, or use List/Lookup which re-check).
func (t *Table) snapshot(slot int) Registration {
	c := t.Container(slot)
	id := cString(c.ID[:])
	return Registration{
		Slot: slot, Gen: atomic.LoadUint32(&c.Gen), ID: id, Tier: Tier(c.Tier), Role: Role(c.Role), GPU: int(c.GPU),
		Weight: c.Weight, SMGroups: c.SMGroupsReq, SMs: c.SMReq, MemLimit: c.MemLimit, Flags: c.Flags,
		SLOP99Us: atomic.LoadUint32(&c.SLOP99Us),
		OwnerPID: int(c.OwnerPID), OwnerStart: c.OwnerStart, RegisteredNs: c.RegisteredNs,
		State:          atomic.LoadUint32(&c.State),
		ClientPagePath: t.paths.ClientPage(id), TenantDir: t.paths.TenantDir(id),
	}
}

// stableSnapshot reads an active slot without the lock: state and generation are re-checked after the fields,
// so a slot that changed meanwhile is reported as not active.
func (t *Table) stableSnapshot(slot int) (Registration, bool) {
	c := t.Container(slot)
	if atomic.LoadUint32(&c.State) != SlotActive {
		return Registration{}, false
	}
	gen := atomic.LoadUint32(&c.Gen)
	r := t.snapshot(slot)
	if atomic.LoadUint32(&c.State) != SlotActive || atomic.LoadUint32(&c.Gen) != gen || r.Gen != gen {
		return Registration{}, false
	}
	return r, true
}

// List returns the active registrations.
func (t *Table) List() []Registration {
	var out []Registration
	for slot := 0; slot < MaxContainers; slot++ {
		if r, ok := t.stableSnapshot(slot); ok {
			out = append(out, r)
		}
	}
	return out
}

// Lookup returns the active registration of id.
func (t *Table) Lookup(id string) (Registration, bool) {
	for slot := 0; slot < MaxContainers; slot++ {
		if r, ok := t.stableSnapshot(slot); ok && r.ID == id {
			return r, true
		}
	}
	return Registration{}, false
}

func (t *Table) createClientPage(reg Registration) error {
	b := make([]byte, ClientPageSize)
	copy(b, clientPageHeader(reg))
	cp := (*ClientPage)(unsafe.Pointer(&b[0]))
	now := MonotonicNs()
	for i := range cp.Procs {
		cp.Procs[i].HeartbeatNs = now // see ReapDeadProcesses: a stuck claim is judged by heartbeat age
	}
	if err := os.MkdirAll(t.paths.ClientsDir(), ClientsDirMode); err != nil {
		return fmt.Errorf("create clients directory: %w", err)
	}
	if err := t.writePage(reg.ClientPagePath, b); err != nil {
		return fmt.Errorf("create client page: %w", err)
	}
	return nil
}

// ReapDeadTenants deregisters host tenants (`detshare run`) whose owner process died, and returns their IDs.
func (t *Table) ReapDeadTenants() ([]string, error) { return t.reapDeadTenants(nil) }

// reapDeadTenants is ReapDeadTenants judging owners by ps (nil: by /proc/<pid>/stat).
func (t *Table) reapDeadTenants(ps *ProcSet) ([]string, error) {
	if err := t.mustWrite("reap tenants"); err != nil {
		return nil, err
	}
	unlock, err := lockFile(t.paths.Lock())
	if err != nil {
		return nil, fmt.Errorf("reap tenants: %w", err)
	}
	defer unlock()
	t.recoverLocked()
	return t.reapDeadTenantsLocked(ps), nil
}

// reapDeadTenantsLocked deregisters the host tenants whose owner died (lock held) and returns their IDs.
// With ps (a walk of /proc taken beside the scheduler's loop) an owner's liveness is a lookup in it; with nil it is
// a read of /proc/<pid>/stat per host tenant (registration, when it has to reap, see Register).
func (t *Table) reapDeadTenantsLocked(ps *ProcSet) []string {
	var ids []string
	for slot := 0; slot < MaxContainers; slot++ {
		c := t.Container(slot)
		if atomic.LoadUint32(&c.State) != SlotActive || c.Flags&FlagHostTenant == 0 {
			continue
		}
		if ps != nil && !ps.HostDead(int(c.OwnerPID), c.OwnerStart) ||
			ps == nil && HostProcessAlive(int(c.OwnerPID), c.OwnerStart) {
			continue
		}
		id := cString(c.ID[:])
		// The owner (`detshare run`) died, but the command it started may live on (kill -9 of the owner does not
		// reach it). Freeing the slot now would let a newcomer reuse it while the orphan still runs on it: the slot
		// is kept until the last of its processes is gone (issue 13 item 5).
		if n := t.liveProcessesLocked(slot, id, ps); n > 0 {
			if _, seen := orphansLogged.LoadOrStore([2]uint32{uint32(slot), atomic.LoadUint32(&c.Gen)}, true); !seen {
				logrus.WithFields(logrus.Fields{"id": id, "slot": slot, "owner_pid": c.OwnerPID, "processes": n}).
					Warn("owner of host tenant died; its slot is kept until its remaining processes exit")
			}
			continue
		}
		logrus.WithFields(logrus.Fields{"id": id, "slot": slot, "owner_pid": c.OwnerPID}).
			Info("reaping host tenant whose owner died")
		atomic.StoreUint32(&c.State, SlotDraining)
		t.releaseSlotLocked(slot)
		ids = append(ids, id)
	}
	return ids
}

// orphansLogged holds the (slot, generation) pairs whose kept-for-orphans warning this process already logged.
var orphansLogged sync.Map

// liveProcessesLocked counts the processes of slot's client page that are still alive and really belong to the
// tenant (a page that cannot be read counts as none: nothing can be proven to use the slot). The entries are written
// by the tenant, so an entry counts only for a live process that maps this very page (MapsFile): 64 entries naming
// host PID 2, or any process of the host, keep no slot (issue 27). ps is a recent walk of /proc (nil: walked here
// when an entry needs it).
func (t *Table) liveProcessesLocked(slot int, id string, ps *ProcSet) int {
	if ValidateID(id) != nil {
		return 0
	}
	var st unix.Stat_t
	if err := unix.Stat(t.paths.ClientPage(id), &st); err != nil {
		return 0
	}
	cl, err := OpenClientPageReadOnly(t.paths.ClientPage(id))
	if err != nil {
		return 0
	}
	defer cl.Close()
	c := t.Container(slot)
	var entries []ProcIdentity
	_ = Guard("processes of "+id, func() {
		pg := cl.Page()
		if pg.Slot != uint32(slot) || pg.SlotGen != atomic.LoadUint32(&c.Gen) {
			return
		}
		for i := range pg.Procs {
			p := &pg.Procs[i]
			if st := atomic.LoadUint32(&p.State); st != ProcLive && st != ProcClaiming {
				continue
			}
			entries = append(entries, ProcIdentity{NSPid: atomic.LoadUint32(&p.NSPid),
				PidNSIno: atomic.LoadUint64(&p.PidNSIno), StartTime: atomic.LoadUint64(&p.StartTime),
				HostPID: atomic.LoadUint64(&p.HostPID)})
		}
	})
	n, fresh := 0, false
	for _, e := range entries {
		pid := 0
		if e.HostPID != 0 {
			if HostProcessAlive(int(e.HostPID), e.StartTime) {
				pid = int(e.HostPID)
			}
		} else {
			var ok bool
			if ps != nil {
				pid, ok = ps.HostPID(e)
			}
			if !ok && !fresh {
				// not in the walk the caller gave (it may have started since): walk /proc now, once per call
				if ps, err = ScanProcesses(); err != nil {
					return 1 // cannot tell: never reap on doubt
				}
				fresh = true
				pid, _ = ps.HostPID(e)
			}
		}
		if pid != 0 && MapsFile(pid, uint64(st.Dev), st.Ino) {
			n++
		}
	}
	return n
}
