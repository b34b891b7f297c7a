package policy

import (
	"math/bits"
	"slices"

	"github.com/detshare/detshare/internal/table"
)

// Decide computes the spatial grants of tenants on a GPU whose split has groupSMs[i] SMs in group i. Each step
// computes one thing from what the steps before it decided; the reasons are written last, from the decision, so
// that what a tenant is told is what it got. It allocates its buffers afresh; the scheduler's loop uses a Decider.
func Decide(groupSMs []uint32, tenants []Tenant, o Options) Decision {
	var dc Decider
	return dc.Decide(groupSMs, tenants, o)
}

// Decider decides one GPU pass after pass without allocating once its buffers have grown to the number of tenants
// (issue 28: a pass allocated about 1.3 KB per tenant): the steps' slices are reused and the reasons, which are
// made of few distinct strings, are kept in a cache. The Decision it returns (its slices) is valid until its next
// Decide. It decides exactly what Decide decides (TestDeciderMatchesGolden). Not safe for concurrent use.
type Decider struct {
	p       pass
	reasons reasonCache
	sized   []Tenant // sizeReserves' copy
}

// Decide is Decide with the Decider's buffers.
func (dc *Decider) Decide(groupSMs []uint32, tenants []Tenant, o Options) Decision {
	tenants = sizeReserves(len(groupSMs), tenants, o, &dc.sized)
	p := &dc.p
	p.reset(groupSMs, tenants, o, &dc.reasons)
	p.placeGuarantees()
	p.findThrottle()
	p.shareBusy()
	p.grantGroups()
	p.describe()
	return p.d
}

// sizeReserves turns each Sized latency-critical tenant into a pinned partition of ReserveOf groups (a copy in *buf,
// reused: the caller's tenants are not changed). Without a Sized tenant it returns tenants as they are.
func sizeReserves(nGroups int, tenants []Tenant, o Options, buf *[]Tenant) []Tenant {
	sized := false
	for _, t := range tenants {
		sized = sized || (t.Sized && t.Tier == table.TierLatencyCritical && !t.Pinned)
	}
	if !sized {
		return tenants
	}
	out := append((*buf)[:0], tenants...)
	*buf = out
	guaranteed, lower := 0, 0
	for _, t := range tenants {
		switch {
		case t.Tier != table.TierLatencyCritical:
			lower++
			if t.Tier == table.TierBurstable {
				guaranteed += max(t.Guarantee, 0)
			}
		default:
			guaranteed += max(t.Guarantee, 0)
		}
	}
	for i, t := range out {
		if !t.Sized || t.Tier != table.TierLatencyCritical || t.Pinned {
			continue
		}
		out[i].Guarantee = ReserveOf(t, min(nGroups, 64), guaranteed-max(t.Guarantee, 0), lower, o)
		out[i].Pinned, out[i].Shrink, out[i].overlap = true, 0, o.LCOverlap
		guaranteed += out[i].Guarantee - max(t.Guarantee, 0)
	}
	return out
}

// pass is one Decide: its inputs and what each step has decided so far (slices aligned with tenants).
type pass struct {
	groupSMs []uint32 // the split, at most 64 groups
	tenants  []Tenant
	o        Options
	all      uint64 // every group of the split
	order    []int  // tenants in priority order (lessPriority)

	// placeGuarantees
	guar      []uint64 // the groups each guarantee is placed on
	exclusive uint64   // union of d.Exclusive
	shared    uint64   // the groups nobody holds exclusively: idle lenders' guarantees and the unguaranteed rest

	// findThrottle
	lcAny    bool // a latency-critical tenant shares the GPU (busy or idle, sized, pinned or not)
	widen    int  // the least NarrowWiden of those tenants
	lcBusy   bool // a latency-critical tenant is busy
	sloMiss  bool // ... and above its SLO
	throttle bool // lower tiers keep only their floor
	floor    int  // the groups a throttled lower tier keeps
	gate     Gate // every lower tier's dispatch gate

	// shareBusy
	got      []uint64 // what each busy borrower runs on besides its exclusive guarantee
	busyUsed uint64   // union of got

	// idleOffer, computed the first time it is needed
	wakeFloors      uint64
	wakeFloorsKnown bool

	// othersPrev: the groups at least one tenant held, and those at least two held
	prevAny, prevMany uint64

	d Decision

	// buffers reused from one Decide to the next (Decider); prio is what order was sorted from
	prio             []prioSig
	busy, lower, exp []int
	sc               shareScratch
	zero, more       []uint64
	reasons          *reasonCache
}

