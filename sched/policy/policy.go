// Package policy decides who gets which SM groups (or time tokens) of one GPU. It is pure: no I/O, no clocks, no
// table access (only its Tier and Role types), so every rule is table-tested. The daemon (sched/daemon) feeds it a snapshot of the tenants of a GPU
// and publishes what it returns.
//
// Rules (DESIGN.md §4):
//   - A guarantee is a number of SM groups. Guarantees are placed first and are sticky: a tenant keeps the groups it
//     had whenever they are still free, because moving a tenant costs a migration at its next kernel boundary.
//   - Latency-critical: its guaranteed groups are exclusive, busy or idle, unless it allows lending; an idle lender
//     keeps its grant (so its next kernel starts at once) while the same groups are lent to busy borrowers, who lose
//     them within one in-flight kernel once the lender is busy again.
//   - A busy latency-critical tenant expands on demand: it runs on its guarantee plus every group the scheduler can
//     take from lower tiers (best-effort and burstable tenants keep only Options.Floor groups, or their own
//     guarantee, and their in-flight depth is capped by the dispatch gate, Grant.Gate), so its latency approaches
//     its latency alone on the whole GPU. When it goes idle the groups flow back. A pinned latency-critical tenant
//     (quota key pinned) is a static partition: it runs on exactly its guarantee and does not borrow, and its
//     neighbours keep the complement at full depth (no throttle, no gate unless it lends).
//     That expansion is issue 12's behaviour, kept for scheduler.lc_reserve = 0. By default (issue 26) a
//     latency-critical tenant is Sized instead: an exclusive partition of LCReserve of the GPU, busy or idle, or
//     with an SLO the size SLOControl chooses from its observed latency (ReserveOf); its neighbours keep the rest
//     at full depth, so nobody's grant flips at every request.
//   - Power: when the board nears its power limit (Options.PowerNearLimit, read through NVML by the daemon) and a
//     latency-critical tenant is present, lower tiers are throttled as if it were busy, so that the SM clock it
//     gets when it wakes is not the one a power-capped trainer left behind.
//   - table.TierBurstable: guarantee + borrow. Its guarantee is exclusive while it is busy and lendable while it is idle.
//   - Best-effort: no guarantee; work-conserving, soaks up whatever is idle.
//   - What is not held exclusively is shared by the busy tenants in proportion to their weights (largest remainder,
//     every busy tenant gets at least one group while there are enough). Throughput-oriented uses the plain weights;
//     TPOT-First lets decode tenants pick first (boosted weight, first choice of groups, rounding in their favour)
//     and prefill tenants get the rest.
//   - Busy tenants' grants never overlap each other (unless Options.ShareOverlap), and no grant overlaps another
//     tenant's exclusive groups. An
//     idle tenant without a guarantee keeps what it had of the shared groups (or is offered all of them): it runs
//     nothing, so overlap costs nothing until it wakes, and then the scheduler answers its doorbell within
//     microseconds.
//   - Temporal mode (no MPS): one token holder at a time; busy tenants rotate, latency-critical first, quanta sized
//     by tier and weight.
package policy

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// Kind selects how the shared part is split.
type Kind string

// Policy kinds.
const (
	ThroughputOriented Kind = "throughput-oriented"
	TPOTFirst          Kind = "tpot-first"
)

// Kinds lists the selectable policies (for error messages and help).
var Kinds = []Kind{ThroughputOriented, TPOTFirst}

// ParseKind checks a policy name.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("policy %q: allowed values are %q, %q", s, ThroughputOriented, TPOTFirst)
}

// ID is the number recorded in the table header (informational).
func (k Kind) ID() uint32 {
	if k == TPOTFirst {
		return 2
	}
	return 1
}

