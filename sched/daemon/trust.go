package daemon

// What a tenant says about itself is a hint (docs/threat-model-quota.md): its client page is writable by every one
// of its processes, and its weight and tier come from labels or flags it chose. The scheduler checks the demand
// against the counters the library increments and bounds weight and tier by the host's ceilings (config
// [tenants]) before the policy sees them.

import (
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
)

// demandState is what the scheduler remembers of a tenant's counters between passes.
type demandState struct {
	gen   uint32
	sig   uint64    // sum of the counters the library increments
	moved time.Time // when sig last changed
	// warned: a ceiling was applied to this registration (logged once)
	warned bool
}

// demandBook is what the loop remembers of each slot's counters between passes (slot -> state).
type demandBook map[int]*demandState

// of returns reg's state, new when the slot changed hands: a new tenant inherits nothing of the previous one.
func (b demandBook) of(reg table.Registration) *demandState {
	st := b[reg.Slot]
	if st == nil || st.gen != reg.Gen {
		st = &demandState{gen: reg.Gen}
		b[reg.Slot] = st
	}
	return st
}

func (b demandBook) forget(live map[int]bool) {
	for slot := range b {
		if !live[slot] {
			delete(b, slot)
		}
	}
}

// observed returns the demand the scheduler believes: the page's demand bounded by the number of live
// processes that say they are busy, and 0 unless the library's counters (launches, busy time, queued work of the
// tenant's processes) moved within the demand window. An idle tenant writing demand=1000 into its page therefore
// gets nothing; one that forges moving counters gets what a real busy tenant of its weight gets, no more.
func (b demandBook) observed(reg table.Registration, pg *table.ClientPage, now time.Time, window time.Duration) uint32 {
	claimed := atomic.LoadUint32(&pg.Demand)
	if claimed == 0 {
		// idle: nothing to check. The counters seen last stay as they were, so the first pass that sees demand
		// again compares against them (a tenant that launched since is believed at once, a forger is not).
		return 0
	}
	sig := atomic.LoadUint64(&pg.Launches) + atomic.LoadUint64(&pg.BusyNs)
	var busyProcs uint32
	for i := range pg.Procs {
		p := &pg.Procs[i]
		if atomic.LoadUint32(&p.State) != table.ProcLive {
			continue
		}
		sig += atomic.LoadUint64(&p.Launches) + atomic.LoadUint64(&p.BusyNs) + atomic.LoadUint64(&p.Queued)
		if atomic.LoadUint32(&p.Busy) != 0 {
			busyProcs++
		}
	}
	st := b.of(reg)
	if sig != st.sig {
		st.sig, st.moved = sig, now
	}
	if claimed > busyProcs {
		claimed = busyProcs
	}
	if claimed == 0 || st.moved.IsZero() || now.Sub(st.moved) > window {
		return 0
	}
	return claimed
}

// ceilingTier is the tier ceiling of t (parsed once per pass).
func ceilingTier(t config.Tenants) table.Tier {
	maxTier, err := table.ParseTier(t.MaxTier)
	if err != nil { // validated at load; keep the most restrictive reading of a bad value
		maxTier = table.TierBestEffort
	}
	return maxTier
}

// ceilings applies the host's weight and tier ceilings (maxTier = ceilingTier(t)) to a registration unless the
// host trusts the tenant.
func (b demandBook) ceilings(reg table.Registration, t config.Tenants, maxTier table.Tier) table.Registration {
	if reg.Weight <= t.MaxWeight && (!reg.Tier.Valid() || reg.Tier <= maxTier) {
		return reg // within the ceilings: nothing to apply, trusted or not
	}
	if t.Trusts(reg.ID) {
		return reg
	}
	orig := reg
	if reg.Weight > t.MaxWeight {
		reg.Weight = t.MaxWeight
	}
	if reg.Tier.Valid() && reg.Tier > maxTier { // an invalid tier is scheduled as best-effort anyway (toPolicy)
		reg.Tier = maxTier
		if reg.Tier == table.TierBestEffort {
			reg.SMGroups = 0 // best-effort has no guarantee
		}
	}
	if reg != orig {
		st := b.of(reg)
		if !st.warned {
			st.warned = true
			logrus.WithFields(logrus.Fields{"id": reg.ID, "weight": orig.Weight, "tier": orig.Tier,
				"max_weight": t.MaxWeight, "max_tier": t.MaxTier}).Warn(
				"tenant asked for more than the host's ceiling without consent (tenants.trusted); scheduled at the ceiling")
		}
	}
	return reg
}

// applyMemCap sets the MPS server-side per-client memory limit of g to the largest memory quota of the tenants on
// it (none while any of them is unlimited). A client cannot raise a server-side limit, so a process that bypasses
// the library still cannot take more than that; one limit per server is what MPS offers (every tenant shares the
// GPU's server), so the per-tenant sum is the library's job (docs/threat-model-quota.md). MPS watcher only.
func (w *mpsWatcher) applyMemCap(g *gpuState) {
	var limit uint64
	for _, r := range w.t.List() {
		if r.GPU != g.index {
			continue
		}
		if r.MemLimit == 0 {
			limit = 0
			break
		}
		if r.MemLimit > limit {
			limit = r.MemLimit
		}
	}
	if g.mps.memSet && g.mps.memCap == limit {
		return
	}
	var total uint64
	for _, st := range w.t.GPUs() {
		if st.Index == g.index {
			total = st.MemTotal
		}
	}
	if err := w.mgr.SetClientMemLimit(g.mps.daemon, limit, total); err != nil {
		logrus.WithError(err).WithField("gpu", g.index).Warn("MPS server-side memory limit not set")
		return
	}
	g.mps.memCap, g.mps.memSet = limit, true
	logrus.WithFields(logrus.Fields{"gpu": g.index, "bytes": limit}).Debug("MPS server-side per-client memory limit")
}