// reset starts a Decide: the split capped at the 64 groups a mask holds, and the tenants in priority order,
// since guarantees and shares are placed highest priority first and ties go to the earlier tenant. Every slice
// of the previous Decide is reused, cleared.
func (p *pass) reset(groupSMs []uint32, tenants []Tenant, o Options, rc *reasonCache) {
	n := min(len(groupSMs), 64)
	all := ^uint64(0)
	if n < 64 {
		all = (uint64(1) << n) - 1
	}
	nt := len(tenants)
	order, prio := p.order, p.prio
	if !samePriorities(prio, tenants, o.Kind) {
		// The order depends only on tier, role, slot and the kind: a pass whose tenants changed only in demand or
		// held groups (nearly every pass) keeps the previous order instead of sorting again.
		order, prio = resize(order, nt), resize(prio, nt)
		for i := range order {
			order[i] = i
			prio[i] = prioSig{tenants[i].Tier, tenants[i].Role, tenants[i].Slot, o.Kind}
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case lessPriority(tenants[a], tenants[b], o.Kind):
				return -1
			case lessPriority(tenants[b], tenants[a], o.Kind):
				return 1
			}
			return 0
		})
	}
	var prevAny, prevMany uint64
	for i := range tenants {
		prevMany |= prevAny & tenants[i].Prev
		prevAny |= tenants[i].Prev
	}
	*p = pass{groupSMs: groupSMs[:n], tenants: tenants, o: o, all: all, order: order, prio: prio,
		guar: resize(p.guar, nt), got: resize(p.got, nt), prevAny: prevAny, prevMany: prevMany,
		d:    Decision{Grants: resize(p.d.Grants, nt), Exclusive: resize(p.d.Exclusive, nt)},
		busy: p.busy[:0], lower: p.lower[:0], exp: p.exp[:0], sc: p.sc, zero: resize(p.zero, nt),
		more: resize(p.more, nt), reasons: rc}
}

// prioSig is what a tenant's place in the priority order depends on (lessPriority).
type prioSig struct {
	tier table.Tier
	role table.Role
	slot int
	kind Kind
}

// samePriorities tells whether tenants under kind have the signatures prio was made from.
func samePriorities(prio []prioSig, tenants []Tenant, kind Kind) bool {
	if len(prio) != len(tenants) || prio == nil {
		return false
	}
	for i := range tenants {
		if prio[i] != (prioSig{tenants[i].Tier, tenants[i].Role, tenants[i].Slot, kind}) {
			return false
		}
	}
	return true
}

// resize returns s with length n and every element zero, reusing its array when it is large enough.
func resize[T any](s []T, n int) []T {
	if s == nil || cap(s) < n {
		return make([]T, n) // never nil: a Decision of no tenants has empty, not nil, slices
	}
	s = s[:n]
	clear(s)
	return s
}

// othersPrev is the union of the groups the tenants other than i held.
func (p *pass) othersPrev(i int) uint64 {
	return p.prevMany | (p.prevAny &^ p.tenants[i].Prev)
}

