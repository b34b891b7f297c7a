package table

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Grant is what the scheduler grants a tenant: SM groups of its GPU's split (spatial mode) or the right to run
// when holding the GPU's time token (temporal mode).
type Grant struct {
	Groups uint64 // bit i = group i of the GPU's split
	SMs    uint32 // SMs in Groups
	Mode   uint32 // ModeSpatial, ModeTemporal, ModeUnrestricted, or ModeNone (nothing granted yet)
	Epoch  uint32 // grant_epoch after the change (set by ReadGrant; ignored by PublishGrant)
	Ns     uint64 // CLOCK_MONOTONIC of publication (set by PublishGrant)
	Gen    uint32 // PublishGrant: the slot generation this grant is for (0 = whatever holds the slot)
}

// ErrGrantBusy is returned by ReadGrant when the grant stayed mid-write for the whole bounded retry (a leader
// that died while writing); callers keep their previous grant (fail-static).
var ErrGrantBusy = errors.New("grant is being written")

// PublishGrant writes slot's grant (scheduler leader only): seqlock odd, fields, seqlock even, then grant_epoch+1
// and a futex wake on grant_epoch for clients blocked waiting for SMs or a token. With g.Gen set, the grant is
// published only if the slot still holds that generation (a grant computed for a tenant that has since been
// replaced is dropped with an error).
func (t *Table) PublishGrant(slot int, g Grant) error {
	if err := t.mustWrite("publish grant"); err != nil {
		return err
	}
	if slot < 0 || slot >= MaxContainers {
		return fmt.Errorf("publish grant: slot %d out of range 0..%d", slot, MaxContainers-1)
	}
	c := t.Container(slot)
	held := lockGrant(c)
	// Checked with the seqlock held: registration resets a slot's grant under the same lock, so a grant for a
	// departed tenant can never land on its successor.
	st, gen := atomic.LoadUint32(&c.State), atomic.LoadUint32(&c.Gen)
	if st != SlotActive || (g.Gen != 0 && g.Gen != gen) {
		unlockGrant(c, held)
		return fmt.Errorf("publish grant: slot %d is not active with generation %d (state %d, generation %d)", slot, g.Gen, st, gen)
	}
	writeGrant(c, g)
	unlockGrant(c, held)
	atomic.AddUint32(&c.GrantEpoch, 1)
	if gpu := int(c.GPU); gpu >= 0 && gpu < MaxGPUs {
		atomic.AddUint64(&t.GPU(gpu).GrantChanges, 1)
	}
	_, _ = FutexWake(&c.GrantEpoch, wakeAll)
	return nil
}

// SetGate writes slot's dispatch gate (scheduler leader only): the library lets a tenant keep at most depth
// kernels, of about budgetUs microseconds of estimated run time, in flight per stream; depth 0 lifts the gate.
// Written before the grant it goes with, whose epoch bump makes clients look at it.
func (t *Table) SetGate(slot int, depth, budgetUs uint32) error {
	if err := t.mustWrite("set gate"); err != nil {
		return err
	}
	if slot < 0 || slot >= MaxContainers {
		return fmt.Errorf("set gate: slot %d out of range 0..%d", slot, MaxContainers-1)
	}
	c := t.Container(slot)
	atomic.StoreUint32(&c.GateBudgetUs, budgetUs)
	atomic.StoreUint32(&c.GateDepth, depth)
	return nil
}

// SetNarrow writes how many groups of slot's grant its memory-bound kernels run on (scheduler leader only; 0: the
// whole grant). The library classifies a kernel by its shared memory (libdetshare ds_narrow.c). Written before the
// grant it goes with; the library also reads it at every launch on a partial grant.
func (t *Table) SetNarrow(slot int, groups uint32) error {
	if err := t.mustWrite("set narrow"); err != nil {
		return err
	}
	if slot < 0 || slot >= MaxContainers {
		return fmt.Errorf("set narrow: slot %d out of range 0..%d", slot, MaxContainers-1)
	}
	atomic.StoreUint32(&t.Container(slot).NarrowGroups, groups)
	return nil
}

// Narrow reads slot's narrow_groups.
func (t *Table) Narrow(slot int) uint32 {
	if slot < 0 || slot >= MaxContainers {
		return 0
	}
	return atomic.LoadUint32(&t.Container(slot).NarrowGroups)
}

// SLOReport is what the SLO controller last decided for a latency-critical tenant (informational).
type SLOReport struct {
	GivenBack uint32 // SM groups of its expansion given to lower tiers while it is busy
	State     uint32 // SLO* bits
	WindowUs  uint32 // P99 of the last window
	FloorUs   uint32 // P99 at the most protective share, 0 when not measured
}

