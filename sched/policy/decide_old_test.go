package policy

// decideOld and its helpers are a verbatim copy of Decide as it was before it was split into steps (commit a102816,
// sched/policy/policy.go), renamed with an Old suffix so that TestDecideMatchesOld and FuzzDecideMatchesOld can
// prove that the split changed no decision. The helpers are copied too, so that a later change to a shared helper
// shows up as a difference instead of changing both sides. Do not edit: it is the reference.

import (
	"fmt"
	"math/bits"
	"sort"
)

// throttledFloorOld is the number of groups lower tiers keep while throttled: the floor while a latency-critical tenant
// is busy, at least one under the power throttle alone (nobody is waiting for their SMs then).
func throttledFloorOld(o Options, lcBusy bool) int {
	if lcBusy {
		return max(o.Floor, 0)
	}
	return max(o.Floor, 1)
}

// decideOld computes the spatial grants of tenants on a GPU whose split has groupSMs[i] SMs in group i.
func decideOld(groupSMs []uint32, tenants []Tenant, o Options) Decision {
	n := len(groupSMs)
	if n > 64 {
		n = 64
	}
	all := uint64(0)
	if n == 64 {
		all = ^uint64(0)
	} else {
		all = (uint64(1) << n) - 1
	}
	d := Decision{Grants: make([]Grant, len(tenants)), Exclusive: make([]uint64, len(tenants))}
	guar := make([]uint64, len(tenants))
	exclusive := uint64(0)
	taken := uint64(0)

	// 1. Guarantees, in priority order (tier, then decode first under TPOT-First, then slot): sticky groups first.
	order := make([]int, len(tenants))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lessPriorityOld(tenants[order[a]], tenants[order[b]], o.Kind) })
	for _, i := range order {
		t := tenants[i]
		if t.Guarantee <= 0 || t.Tier == BestEffort {
			continue
		}
		// Sticky: first the groups only it held (an idle expanding LC also holds groups others use), then the rest
		// of what it held, then the lowest free ones.
		m := pickOld(t.Prev&all&^taken&^othersPrevOld(tenants, i), 0, t.Guarantee)
		m |= pickOld(t.Prev&all&^taken&^m, all&^taken&^m, t.Guarantee-bits.OnesCount64(m))
		if bits.OnesCount64(m) < t.Guarantee {
			d.Grants[i].Reason = fmt.Sprintf("guarantee cut to %d of %d groups (not enough groups)", bits.OnesCount64(m), t.Guarantee)
		}
		guar[i] = m
		taken |= m
		if t.Busy || (t.Tier == LatencyCritical && !t.Lend) {
			exclusive |= m
			d.Exclusive[i] = m
		}
	}
	shared := all &^ exclusive

	// Who throttles lower tiers: a busy latency-critical tenant, or the power limit while one is present.
	lcBusy, lcPresent, sloMiss, reclaims := false, false, false, false
	for _, t := range tenants {
		if t.Tier == LatencyCritical {
			lcPresent = true
			lcBusy = lcBusy || t.Busy
			sloMiss = sloMiss || (t.Busy && t.SLOMiss)
			reclaims = reclaims || !t.Pinned || t.Lend
		}
	}
	throttle := lcBusy || (o.PowerNearLimit && lcPresent)

	// 2. The shared part goes to the busy borrowers. A pinned latency-critical tenant does not borrow.
	var busy []int
	for _, i := range order {
		if tenants[i].Busy && borrowsOld(tenants[i]) {
			busy = append(busy, i)
		}
	}
	got := make([]uint64, len(tenants))
	floor := throttledFloorOld(o, lcBusy)
	if throttle {
		decideThrottledOld(tenants, busy, guar, d.Exclusive, shared, got, floor, o)
	} else {
		decideSharedOld(tenants, busy, guar, d.Exclusive, shared, got, o)
	}
	var busyUsed uint64
	for _, m := range got {
		busyUsed |= m
	}
	// The gate bounds what lower tiers have in flight whenever their groups may be taken back at any moment (a
	// latency-critical tenant that expands or lends is present), so that a reclaim is bounded from its first kernel.
	gate := dispatchGateOld(o, throttle || reclaims, throttle && (o.PowerNearLimit || sloMiss))
	throttleWhy := "latency-critical busy"
	if throttle {
		switch {
		case o.PowerNearLimit && !lcBusy:
			throttleWhy = "board near its power limit"
		case o.PowerNearLimit:
			throttleWhy = "latency-critical busy, board near its power limit"
		case sloMiss:
			throttleWhy = "latency-critical busy above its SLO"
		}
	}

	// 3. Assemble.
	uniform := n > 0
	for _, x := range groupSMs[:n] {
		uniform = uniform && x == groupSMs[0]
	}
	for i, t := range tenants {
		g := &d.Grants[i]
		switch {
		case t.Busy:
			g.Groups = (guar[i] & d.Exclusive[i]) | got[i]
			if g.Reason == "" {
				switch {
				case throttle && t.Tier != LatencyCritical && g.Groups == 0:
					g.Reason = fmt.Sprintf("paused (%s, floor 0)", throttleWhy)
				case throttle && t.Tier != LatencyCritical:
					g.Reason = fmt.Sprintf("throttled to %d groups (%s), gate %d kernels / %s per stream",
						bits.OnesCount64(g.Groups), throttleWhy, gate.Depth, gate.Budget)
				case throttle && t.Tier == LatencyCritical && !t.Pinned && got[i] != 0:
					g.Reason = fmt.Sprintf("busy, guarantee %d + %d reclaimed from lower tiers", bits.OnesCount64(guar[i]), bits.OnesCount64(got[i]))
					if t.Shrink > 0 {
						g.Reason += fmt.Sprintf(" (%d given back: latency inside its SLO)", t.Shrink)
					}
				case t.Tier == LatencyCritical && t.Pinned:
					g.Reason = fmt.Sprintf("busy, pinned to its guarantee %d", t.Guarantee)
				default:
					g.Reason = busyReasonOld(t, bits.OnesCount64(got[i]), o.Kind)
				}
			}
		case guar[i] != 0:
			// Idle with a guarantee: it keeps its groups; if they are lendable, busy tenants may hold them too.
			g.Groups = guar[i]
			if g.Reason == "" {
				if d.Exclusive[i] != 0 {
					g.Reason = "idle, guarantee kept"
				} else {
					g.Reason = "idle, guarantee lent"
				}
			}
			if t.Tier == LatencyCritical && !t.Pinned {
				// ... but never the groups a lower tier will keep as its floor when this tenant turns busy: a
				// kernel of the first request with more blocks than free SMs would wait for a floor kernel, which
				// runs for long on so few SMs (seen on the H100 as a +5..9 ms tail).
				var floors uint64
				for j, u := range tenants {
					if u.Tier != LatencyCritical && (u.Busy || u.Prev != 0) {
						floors |= floorGroupsOld(u, shared&^floors, max(0, throttledFloorOld(o, true)-bits.OnesCount64(guar[j]&d.Exclusive[j])))
					}
				}
				// An idle latency-critical tenant that expands is offered every group nobody else holds
				// exclusively, so that the first kernel (or graph) of its next request starts on the whole width:
				// its blocks take the groups lower tiers are using as their kernels drain (dispatch gate), while
				// the scheduler shrinks them. Overlap costs nothing while it is idle.
				if more := all &^ (exclusive &^ d.Exclusive[i]) &^ guar[i] &^ floors; more != 0 {
					g.Groups |= more
					g.Reason += fmt.Sprintf(", offered %d more groups to start wide", bits.OnesCount64(more))
				}
			}
		case throttle && t.Tier != LatencyCritical:
			// Idle lower tier while throttled: offered its floor, where no busy tenant runs if possible.
			g.Groups = pickOld(t.Prev&shared&^busyUsed, shared&^busyUsed, floor)
			if g.Groups == 0 {
				g.Groups = pickOld(t.Prev&shared, shared, floor)
			}
			switch {
			case g.Reason != "":
			case floor == 0:
				g.Reason = fmt.Sprintf("idle, paused (%s)", throttleWhy)
			default:
				g.Reason = fmt.Sprintf("idle, throttled to %d groups (%s)", bits.OnesCount64(g.Groups), throttleWhy)
			}
		default:
			// Idle, no guarantee: keep what it had of the non-exclusive groups, else be offered all of them.
			g.Groups = t.Prev & shared
			if g.Groups == 0 {
				g.Groups = shared
			}
			if g.Reason == "" {
				g.Reason = "idle"
			}
			if g.Groups == 0 {
				g.Reason = "idle, every group is reserved"
			}
		}
		if t.Tier != LatencyCritical {
			g.Gate = gate
		}
		if uniform {
			g.SMs = uint32(bits.OnesCount64(g.Groups)) * groupSMs[0]
		} else {
			for b := g.Groups; b != 0; b &= b - 1 {
				g.SMs += groupSMs[bits.TrailingZeros64(b)]
			}
		}
	}
	return d
}