// placeGuarantees places the guarantees of burstable and latency-critical tenants, in priority order, so that
// when groups run short the lower priorities are cut. Sticky, because moving a tenant costs a migration at its next
// kernel boundary: first the groups only it held (an idle expanding latency-critical tenant also holds groups
// others use), then the rest of what it held, then the lowest free ones. A guarantee is exclusive while its tenant
// is busy, and always for a latency-critical tenant that does not lend; the rest is shared.
func (p *pass) placeGuarantees() {
	var taken uint64
	for _, i := range p.order {
		t := p.tenants[i]
		if t.Guarantee <= 0 || t.Tier == table.TierBestEffort {
			continue
		}
		m := pick(t.Prev&p.all&^taken&^p.othersPrev(i), 0, t.Guarantee)
		m |= pick(t.Prev&p.all&^taken&^m, p.all&^taken&^m, t.Guarantee-bits.OnesCount64(m))
		p.guar[i] = m
		taken |= m
		if t.Busy || (t.Tier == table.TierLatencyCritical && !t.Lend) {
			p.exclusive |= m
			p.d.Exclusive[i] = m
		}
	}
	p.shared = p.all &^ p.exclusive
}

// findThrottle decides whether lower tiers are throttled to their floor: a busy latency-critical tenant needs their
// groups now, and near the board's power limit one that is present needs a high SM clock when it wakes. Their gate
// bounds what they have in flight whenever their groups may be taken back at any moment (throttled, or beside a
// latency-critical tenant that expands or lends), so that a reclaim is bounded from its first kernel; it is the
// tightest near the power limit or while a latency-critical tenant is above its SLO. A pinned latency-critical
// tenant is a static partition: it runs on exactly its guarantee, busy or idle, so it throttles nobody and its
// neighbours keep the complement at full depth (gated only where it lends and so may take groups back).
func (p *pass) findThrottle() {
	lcPresent, reclaims := false, false
	for _, t := range p.tenants {
		if t.Tier != table.TierLatencyCritical {
			continue
		}
		if !p.lcAny || t.NarrowWiden < p.widen {
			p.widen = max(t.NarrowWiden, 0)
		}
		p.lcAny = true
		reclaims = reclaims || !t.Pinned || t.Lend
		if t.Pinned {
			continue
		}
		lcPresent = true
		p.lcBusy = p.lcBusy || t.Busy
		p.sloMiss = p.sloMiss || (t.Busy && t.SLOMiss)
	}
	p.throttle = p.lcBusy || (p.o.PowerNearLimit && lcPresent)
	p.floor = p.o.throttledFloor(p.lcBusy)
	p.gate = dispatchGate(p.o, p.throttle || reclaims, p.throttle && (p.o.PowerNearLimit || p.sloMiss))
}

// shareBusy gives the shared groups (idle tenants' lent guarantees included) to the busy borrowers: by weight, or,
// while lower tiers are throttled, their floor to them and the rest to the busy latency-critical tenants. A pinned
// latency-critical tenant does not borrow.
func (p *pass) shareBusy() {
	busy := p.busy
	for _, i := range p.order {
		if p.tenants[i].Busy && borrows(p.tenants[i]) {
			busy = append(busy, i)
		}
	}
	p.busy = busy
	if p.throttle {
		p.shareThrottled(busy)
	} else {
		p.shareByWeight(busy)
	}
	for _, m := range p.got {
		p.busyUsed |= m
	}
}

// shareByWeight splits the shared groups among the busy borrowers by weight, their exclusive guarantees counted in
// their share (nobody latency-critical is busy, so this is burstable and best-effort borrowing). Under
// Options.ShareOverlap it does not split them: each busy borrower is granted all of them.
func (p *pass) shareByWeight(busy []int) {
	if p.o.ShareOverlap {
		// every busy borrower runs on every shared group; MPS interleaves their blocks as the SMs free up
		for _, i := range busy {
			p.got[i] |= p.shared
		}
		return
	}
	extra := p.sc.shareCounts(bits.OnesCount64(p.shared)+sumGuaranteeBits(p.guar, busy, p.d.Exclusive), busy, p.tenants, p.guar, p.o)
	for _, i := range busy {
		extra[i] = max(0, extra[i]-bits.OnesCount64(p.guar[i]&p.d.Exclusive[i]))
	}
	place(p.tenants, busy, extra, p.shared, p.got)
}