// SetSLOReport publishes slot's SLO controller state for status, top and metrics.
func (t *Table) SetSLOReport(slot int, r SLOReport) error {
	if err := t.mustWrite("set SLO report"); err != nil {
		return err
	}
	if slot < 0 || slot >= MaxContainers {
		return fmt.Errorf("set SLO report: slot %d out of range 0..%d", slot, MaxContainers-1)
	}
	c := t.Container(slot)
	atomic.StoreUint32(&c.SLOGivenBack, r.GivenBack)
	atomic.StoreUint32(&c.SLOWindowUs, r.WindowUs)
	atomic.StoreUint32(&c.SLOFloorUs, r.FloorUs)
	atomic.StoreUint32(&c.SLOState, r.State)
	return nil
}

// SLOReportOf reads slot's SLO controller state.
func (t *Table) SLOReportOf(slot int) SLOReport {
	if slot < 0 || slot >= MaxContainers {
		return SLOReport{}
	}
	c := t.Container(slot)
	return SLOReport{GivenBack: atomic.LoadUint32(&c.SLOGivenBack), State: atomic.LoadUint32(&c.SLOState),
		WindowUs: atomic.LoadUint32(&c.SLOWindowUs), FloorUs: atomic.LoadUint32(&c.SLOFloorUs)}
}

// Gate reads slot's dispatch gate.
func (t *Table) Gate(slot int) (depth, budgetUs uint32) {
	if slot < 0 || slot >= MaxContainers {
		return 0, 0
	}
	c := t.Container(slot)
	return atomic.LoadUint32(&c.GateDepth), atomic.LoadUint32(&c.GateBudgetUs)
}

// publishGrant is the registrar's reset of a slot's grant (under the seqlock's writer lock).
func publishGrant(c *Container, g Grant) {
	held := lockGrant(c)
	writeGrant(c, g)
	unlockGrant(c, held)
	atomic.AddUint32(&c.GrantEpoch, 1)
}

func writeGrant(c *Container, g Grant) {
	atomic.StoreUint64(&c.GrantGroups, g.Groups)
	atomic.StoreUint32(&c.GrantSMs, g.SMs)
	atomic.StoreUint32(&c.GrantMode, g.Mode)
	atomic.StoreUint64(&c.GrantNs, MonotonicNs())
}

// grantTakeover is how long a grant may stay mid-write before another writer decides its writer died. Writing a
// grant takes nanoseconds; only a dead (or stopped) writer holds it this long.
var grantTakeover = 500 * time.Millisecond