// dispatchGateOld is the gate of a lower tier: none unless on; the configured one; with tight, the tightest (one
// kernel per stream, half the budget: the board near its power limit or a latency-critical tenant above its SLO).
func dispatchGateOld(o Options, on, tight bool) Gate {
	if !on {
		return Gate{}
	}
	g := Gate{Depth: max(o.GateDepth, 1), Budget: o.GateBudget}
	if g.Budget <= 0 {
		g.Budget = DefaultOptions().GateBudget
	}
	if tight {
		g = Gate{Depth: 1, Budget: g.Budget / 2}
	}
	return g
}

// floorGroupsOld is where a lower-tier tenant keeps its floor of n groups out of avail: the highest groups it held,
// then the highest free ones. Canonical, so that the same groups are chosen when an LC wakes as were kept out of
// the LC's idle offer before (guarantees are placed from the lowest groups up, floors from the highest down).
func floorGroupsOld(t Tenant, avail uint64, n int) uint64 {
	var m uint64
	for b := t.Prev & avail; b != 0 && n > 0; n-- {
		h := uint64(1) << (63 - bits.LeadingZeros64(b))
		m |= h
		b &^= h
	}
	for b := avail &^ m; b != 0 && n > 0; n-- {
		h := uint64(1) << (63 - bits.LeadingZeros64(b))
		m |= h
		b &^= h
	}
	return m
}