// shareThrottled serves the busy latency-critical tenants (or the power limit): lower tiers keep their floor, the
// latency-critical tenants expand over the rest, and what SLO sizing gives back goes to the lower tiers.
func (p *pass) shareThrottled(busy []int) {
	lower, exp := p.lower, p.exp
	for _, i := range busy {
		if p.tenants[i].Tier == table.TierLatencyCritical {
			exp = append(exp, i)
		} else {
			lower = append(lower, i)
		}
	}
	p.lower, p.exp = lower, exp
	free := p.keepFloors(lower, p.shared)
	if len(exp) == 0 {
		return // power only: what lower tiers do not keep stays idle
	}
	free = p.expand(exp, free)
	if free == 0 || len(lower) == 0 {
		return
	}
	p.giveBack(lower, free)
}

// keepFloors gives each busy lower tier its floor (its exclusive guarantee counted) out of free, on the highest
// groups it held, so that the groups it keeps are the ones an idle latency-critical tenant was not offered. It
// returns what is left.
func (p *pass) keepFloors(lower []int, free uint64) uint64 {
	for _, i := range lower {
		m := floorGroups(p.tenants[i], free, max(0, p.floor-bits.OnesCount64(p.guar[i]&p.d.Exclusive[i])))
		p.got[i] |= m
		free &^= m
	}
	return free
}

// expand gives the busy latency-critical tenants what lower tiers do not keep, split by weight with their
// guarantees counted, less what each gives back because its latency is well inside its SLO (Tenant.Shrink), so
// that their latency approaches their latency alone on the whole GPU. It returns what is left.
func (p *pass) expand(exp []int, free uint64) uint64 {
	extra := p.sc.shareCounts(bits.OnesCount64(free)+sumGuaranteeBits(p.guar, exp, p.d.Exclusive), exp, p.tenants, p.guar, p.o)
	for _, i := range exp {
		extra[i] = max(0, extra[i]-bits.OnesCount64(p.guar[i]&p.d.Exclusive[i])-max(p.tenants[i].Shrink, 0))
	}
	return place(p.tenants, exp, extra, free, p.got)
}

// giveBack shares the groups SLO sizing gave back among the busy lower tiers by weight: the point of giving them
// back is that throughput work uses them.
func (p *pass) giveBack(lower []int, free uint64) {
	back := p.sc.shareCounts(bits.OnesCount64(free), lower, p.tenants, p.zero, p.o)
	more := p.more
	place(p.tenants, lower, back, free, more)
	for _, i := range lower {
		p.got[i] |= more[i]
	}
}

// grantGroups sets each tenant's groups, gate and SMs. A busy tenant runs on its exclusive guarantee and what it
// got; an idle one with a guarantee keeps it (lent or not, so that its next kernel starts at once); an idle lower
// tier while throttled is offered its floor; any other idle tenant keeps what it had of the shared groups or is
// offered all of them: it runs nothing, so overlap costs nothing until it wakes.
func (p *pass) grantGroups() {
	uniform := len(p.groupSMs) > 0
	for _, x := range p.groupSMs {
		uniform = uniform && x == p.groupSMs[0]
	}
	for i, t := range p.tenants {
		g := &p.d.Grants[i]
		switch {
		case t.Busy:
			g.Groups = (p.guar[i] & p.d.Exclusive[i]) | p.got[i]
		case p.guar[i] != 0:
			g.Groups = p.guar[i]
			if t.Tier == table.TierLatencyCritical && !t.Pinned {
				g.Groups |= p.idleOffer(i)
			}
		case p.throttle && t.Tier != table.TierLatencyCritical:
			g.Groups = p.idleFloor(t)
		default:
			g.Groups = t.Prev & p.shared
			if g.Groups == 0 {
				g.Groups = p.shared
			}
		}
		if t.overlap {
			// its partition (Exclusive) and, shared, everything its neighbours run on; never another tenant's
			// exclusive groups (a busy burstable guarantee, another partition)
			g.Groups = p.all &^ (p.exclusive &^ p.d.Exclusive[i])
		}
		if t.Tier != table.TierLatencyCritical {
			g.Gate = p.gate
			if n := p.o.NarrowGroups + p.widen; p.lcAny && p.o.NarrowGroups > 0 && bits.OnesCount64(g.Groups) > n {
				g.Narrow = uint32(n)
			}
		}
		g.SMs = groupsSMs(g.Groups, p.groupSMs, uniform)
	}
}