// Options tune a policy.
type Options struct {
	Kind Kind
	// DecodeBoost multiplies a decode tenant's weight under TPOT-First (>= 1).
	DecodeBoost uint32
	// Quantum is the temporal quantum of a best-effort tenant of weight 1; burstable gets 2x, latency-critical 4x,
	// each times its weight.
	Quantum time.Duration
	// MaxQuantum caps a quantum so that a heavy tenant cannot hold the GPU for long.
	MaxQuantum time.Duration
	// Floor is how many SM groups (its guarantee included) a busy best-effort or burstable tenant keeps while a
	// latency-critical tenant is busy. 0 pauses them meanwhile (their launches wait, bounded by the library, and
	// the latency-critical tenant gets every SM): the strictest isolation, and a lower tier gets nothing while
	// latency-critical work never stops. Under the power throttle alone they always keep at least one group.
	Floor int
	// GateDepth is the dispatch gate of a lower-tier tenant beside a latency-critical one that may reclaim its groups:
	// kernels it may have in flight per stream (>= 1); GateBudget usually binds first.
	GateDepth uint32
	// GateBudget bounds the estimated run time of a throttled tenant's in-flight kernels per stream, so that groups
	// taken from it are free within about this long (the library learns kernel durations per stream).
	GateBudget time.Duration
	// PowerNearLimit is set per pass by the daemon when the board draws close to its power limit (NVML).
	PowerNearLimit bool
	// LCReserve: the fraction of the GPU's groups a latency-critical tenant without slo-p99 holds as its partition
	// (never less than its guarantee; Tenant.Sized), its neighbours keeping the rest; 0 = issue 12's dynamic
	// expansion over throttled neighbours. It is also where the SLO controller starts.
	LCReserve float64
	// LCOverlap: a Sized latency-critical tenant is granted every group, its partition exclusive and the rest
	// shared with the neighbours, who keep the complement of its partition (no flips). Under MPS its blocks take
	// the slots the neighbours' kernels leave, as with a thread percentage, instead of its partition alone.
	LCOverlap bool
	// ShareOverlap: busy tenants are each granted every group nobody holds exclusively, instead of a split by
	// weight, while no latency-critical tenant throttles them: under MPS their blocks interleave on those SMs as
	// they free up (work-conserving, as plain MPS), so a tenant whose kernels do not fill its split leaves nothing
	// idle. Weights then order nothing spatially. Exclusive guarantees and partitions are unchanged. On a GPU without
	// MPS, where no latency-critical tenant is registered, it leaves the tenants to the driver's time-slicing
	// (TemporalTimeSliced): nobody waits for the time token.
	ShareOverlap bool
	// NarrowGroups: while a latency-critical tenant shares the GPU, a lower tier's memory-bound kernels run on this
	// many groups of its grant (the lowest), the rest of its kernels on all of it (Grant.Narrow; the library tells
	// the kinds apart by shared memory). Its memory traffic, not its GEMMs, is what slows the latency-critical
	// tenant beside it, and that traffic needs few SMs. 0: off.
	NarrowGroups int
}

// ReserveOf is the partition of a Sized latency-critical tenant: all groups but one neighbour's floor, less what its
// SLO controller gives back (Shrink), within what the other tenants' guarantees and every lower tier's floor leave,
// never below its own guarantee. others is the sum of the other guaranteed tenants' guarantees, lower the number of
// lower-tier tenants.
func ReserveOf(t Tenant, nGroups, others, lower int, o Options) int {
	floor := max(o.Floor, 1)
	want := nGroups - floor - max(t.Shrink, 0)     // Shrink counts from "all but one neighbour's floor"
	room := nGroups - others - floor*max(lower, 1) // what the other guarantees and every floor leave
	return max(t.Guarantee, min(want, room))
}

// ReserveShrink is the Shrink that makes ReserveOf the LCReserve fraction of nGroups for a tenant alone with one
// lower tier (the SLO controller's starting point and the partition of a latency-critical tenant without an SLO).
func ReserveShrink(guarantee, nGroups int, o Options) int {
	want := max(guarantee, int(o.LCReserve*float64(nGroups)+0.5))
	return max(nGroups-max(o.Floor, 1)-want, 0)
}

// Gate is the dispatch gate the library applies to a throttled tenant's launches (zero value: no gate).
type Gate struct {
	Depth  uint32        // kernels in flight per stream
	Budget time.Duration // estimated run time of those kernels
}

// throttledFloor is the number of groups lower tiers keep while throttled: the floor while a latency-critical tenant
// is busy, at least one under the power throttle alone (nobody is waiting for their SMs then).
func (o Options) throttledFloor(lcBusy bool) int {
	if lcBusy {
		return max(o.Floor, 0)
	}
	return max(o.Floor, 1)
}

// DefaultOptions are the defaults of configs/detshare/config.toml.
func DefaultOptions() Options {
	return Options{Kind: ThroughputOriented, DecodeBoost: 3, Quantum: 5 * time.Millisecond, MaxQuantum: 50 * time.Millisecond,
		Floor: 1, GateDepth: 8, GateBudget: 500 * time.Microsecond, LCReserve: 0.5,
		LCOverlap: true, NarrowGroups: 2}
}