// othersPrevOld is the union of the groups the other tenants held.
func othersPrevOld(ts []Tenant, i int) uint64 {
	var m uint64
	for j := range ts {
		if j != i {
			m |= ts[j].Prev
		}
	}
	return m
}

// borrowsOld: every tenant but a pinned latency-critical one with a guarantee may run beyond its guarantee.
func borrowsOld(t Tenant) bool { return t.Tier != LatencyCritical || t.Guarantee <= 0 || !t.Pinned }

// decideSharedOld splits the shared groups among the busy borrowers by weight (nobody latency-critical is busy).
func decideSharedOld(tenants []Tenant, busy []int, guar, excl []uint64, shared uint64, got []uint64, o Options) {
	want := shareCountsOld(bits.OnesCount64(shared)+sumGuaranteeBitsOld(guar, busy, excl), busy, tenants, guar, o)
	extra := make([]int, len(tenants))
	for _, i := range busy {
		e := want[i] - bits.OnesCount64(guar[i]&excl[i])
		if e > 0 {
			extra[i] = e
		}
	}
	placeOld(tenants, busy, extra, shared, got)
}

// decideThrottledOld serves a busy latency-critical tenant (or the power limit): lower tiers keep their floor, busy
// latency-critical tenants take the rest by weight, minus what SLO sizing gives back (which lower tiers share).
func decideThrottledOld(tenants []Tenant, busy []int, guar, excl []uint64, shared uint64, got []uint64, floor int, o Options) {
	var lower, exp []int
	for _, i := range busy {
		if tenants[i].Tier == LatencyCritical {
			exp = append(exp, i)
		} else {
			lower = append(lower, i)
		}
	}
	extra := make([]int, len(tenants))
	free := shared
	for _, i := range lower {
		m := floorGroupsOld(tenants[i], free, max(0, floor-bits.OnesCount64(guar[i]&excl[i])))
		got[i] |= m
		free &^= m
	}
	if len(exp) == 0 {
		return // power only: what lower tiers do not keep stays idle
	}
	want := shareCountsOld(bits.OnesCount64(free)+sumGuaranteeBitsOld(guar, exp, excl), exp, tenants, guar, o)
	for _, i := range exp {
		extra[i] = max(0, want[i]-bits.OnesCount64(guar[i]&excl[i])-max(tenants[i].Shrink, 0))
	}
	free = placeOld(tenants, exp, extra, free, got)
	if free == 0 || len(lower) == 0 {
		return
	}
	// Groups given back by SLO sizing go to the busy lower tiers by weight.
	back := shareCountsOld(bits.OnesCount64(free), lower, tenants, make([]uint64, len(tenants)), o)
	more := make([]uint64, len(tenants))
	placeOld(tenants, lower, back, free, more)
	for _, i := range lower {
		got[i] |= more[i]
	}
}

// placeOld gives each of idx (priority order) extra[i] groups of free: first those it already had, then new ones.
// It returns what is left.
func placeOld(tenants []Tenant, idx []int, extra []int, free uint64, got []uint64) uint64 {
	for _, i := range idx {
		keep := pickOld(tenants[i].Prev&free, 0, extra[i])
		got[i] |= keep
		free &^= keep
	}
	for _, i := range idx {
		need := extra[i] - bits.OnesCount64(got[i])
		if need > 0 {
			m := pickOld(0, free, need)
			got[i] |= m
			free &^= m
		}
	}
	return free
}