// idleOffer is what an idle latency-critical tenant that expands is offered beyond its guarantee: every group nobody
// else holds exclusively, so that the first kernel (or graph) of its next request starts on the whole width (its
// blocks take the groups lower tiers are using as their kernels drain under the dispatch gate, while the scheduler
// shrinks them). But never the groups a lower tier will keep as its floor when this tenant turns busy: a kernel of
// the first request with more blocks than free SMs would wait for a floor kernel, which runs for long on so few SMs
// (seen on the H100 as a +5..9 ms tail).
func (p *pass) idleOffer(i int) uint64 {
	if !p.wakeFloorsKnown {
		p.wakeFloors, p.wakeFloorsKnown = p.floorsAtWake(), true
	}
	return p.all &^ (p.exclusive &^ p.d.Exclusive[i]) &^ p.guar[i] &^ p.wakeFloors
}

// floorsAtWake are the groups lower tiers (busy, or idle holding groups) would keep as their floor if a
// latency-critical tenant turned busy: chosen as keepFloors will choose them then.
//
// What SLO sizing gives back (Tenant.Shrink) stays with them too, split evenly here (giveBack splits it by weight
// among the busy ones; an offer only needs to avoid their groups, not to match it exactly).
func (p *pass) floorsAtWake() uint64 {
	shrink, lower := 0, 0
	for _, u := range p.tenants {
		switch {
		case u.Tier == table.TierLatencyCritical && !u.Pinned:
			shrink += max(u.Shrink, 0)
		case u.Tier != table.TierLatencyCritical && (u.Busy || u.Prev != 0):
			lower++
		}
	}
	each := p.o.throttledFloor(true)
	if lower > 0 {
		each += (shrink + lower - 1) / lower
	}
	var floors uint64
	for j, u := range p.tenants {
		if u.Tier != table.TierLatencyCritical && (u.Busy || u.Prev != 0) {
			floors |= floorGroups(u, p.shared&^floors, max(0, each-bits.OnesCount64(p.guar[j]&p.d.Exclusive[j])))
		}
	}
	return floors
}

// idleFloor is what an idle lower tier is offered while throttled: its floor, where no busy tenant runs if
// possible, so that waking costs nobody a group.
func (p *pass) idleFloor(t Tenant) uint64 {
	if m := pick(t.Prev&p.shared&^p.busyUsed, p.shared&^p.busyUsed, p.floor); m != 0 {
		return m
	}
	return pick(t.Prev&p.shared, p.shared, p.floor)
}

// groupsSMs is the number of SMs in groups.
func groupsSMs(groups uint64, groupSMs []uint32, uniform bool) uint32 {
	if uniform {
		return uint32(bits.OnesCount64(groups)) * groupSMs[0]
	}
	var sms uint32
	for b := groups; b != 0; b &= b - 1 {
		sms += groupSMs[bits.TrailingZeros64(b)]
	}
	return sms
}