// lockGrant makes grant_seq odd for this writer (CAS even -> odd, so the scheduler and a registrar never write
// at once) and returns the odd value it holds. A grant left odd longer than grantTakeover is taken over.
func lockGrant(c *Container) uint32 {
	var oddSince time.Time
	for i := 0; ; i++ {
		s := atomic.LoadUint32(&c.GrantSeq)
		if s&1 == 0 {
			if atomic.CompareAndSwapUint32(&c.GrantSeq, s, s+1) {
				return s + 1
			}
			continue
		}
		if oddSince.IsZero() {
			oddSince = time.Now()
		} else if time.Since(oddSince) > grantTakeover && atomic.CompareAndSwapUint32(&c.GrantSeq, s, s+2) {
			return s + 2
		}
		if i%64 == 63 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// unlockGrant makes grant_seq even again, unless another writer took the grant over meanwhile (then the
// sequence has moved on and must not go back).
func unlockGrant(c *Container, held uint32) {
	atomic.CompareAndSwapUint32(&c.GrantSeq, held, held+1)
}

// grantReadTries bounds the seqlock retry loop so a reader never spins forever on a dead writer.
const grantReadTries = 1 << 12

// ReadGrant reads slot's grant with the seqlock: a handful of atomic loads, no locks, no syscalls. Hot loops use
// LoadGrant on a cached *Container, which inlines (about 2 ns against about 20 ns for this form).
func (t *Table) ReadGrant(slot int) (Grant, error) {
	if uint(slot) >= MaxContainers {
		return Grant{}, fmt.Errorf("read grant: slot %d out of range 0..%d", slot, MaxContainers-1)
	}
	return ReadContainerGrant(t.Container(slot))
}

// ReadContainerGrant is ReadGrant on an entry pointer (what a client caches).
func ReadContainerGrant(c *Container) (g Grant, err error) {
	if !LoadGrant(c, &g) {
		return Grant{}, ErrGrantBusy
	}
	return g, nil
}

// LoadGrant is the cheapest grant read: it fills *g under the seqlock and returns false only when the grant
// stayed mid-write for the whole bounded retry (keep the previous grant then).
func LoadGrant(c *Container, g *Grant) bool {
	for i := 0; i < grantReadTries; i++ {
		s1 := atomic.LoadUint32(&c.GrantSeq)
		if s1&1 != 0 {
			continue
		}
		g.Epoch = atomic.LoadUint32(&c.GrantEpoch)
		g.Groups = atomic.LoadUint64(&c.GrantGroups)
		g.SMs = atomic.LoadUint32(&c.GrantSMs)
		g.Mode = atomic.LoadUint32(&c.GrantMode)
		g.Ns = atomic.LoadUint64(&c.GrantNs)
		if atomic.LoadUint32(&c.GrantSeq) == s1 {
			return true
		}
	}
	return false
}

// GrantEpoch is the fast-path check: one atomic load; a client re-reads its grant only when this changed.
func (t *Table) GrantEpoch(slot int) uint32 { return atomic.LoadUint32(&t.Container(slot).GrantEpoch) }

// WaitGrantChange blocks until slot's grant epoch differs from seen, at most timeout. It returns whether it changed.
func (t *Table) WaitGrantChange(slot int, seen uint32, timeout time.Duration) (bool, error) {
	if uint(slot) >= MaxContainers {
		return false, fmt.Errorf("wait grant: slot %d out of range 0..%d", slot, MaxContainers-1)
	}
	return waitChange(&t.Container(slot).GrantEpoch, seen, timeout)
}

// Token is the temporal-mode token of one GPU.
type Token struct {
	Holder     int    // slot holding the token, -1 for none
	HolderGen  uint32 // that slot's generation
	DeadlineNs uint64 // CLOCK_MONOTONIC end of the quantum
	Seq        uint32 // token_seq (futex word)
}

// PublishToken hands GPU gpu's token to slot (or to nobody with slot -1) until deadlineNs (scheduler leader only).
// Holder fields are written before token_seq is bumped, so a waiter woken by the bump sees the new holder.
func (t *Table) PublishToken(gpu, slot int, deadlineNs uint64) error {
	if err := t.mustWrite("publish token"); err != nil {
		return err
	}
	if gpu < 0 || gpu >= MaxGPUs || slot < -1 || slot >= MaxContainers {
		return fmt.Errorf("publish token: gpu %d (allowed 0..%d) or slot %d (allowed -1..%d) out of range", gpu, MaxGPUs-1, slot, MaxContainers-1)
	}
	e := t.GPU(gpu)
	var gen uint32
	if slot >= 0 {
		gen = atomic.LoadUint32(&t.Container(slot).Gen)
	}
	atomic.StoreUint32(&e.TokenHolder, 0) // readers that race see "nobody", never a half-written holder
	atomic.StoreUint32(&e.TokenHolderGen, gen)
	atomic.StoreUint64(&e.TokenDeadlineNs, deadlineNs)
	atomic.StoreUint32(&e.TokenHolder, uint32(slot+1))
	atomic.AddUint32(&e.TokenSeq, 1)
	_, _ = FutexWake(&e.TokenSeq, wakeAll)
	return nil
}

// ReadToken reads GPU gpu's token.
func (t *Table) ReadToken(gpu int) Token {
	e := t.GPU(gpu)
	seq := atomic.LoadUint32(&e.TokenSeq)
	return Token{Seq: seq, Holder: int(atomic.LoadUint32(&e.TokenHolder)) - 1,
		HolderGen: atomic.LoadUint32(&e.TokenHolderGen), DeadlineNs: atomic.LoadUint64(&e.TokenDeadlineNs)}
}

// WaitToken blocks until GPU gpu's token_seq differs from seen, at most timeout, and returns the token then
// (Seq == seen means it timed out).
// A temporal-mode client loops on it with its own overall bound and runs unthrottled past it (fail-static).
func (t *Table) WaitToken(gpu int, seen uint32, timeout time.Duration) (Token, error) {
	if gpu < 0 || gpu >= MaxGPUs {
		return Token{}, fmt.Errorf("wait token: gpu %d out of range 0..%d", gpu, MaxGPUs-1)
	}
	if _, err := waitChange(&t.GPU(gpu).TokenSeq, seen, timeout); err != nil {
		return Token{}, err
	}
	return t.ReadToken(gpu), nil
}