// Tenant is one tenant of the GPU being decided.
type Tenant struct {
	Slot      int
	ID        string
	Tier      table.Tier
	Role      table.Role
	Weight    uint32 // >= 1 (0 is treated as 1)
	Guarantee int    // guaranteed SM groups (0 for best-effort)
	Lend      bool   // latency-critical only: its idle groups may be lent
	Busy      bool   // its client page shows queued work
	Prev      uint64 // groups it holds now (stability)
	// Pinned (latency-critical): exactly its guarantee, never expands.
	Pinned bool
	// Shrink (latency-critical, not pinned): groups left to lower tiers (SLOControl): of its expansion, or, for
	// a Sized tenant, beyond one neighbour's floor (ReserveOf); 0 takes everything it can.
	Shrink int
	// SLOMiss (latency-critical): its observed P99 is above its SLO; neighbours get the tightest gate.
	SLOMiss bool
	// Sized (latency-critical, not pinned): its share is sized by the SLO controller as a partition (Reserve):
	// it holds ReserveOf groups exclusively, busy or idle, and its neighbours keep the rest at full depth, so that
	// neither waits for the other's kernels and nobody's grant flips at every request (issue 26: on an H200 a
	// 64-SM partition gave the LC the P99 of full expansion with 3x the trainer's throughput). Shrink is then the
	// number of groups the partition leaves to lower tiers beyond their floor.
	Sized bool
	// NarrowWiden (latency-critical with an SLO): groups its SLO controller adds to Options.NarrowGroups for its
	// neighbours' memory-bound kernels (SLOLadder); the most protective latency-critical tenant on a GPU sets it.
	NarrowWiden int

	overlap bool // sizeReserves: a Sized tenant under Options.LCOverlap, granted every group
}

// Grant is the decision for one tenant.
type Grant struct {
	Groups uint64
	SMs    uint32
	Reason string // short why, shown by `detshare top` and logs
	Gate   Gate   // dispatch gate for the tenant's launches (throttled lower tiers only)
	// Narrow: groups of Groups its memory-bound kernels run on (lower tiers beside a latency-critical tenant,
	// Options.NarrowGroups); 0: all of Groups.
	Narrow uint32
}

// Decision is a policy's answer for one GPU, Grants aligned with the Tenants given.
type Decision struct {
	Grants []Grant
	// Exclusive[i] is the part of Grants[i] nobody else may be granted.
	Exclusive []uint64
}