// describe writes each grant's reason (shown by `detshare top` and logs) from the decision made. Each reason is
// chosen as a reasonKey (which sentence, with which numbers) and formatted once per distinct key (reasonCache).
func (p *pass) describe() {
	why := p.throttleWhy()
	for i, t := range p.tenants {
		g := &p.d.Grants[i]
		var cut reasonKey // zero: the guarantee was placed in full (or there is none)
		if t.Guarantee > 0 && t.Tier != table.TierBestEffort && bits.OnesCount64(p.guar[i]) < t.Guarantee {
			cut = reasonKey{site: reasonCut, a: int64(bits.OnesCount64(p.guar[i])), b: int64(t.Guarantee)}
		}
		var k reasonKey
		switch {
		case t.Busy && cut.site != 0:
			k = cut
		case t.Busy:
			k = p.busyWhy(i, why)
		default:
			k = p.idleWhy(i, why, cut)
		}
		g.Reason = p.reasons.text(k)
	}
}

// throttleWhy names what throttles lower tiers (meaningful while p.throttle), as an index into whys.
func (p *pass) throttleWhy() uint8 {
	switch {
	case p.o.PowerNearLimit && !p.lcBusy:
		return whyPower
	case p.o.PowerNearLimit:
		return whyLCPower
	case p.sloMiss:
		return whySLO
	}
	return whyLC
}

// busyWhy is the reason of a busy tenant whose guarantee was placed in full.
func (p *pass) busyWhy(i int, why uint8) reasonKey {
	t, g := p.tenants[i], p.d.Grants[i]
	lower := t.Tier != table.TierLatencyCritical
	switch {
	case p.throttle && lower && g.Groups == 0:
		return reasonKey{site: reasonPaused, why: why}
	case p.throttle && lower:
		return reasonKey{site: reasonThrottled, why: why, a: int64(bits.OnesCount64(g.Groups)), b: int64(p.gate.Depth),
			c: int64(p.gate.Budget)}
	case p.throttle && !t.Pinned && p.got[i] != 0:
		return reasonKey{site: reasonReclaimed, a: int64(bits.OnesCount64(p.guar[i])), b: int64(bits.OnesCount64(p.got[i])),
			c: int64(max(t.Shrink, 0))}
	case !lower && t.Pinned:
		return reasonKey{site: reasonPinned, a: int64(t.Guarantee)}
	}
	k := reasonKey{site: reasonBusy, a: -1, b: int64(bits.OnesCount64(p.got[i])), c: int64(max(t.Weight, 1))}
	if t.Guarantee > 0 && t.Tier != table.TierBestEffort {
		k.a = int64(t.Guarantee)
	}
	if p.o.Kind == TPOTFirst && t.Role == table.RoleDecode {
		k.d = 1
	}
	return k
}

// idleWhy is the reason of an idle tenant; cut, when set, says its guarantee was not placed in full.
func (p *pass) idleWhy(i int, why uint8, cut reasonKey) reasonKey {
	g := p.d.Grants[i]
	switch {
	case p.guar[i] != 0:
		return p.keptWhy(i, cut)
	case p.throttle && p.tenants[i].Tier != table.TierLatencyCritical:
		switch {
		case cut.site != 0:
			return cut
		case p.floor == 0:
			return reasonKey{site: reasonIdlePaused, why: why}
		}
		return reasonKey{site: reasonIdleThrottled, why: why, a: int64(bits.OnesCount64(g.Groups))}
	case g.Groups == 0:
		return reasonKey{site: reasonIdleReserved}
	case cut.site != 0:
		return cut
	}
	return reasonKey{site: reasonIdle}
}

// keptWhy is the reason of an idle tenant that keeps (part of) its guarantee, and what it is offered beyond it:
// a = 0 its guarantee was cut to b of c groups, 1 kept, 2 lent; d = groups offered beyond it.
func (p *pass) keptWhy(i int, cut reasonKey) reasonKey {
	k := reasonKey{site: reasonKept, a: 2}
	switch {
	case cut.site != 0:
		k.a, k.b, k.c = 0, cut.a, cut.b
	case p.d.Exclusive[i] != 0:
		k.a = 1
	}
	k.d = int64(bits.OnesCount64(p.d.Grants[i].Groups &^ p.guar[i]))
	return k
}