func sumGuaranteeBitsOld(guar []uint64, busy []int, excl []uint64) int {
	s := 0
	for _, i := range busy {
		s += bits.OnesCount64(guar[i] & excl[i])
	}
	return s
}

// shareCountsOld returns, for each busy tenant (indexed like ts), how many groups in total (guarantee included) its
// weight earns out of pool groups, never less than its guarantee. Largest remainder; every busy tenant gets >= 1
// while possible.
func shareCountsOld(pool int, busy []int, ts []Tenant, guar []uint64, o Options) []int {
	out := make([]int, len(ts))
	if len(busy) == 0 {
		return out
	}
	w := func(i int) uint64 {
		x := uint64(ts[i].Weight)
		if x == 0 {
			x = 1
		}
		if o.Kind == TPOTFirst && ts[i].Role == RoleDecode {
			b := uint64(o.DecodeBoost)
			if b == 0 {
				b = 1
			}
			x *= b
		}
		return x
	}
	type rem struct {
		i    int
		frac uint64
	}
	rems := make([]rem, 0, len(busy))
	// Guarantees are floors: tenants whose weighted share is below their guarantee take the guarantee and leave the
	// rest to the others (iterate until stable; each round fixes at least one more tenant).
	fixed := make([]bool, len(ts))
	for {
		rest := pool
		var tw uint64
		for _, i := range busy {
			if fixed[i] {
				rest -= bits.OnesCount64(guar[i])
			} else {
				tw += w(i)
			}
		}
		if rest < 0 {
			rest = 0
		}
		rems = rems[:0]
		given := 0
		for _, i := range busy {
			if fixed[i] {
				out[i] = bits.OnesCount64(guar[i])
				continue
			}
			q := uint64(rest) * w(i)
			out[i] = int(q / tw)
			given += out[i]
			rems = append(rems, rem{i, q % tw})
		}
		// Largest remainder; ties to the earlier (higher-priority) tenant.
		sort.SliceStable(rems, func(a, b int) bool { return rems[a].frac > rems[b].frac })
		for k := 0; given < rest && k < len(rems); k++ {
			out[rems[k].i]++
			given++
		}
		// Nobody busy starves while a group can be moved from a tenant holding more than one share-only group. A
		// donor that cannot give now cannot later (giving only lowers counts), so one pass over donors suffices.
		d := 0
		for _, r := range rems {
			if out[r.i] > 0 {
				continue
			}
			for d < len(rems) && !(out[rems[d].i] > 1 && out[rems[d].i] > bits.OnesCount64(guar[rems[d].i])) {
				d++
			}
			if d == len(rems) {
				break
			}
			out[rems[d].i]--
			out[r.i]++
		}
		changed := false
		for _, i := range busy {
			if !fixed[i] && out[i] < bits.OnesCount64(guar[i]) {
				fixed[i] = true
				changed = true
			}
		}
		if !changed {
			return out
		}
	}
}

func busyReasonOld(t Tenant, extra int, k Kind) string {
	s := "busy"
	if t.Guarantee > 0 && t.Tier != BestEffort {
		s = fmt.Sprintf("busy, guarantee %d", t.Guarantee)
	}
	if extra > 0 {
		s += fmt.Sprintf(" + %d shared (weight %d", extra, max(t.Weight, 1))
		if k == TPOTFirst && t.Role == RoleDecode {
			s += ", decode first"
		}
		s += ")"
	}
	return s
}

// lessPriorityOld orders tenants: higher tier first; under TPOT-First decode before others before prefill; then slot.
func lessPriorityOld(a, b Tenant, k Kind) bool {
	if a.Tier != b.Tier {
		return a.Tier > b.Tier
	}
	if k == TPOTFirst && a.Role != b.Role {
		return roleRankOld(a.Role) < roleRankOld(b.Role)
	}
	return a.Slot < b.Slot
}

func roleRankOld(r Role) int {
	switch r {
	case RoleDecode:
		return 0
	case RolePrefill:
		return 2
	}
	return 1
}

// pickOld returns up to n groups: first from preferred, then the lowest from avail.
func pickOld(preferred, avail uint64, n int) uint64 {
	var m uint64
	for b := preferred; b != 0 && n > 0; b &= b - 1 {
		m |= b & -b
		n--
	}
	for b := avail &^ m; b != 0 && n > 0; b &= b - 1 {
		m |= b & -b
		n--
	}
	return m
}