// dispatchGate is the gate of a lower tier: none unless on; the configured one; with tight, the tightest (one
// kernel per stream, half the budget: the board near its power limit or a latency-critical tenant above its SLO).
func dispatchGate(o Options, on, tight bool) Gate {
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

// TemporalGates are the dispatch gates on a GPU without MPS, aligned with tenants. There the driver time-slices
// processes: a latency-critical tenant that turns busy runs once what the token holder has queued has drained (the
// library lets it launch without waiting for the token behind a lower tier). So whenever one is present, idle
// included (its next request may come at any moment), every lower tier gets the tightest gate: the LC waits for the
// holder's whole queue, not only for the SMs it needs as under MPS. On the H100 the default gate let the LC's P99
// reach x1.61-1.65 of solo beside a bf16 trainer against x1.13-1.16 with one kernel in flight, for the same trainer
// throughput (BENCHMARKS.md, issue 12, temporal mode).
func TemporalGates(tenants []Tenant, o Options) []Gate {
	lcPresent := latencyCriticalPresent(tenants)
	gates := make([]Gate, len(tenants))
	for i, t := range tenants {
		if t.Tier != table.TierLatencyCritical {
			gates[i] = dispatchGate(o, lcPresent, true)
		}
	}
	return gates
}

// TemporalTimeSliced says whether a GPU without MPS leaves its tenants to the driver's time-slicing instead of
// handing the time token around: under Options.ShareOverlap while no latency-critical tenant is registered there
// (idle ones count: the token must already be held back for its next request). Then every tenant runs whenever it
// has work and the driver interleaves their contexts, with no dispatch gate, which is plain time-slicing's point of
// the frontier: a neighbour whose kernels need every SM (an fp32 GEMM trainer loses ~30 % without a few of them)
// keeps the whole GPU whenever the other tenants are idle (issue 26, BENCHMARKS.md).
func TemporalTimeSliced(tenants []Tenant, o Options) bool {
	return o.ShareOverlap && !latencyCriticalPresent(tenants)
}

// latencyCriticalPresent: some tenant of the GPU is latency-critical, busy or idle.
func latencyCriticalPresent(tenants []Tenant) bool {
	for _, t := range tenants {
		if t.Tier == table.TierLatencyCritical {
			return true
		}
	}
	return false
}

// floorGroups is where a lower-tier tenant keeps its floor of n groups out of avail: the highest groups it held,
// then the highest free ones. Canonical, so that the same groups are chosen when an LC wakes as were kept out of
// the LC's idle offer before (guarantees are placed from the lowest groups up, floors from the highest down).
func floorGroups(t Tenant, avail uint64, n int) uint64 {
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

// borrows: every tenant but a pinned latency-critical one with a guarantee may run beyond its guarantee.
func borrows(t Tenant) bool {
	return t.Tier != table.TierLatencyCritical || t.Guarantee <= 0 || !t.Pinned
}

// place gives each of idx (priority order) extra[i] groups of free: first those it already had, then new ones.
// It returns what is left.
func place(tenants []Tenant, idx []int, extra []int, free uint64, got []uint64) uint64 {
	for _, i := range idx {
		keep := pick(tenants[i].Prev&free, 0, extra[i])
		got[i] |= keep
		free &^= keep
	}
	for _, i := range idx {
		need := extra[i] - bits.OnesCount64(got[i])
		if need > 0 {
			m := pick(0, free, need)
			got[i] |= m
			free &^= m
		}
	}
	return free
}

func sumGuaranteeBits(guar []uint64, busy []int, excl []uint64) int {
	s := 0
	for _, i := range busy {
		s += bits.OnesCount64(guar[i] & excl[i])
	}
	return s
}

// shareScratch holds shareCounts' buffers between calls (a Decider's pass reuses them).
type shareScratch struct {
	out   []int
	rems  []rem
	fixed []bool
}

type rem struct {
	i    int
	frac uint64
}

// shareCounts returns, for each busy tenant (indexed like ts), how many groups in total (guarantee included) its
// weight earns out of pool groups, never less than its guarantee. Largest remainder; every busy tenant gets >= 1
// while possible. The slice returned is sc's: valid until its next shareCounts.
func (sc *shareScratch) shareCounts(pool int, busy []int, ts []Tenant, guar []uint64, o Options) []int {
	out := resize(sc.out, len(ts))
	sc.out = out
	if len(busy) == 0 {
		return out
	}
	w := func(i int) uint64 {
		x := uint64(ts[i].Weight)
		if x == 0 {
			x = 1
		}
		if o.Kind == TPOTFirst && ts[i].Role == table.RoleDecode {
			b := uint64(o.DecodeBoost)
			if b == 0 {
				b = 1
			}
			x *= b
		}
		return x
	}
	rems := sc.rems[:0]
	defer func() { sc.rems = rems[:0] }()
	// Guarantees are floors: tenants whose weighted share is below their guarantee take the guarantee and leave the
	// rest to the others (iterate until stable; each round fixes at least one more tenant).
	fixed := resize(sc.fixed, len(ts))
	sc.fixed = fixed
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
		slices.SortStableFunc(rems, func(a, b rem) int {
			switch {
			case a.frac > b.frac:
				return -1
			case a.frac < b.frac:
				return 1
			}
			return 0
		})
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

// lessPriority orders tenants: higher tier first; under TPOT-First decode before others before prefill; then slot.
func lessPriority(a, b Tenant, k Kind) bool {
	if a.Tier != b.Tier {
		return a.Tier > b.Tier
	}
	if k == TPOTFirst && a.Role != b.Role {
		return roleRank(a.Role) < roleRank(b.Role)
	}
	return a.Slot < b.Slot
}

func roleRank(r table.Role) int {
	switch r {
	case table.RoleDecode:
		return 0
	case table.RolePrefill:
		return 2
	}
	return 1
}

// pick returns up to n groups: first from preferred, then the lowest from avail.
func pick(preferred, avail uint64, n int) uint64 {
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

// Turn is one entry of a temporal rotation.
type Turn struct {
	Slot    int
	Quantum time.Duration
}

// Rotation orders the busy tenants of a GPU without MPS for the time token: latency-critical first, then burstable,
// then best-effort, slot order within a tier (decode first under TPOT-First). Quanta grow with tier and weight.
// Idle tenants get no turn: a token is never wasted on a tenant with nothing queued.
func Rotation(tenants []Tenant, o Options) []Turn {
	idx := make([]int, 0, len(tenants))
	for i, t := range tenants {
		if t.Busy {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return lessPriority(tenants[idx[a]], tenants[idx[b]], o.Kind) })
	out := make([]Turn, 0, len(idx))
	for _, i := range idx {
		out = append(out, Turn{Slot: tenants[i].Slot, Quantum: QuantumFor(tenants[i], o)})
	}
	return out
}

// QuantumFor is the time a tenant may hold the token per turn.
func QuantumFor(t Tenant, o Options) time.Duration {
	base := o.Quantum
	if base <= 0 {
		base = DefaultOptions().Quantum
	}
	f := time.Duration(1)
	switch t.Tier {
	case table.TierBurstable:
		f = 2
	case table.TierLatencyCritical:
		f = 4
	}
	w := time.Duration(max(t.Weight, 1))
	if o.Kind == TPOTFirst && t.Role == table.RoleDecode && o.DecodeBoost > 1 {
		w *= time.Duration(o.DecodeBoost)
	}
	q := base * f * w
	if o.MaxQuantum > 0 && q > o.MaxQuantum {
		q = o.MaxQuantum
	}
	return q
}
