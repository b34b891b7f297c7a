package policy

import (
	"fmt"
	"math/bits"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// A busy latency-critical tenant must run on its guarantee plus everything lower tiers can give; when it goes
// idle the groups must flow back to them.
func TestBusyLatencyCriticalExpandsAndGivesBack(t *testing.T) {
	gs := groups(15, 8)
	o := DefaultOptions()
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4},
		{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		{Slot: 2, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 2, Busy: true},
	}
	step := func(busy bool) Decision {
		ts[0].Busy = busy
		d := Decide(gs, ts, o)
		checkInvariants(t, gs, ts, d)
		for i := range ts {
			ts[i].Prev = d.Grants[i].Groups
		}
		return d
	}
	idle := step(false)
	// Idle: its 4 guaranteed groups (nobody else's) plus every group not held exclusively (the burstable's 2
	// are) except the BE's floor, so that its next request starts wide.
	if n := bits.OnesCount64(idle.Grants[0].Groups); n != 12 {
		t.Fatalf("idle LC holds %d groups (%q), want 12", n, idle.Grants[0].Reason)
	}
	own := idle.Grants[0].Groups &^ (idle.Grants[1].Groups | idle.Grants[2].Groups)
	if bits.OnesCount64(own) != 4 {
		t.Fatalf("idle LC has %d groups nobody else uses, want its guarantee 4", bits.OnesCount64(own))
	}
	// Their groups can be reclaimed at any moment: the gate is on before the LC wakes, with the configured depth.
	if idle.Grants[1].Gate.Depth != o.GateDepth || idle.Grants[2].Gate.Depth != o.GateDepth {
		t.Fatalf("lower tiers not gated beside an expanding LC: %+v %+v", idle.Grants[1].Gate, idle.Grants[2].Gate)
	}
	busy := step(true)
	lc := bits.OnesCount64(busy.Grants[0].Groups)
	// 15 groups: BE keeps its floor (1), burstable its guarantee (2): LC gets the other 12.
	if lc != 12 {
		t.Fatalf("busy LC got %d groups (%q), want 4 + 8 reclaimed = 12", lc, busy.Grants[0].Reason)
	}
	if busy.Grants[0].Groups&own != own {
		t.Fatalf("busy LC moved off its own groups: %b -> %b", own, busy.Grants[0].Groups)
	}
	back := step(false)
	if n := bits.OnesCount64(back.Grants[0].Groups); n != 12 {
		t.Fatalf("LC idle again holds %d groups, want 12", n)
	}
	if n := bits.OnesCount64(back.Grants[1].Groups) + bits.OnesCount64(back.Grants[2].Groups); n != 11 {
		t.Fatalf("after the LC went idle lower tiers got %d groups back, want 11", n)
	}
}

// While a latency-critical tenant is busy, best-effort and burstable tenants shrink to the floor (or their
// guarantee) and carry a dispatch gate. (A pinned one throttles nobody: TestPinnedIsAStaticPartition.)
func TestLowerTiersThrottledWhileLatencyCriticalBusy(t *testing.T) {
	gs := groups(15, 8)
	for _, pinned := range []bool{false} {
		for _, floor := range []int{1, 3} {
			t.Run(fmt.Sprintf("pinned=%v floor=%d", pinned, floor), func(t *testing.T) {
				o := DefaultOptions()
				o.Floor = floor
				ts := []Tenant{
					{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Busy: true, Pinned: pinned},
					{Slot: 1, ID: "be1", Tier: table.TierBestEffort, Weight: 3, Busy: true, Prev: 0x7ff0},
					{Slot: 2, ID: "be2", Tier: table.TierBestEffort, Weight: 1, Busy: true},
					{Slot: 3, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 2, Busy: true},
				}
				d := Decide(gs, ts, o)
				checkInvariants(t, gs, ts, d)
				for i, want := range []int{0, floor, floor, max(2, floor)} {
					if i == 0 {
						continue
					}
					if n := bits.OnesCount64(d.Grants[i].Groups); n != want {
						t.Errorf("%s: %d groups while LC busy (%q), want %d", ts[i].ID, n, d.Grants[i].Reason, want)
					}
					g := d.Grants[i].Gate
					if g.Depth != o.GateDepth || g.Budget != o.GateBudget {
						t.Errorf("%s: gate %+v, want depth %d budget %s", ts[i].ID, g, o.GateDepth, o.GateBudget)
					}
				}
				if d.Grants[0].Gate != (Gate{}) {
					t.Errorf("LC gated: %+v", d.Grants[0].Gate)
				}
				lc := bits.OnesCount64(d.Grants[0].Groups)
				if pinned && lc != 4 {
					t.Errorf("pinned LC got %d groups, want exactly its guarantee 4", lc)
				}
				if !pinned && lc != 15-2*floor-max(2, floor) {
					t.Errorf("LC got %d groups, want everything but the floors", lc)
				}
				// The BE that had groups keeps one of them (its in-flight kernels are not migrated needlessly).
				if d.Grants[1].Groups&0x7ff0 == 0 {
					t.Errorf("be1 floor %b is none of the groups it had", d.Grants[1].Groups)
				}
			})
		}
	}
}

// Near the power limit, with an LC present but idle, lower tiers are throttled with the tightest gate.
func TestPowerNearLimitThrottlesLowerTiers(t *testing.T) {
	gs := groups(15, 8)
	o := DefaultOptions()
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4},
		{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
	}
	d := Decide(gs, ts, o)
	if n := bits.OnesCount64(d.Grants[1].Groups); n != 11 || d.Grants[1].Gate.Depth != o.GateDepth {
		t.Fatalf("no power pressure: BE %d groups gate %+v, want 11 with the default gate", n, d.Grants[1].Gate)
	}
	ts[0].Pinned = true
	if d := Decide(gs, ts, o); d.Grants[1].Gate.Depth != 0 {
		t.Fatalf("beside an idle pinned LC nothing is ever reclaimed: BE gate %+v, want none", d.Grants[1].Gate)
	}
	ts[0].Pinned = false
	o.PowerNearLimit = true
	d = Decide(gs, ts, o)
	checkInvariants(t, gs, ts, d)
	if n := bits.OnesCount64(d.Grants[1].Groups); n != o.Floor || d.Grants[1].Gate.Depth != 1 {
		t.Fatalf("near the power limit: BE %d groups gate %+v (%q), want floor %d with depth 1", n, d.Grants[1].Gate,
			d.Grants[1].Reason, o.Floor)
	}
	// Without any latency-critical tenant the power limit is the trainers' business: no throttling.
	d = Decide(gs, ts[1:], o)
	if n := bits.OnesCount64(d.Grants[0].Groups); n != 15 || d.Grants[0].Gate.Depth != 0 {
		t.Fatalf("no LC present: BE %d groups gate %+v, want all 15 ungated", n, d.Grants[0].Gate)
	}
}

// SLO sizing: an LC whose latency is comfortably inside its SLO gives groups of its expansion back to lower tiers
// (two per window below half the SLO, one below 75%); close to the SLO one comes back; above it
// the share given back halves and the neighbours' gate tightens; at the top the LC runs on exactly its guarantee.
func TestSLOSizing(t *testing.T) {
	gs := groups(15, 8)
	o := DefaultOptions()
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Busy: true},
		{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
	}
	slo := 5 * time.Millisecond
	var c SLOControl
	for w := 0; w < 3; w++ {
		c.Step(slo, time.Millisecond, 100, 10)
		if c.Miss {
			t.Fatal("1 ms is not a miss of a 5 ms SLO")
		}
	}
	if c.Shrink != 6 || c.Floor != time.Millisecond {
		t.Fatalf("after three windows at 1/5 of the SLO shrink = %d floor %v, want 6 and 1ms (measured at shrink 0)", c.Shrink, c.Floor)
	}
	ts[0].Shrink = c.Shrink
	d := Decide(gs, ts, o)
	checkInvariants(t, gs, ts, d)
	if lc, be := bits.OnesCount64(d.Grants[0].Groups), bits.OnesCount64(d.Grants[1].Groups); lc != 8 || be != 7 {
		t.Fatalf("shrink 6: LC %d BE %d groups, want 8 and 7", lc, be)
	}
	before := c.Shrink
	c.Step(slo, 3500*time.Microsecond, 100, 10) // 70%: one more group
	if c.Shrink != before+1 {
		t.Fatalf("a window at 70%% of the SLO must give one group: %d -> %d", before, c.Shrink)
	}
	c.Step(slo, 4600*time.Microsecond, 100, 10) // 92%: dead band
	if c.Shrink != before+1 || c.Miss {
		t.Fatalf("between 85%% and 100%% of the SLO the share must hold: %d -> %d (miss %v)", before+1, c.Shrink, c.Miss)
	}
	c.Shrink = 8
	c.Step(slo, 6*time.Millisecond, 100, 10)
	if c.Shrink != 6 || !c.Miss {
		t.Fatalf("above the SLO: shrink %d miss %v, want 6 (a quarter back) and true", c.Shrink, c.Miss)
	}
	c.Step(slo, 8*time.Millisecond, 100, 10)
	if c.Shrink != 3 {
		t.Fatalf("far above the SLO (1.6x): shrink %d, want 3 (halved)", c.Shrink)
	}
	c.Shrink = 2
	c.Step(slo, 6*time.Millisecond, 100, 10)
	if c.Shrink != 1 {
		t.Fatalf("above the SLO at shrink 2: %d, want 1 (at least one group back)", c.Shrink)
	}
	ts[0].Shrink, ts[0].SLOMiss = 0, true
	d = Decide(gs, ts, o)
	if lc := bits.OnesCount64(d.Grants[0].Groups); lc != 14 || d.Grants[1].Gate.Depth != 1 {
		t.Fatalf("SLO miss: LC %d groups, BE gate %+v; want 14 and depth 1", lc, d.Grants[1].Gate)
	}
	held := c.Shrink
	c.Step(slo, 0, 3, 10)
	if c.Shrink != held+1 || c.Miss {
		t.Fatalf("a whole window with too few completions must give one group (nothing to protect), got shrink %d -> %d miss %v", held, c.Shrink, c.Miss)
	}
	for w := 0; w < 20; w++ {
		c.Step(slo, time.Microsecond, 100, 10)
	}
	if c.Shrink != 10 {
		t.Fatalf("shrink must be capped at what the LC borrows, got %d", c.Shrink)
	}
	// At the cap the LC keeps exactly its guarantee and the BE the complement: the static partition.
	ts[0].Shrink, ts[0].SLOMiss = 10, false
	d = Decide(gs, ts, o)
	if lc, be := bits.OnesCount64(d.Grants[0].Groups), bits.OnesCount64(d.Grants[1].Groups); lc != 4 || be != 11 {
		t.Fatalf("shrink at its cap: LC %d BE %d groups, want 4 and 11", lc, be)
	}
}

// An SLO the LC misses even at the most protective share is reported as infeasible, with the floor it measured
// there, and the report clears once a window meets it again.
func TestSLOInfeasibleIsReported(t *testing.T) {
	var c SLOControl
	slo := time.Millisecond
	for w := 0; w < 2; w++ {
		c.Step(slo, 1800*time.Microsecond, 100, 10)
	}
	if c.Infeasible {
		t.Fatal("two missed windows are not yet infeasible")
	}
	c.Step(slo, 1700*time.Microsecond, 100, 10)
	if !c.Infeasible || c.Floor != 1700*time.Microsecond || c.Shrink != 0 {
		t.Fatalf("three misses at shrink 0: infeasible %v floor %v shrink %d; want true 1.7ms 0", c.Infeasible, c.Floor, c.Shrink)
	}
	c.Step(slo, 900*time.Microsecond, 100, 10)
	if c.Infeasible || c.Miss {
		t.Fatalf("a window within the SLO must clear the report: %+v", c)
	}
}

// The controller converges on the largest share whose latency stays inside the SLO, and stays there under noise:
// a model of an LC whose P99 grows with the groups it gives back, with Poisson-like jitter between windows. The
// operating point must be feasible (no sustained misses) and not needlessly protective (within two groups of the
// best feasible share).
func TestSLOControllerConvergesInTheModel(t *testing.T) {
	const maxShrink = 10
	// P99 at share k: 1 ms at the most protective share, +0.15 ms per group given back.
	p99At := func(k int, jitter float64) time.Duration {
		return time.Duration((1 + 0.15*float64(k)) * jitter * float64(time.Millisecond))
	}
	slo := 2 * time.Millisecond // best feasible share: 1 + 0.15k <= 2  =>  k = 6
	rng := rand.New(rand.NewSource(12))
	var c SLOControl
	misses, sum, n := 0, 0, 0
	for w := 0; w < 400; w++ {
		j := 0.93 + 0.14*rng.Float64() // +-7% window-to-window noise
		c.Step(slo, p99At(c.Shrink, j), 100, maxShrink)
		if w >= 100 {
			if c.Miss {
				misses++
			}
			sum += c.Shrink
			n++
		}
	}
	mean := float64(sum) / float64(n)
	// The controller holds a window's P99 between 85% and 100% of the SLO, so with +-7% noise some windows miss;
	// a sustained miss (or oscillation) shows as many more.
	if misses > n/8 {
		t.Fatalf("%d of %d windows missed the SLO after convergence: the controller is not stable", misses, n)
	}
	if mean < 4.5 || mean > 6.5 {
		t.Fatalf("mean share given back %.2f groups, want within two of the best feasible 6", mean)
	}
}

// An idle expanding LC's wide grant must not make its guarantee wander over lower tiers' groups from pass to pass.
func TestIdleWideLatencyCriticalIsStable(t *testing.T) {
	gs := groups(15, 8)
	ts := []Tenant{
		{Slot: 0, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		{Slot: 1, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4},
	}
	var prev Decision
	for pass := 0; pass < 4; pass++ {
		d := Decide(gs, ts, DefaultOptions())
		checkInvariants(t, gs, ts, d)
		if pass > 0 {
			for i := range ts {
				if d.Grants[i].Groups != prev.Grants[i].Groups {
					t.Fatalf("pass %d: %s moved %b -> %b", pass, ts[i].ID, prev.Grants[i].Groups, d.Grants[i].Groups)
				}
			}
		}
		for i := range ts {
			ts[i].Prev = d.Grants[i].Groups
		}
		prev = d
	}
	if bits.OnesCount64(prev.Grants[0].Groups) != 11 || bits.OnesCount64(prev.Grants[1].Groups) != 14 {
		t.Fatalf("BE %b, idle LC %b: want 11 and all 15 but the BE's floor", prev.Grants[0].Groups, prev.Grants[1].Groups)
	}
}

// The groups kept out of an idle LC's wide offer are exactly the floor the lower tier keeps when the LC wakes, so
// the LC's first request never shares SMs with a kernel running on a floor (long, on so few SMs); with lending,
// the BE holds every group while the LC is idle.
func TestIdleOfferExcludesTheFloorKeptAtWake(t *testing.T) {
	gs := groups(15, 8)
	for _, lend := range []bool{false, true} {
		for _, floor := range []int{1, 2} {
			o := DefaultOptions()
			o.Floor = floor
			ts := []Tenant{
				{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Lend: lend},
				{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
			}
			var idle Decision
			for pass := 0; pass < 2; pass++ {
				idle = Decide(gs, ts, o)
				for i := range ts {
					ts[i].Prev = idle.Grants[i].Groups
				}
			}
			if lend && bits.OnesCount64(idle.Grants[1].Groups) != 15 {
				t.Fatalf("lend: BE holds %b while the LC is idle, want all 15", idle.Grants[1].Groups)
			}
			ts[0].Busy = true
			busy := Decide(gs, ts, o)
			checkInvariants(t, gs, ts, busy)
			fl := busy.Grants[1].Groups
			if bits.OnesCount64(fl) != floor {
				t.Fatalf("lend %v: BE floor %b, want %d groups", lend, fl, floor)
			}
			if idle.Grants[0].Groups&fl != 0 {
				t.Fatalf("lend %v floor %d: idle LC offer %b includes the floor %b the BE keeps at wake", lend, floor,
					idle.Grants[0].Groups, fl)
			}
			if idle.Grants[0].Groups|fl != 1<<15-1 {
				t.Fatalf("lend %v floor %d: idle LC offer %b + floor %b leave groups out", lend, floor, idle.Grants[0].Groups, fl)
			}
		}
	}
}

// Floor 0 pauses lower tiers while a latency-critical tenant is busy: it gets every group (so it runs on the whole
// GPU, where the library launches on the application's own stream), they get none and keep their gate; when it is
// idle they get everything back; the power throttle alone still leaves them one group.
func TestFloorZeroPausesLowerTiers(t *testing.T) {
	gs := groups(15, 8)
	o := DefaultOptions()
	o.Floor = 0
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Lend: true},
		{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		{Slot: 2, ID: "idle-be", Tier: table.TierBestEffort, Weight: 1},
	}
	idle := Decide(gs, ts, o)
	checkInvariants(t, gs, ts, idle)
	if idle.Grants[0].Groups != 1<<15-1 || idle.Grants[1].Groups != 1<<15-1 {
		t.Fatalf("LC idle: LC offer %b, BE %b; want every group for both (nothing is kept for a floor)",
			idle.Grants[0].Groups, idle.Grants[1].Groups)
	}
	for i := range ts {
		ts[i].Prev = idle.Grants[i].Groups
	}
	ts[0].Busy = true
	busy := Decide(gs, ts, o)
	checkInvariants(t, gs, ts, busy)
	if busy.Grants[0].Groups != 1<<15-1 {
		t.Fatalf("busy LC %b (%q), want every group", busy.Grants[0].Groups, busy.Grants[0].Reason)
	}
	for _, i := range []int{1, 2} {
		if busy.Grants[i].Groups != 0 || busy.Grants[i].Gate.Depth == 0 || !strings.Contains(busy.Grants[i].Reason, "paused") {
			t.Fatalf("%s while LC busy: %b gate %+v (%q), want paused with its gate", ts[i].ID, busy.Grants[i].Groups,
				busy.Grants[i].Gate, busy.Grants[i].Reason)
		}
	}
	ts[0].Busy = false
	o.PowerNearLimit = true
	pw := Decide(gs, ts, o)
	checkInvariants(t, gs, ts, pw)
	if n := bits.OnesCount64(pw.Grants[1].Groups); n != 1 {
		t.Fatalf("power throttle alone with floor 0: BE %d groups (%q), want 1", n, pw.Grants[1].Reason)
	}
}

// The fine histogram: 8 buckets per octave from 64 us, upper edges, saturation handed to the octave histogram.
func TestFineP99(t *testing.T) {
	var f [FineBuckets]uint64
	if _, n, ok := FineP99(f); n != 0 || ok {
		t.Fatal("empty fine histogram must not answer")
	}
	// bucket (octave 10 = 1024 us, sub 2): [1280, 1408) us
	f[(10-6)*8+2] = 100
	if p, n, ok := FineP99(f); !ok || n != 100 || p != 1408*time.Microsecond {
		t.Fatalf("FineP99 = %v %d %v, want 1.408ms 100 true", p, n, ok)
	}
	if fineUpper(0) != 72*time.Microsecond || fineUpper(FineBuckets-2) != 15360*time.Microsecond {
		t.Fatalf("edges: %v %v", fineUpper(0), fineUpper(FineBuckets-2))
	}
	f[FineBuckets-1] = 10 // 10% at or above 15.36 ms: the P99 is out of range
	if _, _, ok := FineP99(f); ok {
		t.Fatal("a P99 in the saturated last bucket must defer to the octave histogram")
	}
	var h [LatencyBuckets]uint64
	h[10], h[14] = 100, 10 // [1024, 2048) and [16384, 32768) us
	if p, n := WindowP99(h, f); n != 110 || p != 32768*time.Microsecond {
		t.Fatalf("WindowP99 with a saturated fine histogram = %v %d, want the octave 32.768ms", p, n)
	}
	f[FineBuckets-1] = 0
	h[14] = 0
	if p, _ := WindowP99(h, f); p != 1408*time.Microsecond {
		t.Fatalf("WindowP99 = %v, want the fine 1.408ms", p)
	}
	h[10] = 99 // an old library without the fine histogram (counts disagree): the octave histogram answers
	if p, _ := WindowP99(h, [FineBuckets]uint64{}); p != 2048*time.Microsecond {
		t.Fatalf("WindowP99 without fine counts = %v, want 2.048ms", p)
	}
}

func TestHistP99(t *testing.T) {
	var h [LatencyBuckets]uint64
	if p, n := HistP99(h); p != 0 || n != 0 {
		t.Fatalf("empty: %v %d", p, n)
	}
	h[10] = 98 // [1024, 2048) µs
	h[12] = 2  // [4096, 8192) µs
	if p, n := HistP99(h); n != 100 || p != 8192*time.Microsecond {
		t.Fatalf("p99 %v n %d, want 8.192ms 100", p, n)
	}
	h[10] = 990
	if p, _ := HistP99(h); p != 2048*time.Microsecond {
		t.Fatalf("p99 %v, want 2.048ms", p)
	}
	var huge [LatencyBuckets]uint64
	for i := range huge {
		huge[i] = ^uint64(0) // forged: the sums must saturate, not wrap to a small P99
	}
	if p, n := HistP99(huge); n != ^uint64(0) || p < 2*time.Microsecond || p > time.Duration(1<<LatencyBuckets)*time.Microsecond {
		t.Fatalf("forged counters: p99 %v n %d, want a bucket edge and a saturated count", p, n)
	}
	if d := HistDelta(huge, [LatencyBuckets]uint64{}); d[0] != 1<<40 {
		t.Fatalf("a forged step must be capped: %d", d[0])
	}
	if p, _ := HistP99(HistDelta(huge, [LatencyBuckets]uint64{})); p != time.Duration(1<<LatencyBuckets)*time.Microsecond {
		t.Fatalf("equal capped buckets: p99 %v, want the top bucket", p)
	}
	if w, n := HistWithin(huge, 5*time.Millisecond); w != ^uint64(0) || n != ^uint64(0) {
		t.Fatalf("forged counters: within %d of %d", w, n)
	}
	var prev [LatencyBuckets]uint64
	prev[10] = 2000 // went backwards: counts as zero, never negative
	if d := HistDelta(h, prev); d[10] != 0 || d[12] != 2 {
		t.Fatalf("delta %v", d[:13])
	}
}

// Random mixes with the dynamic inputs: invariants hold, a busy LC that is not pinned never has fewer groups than
// pinned would give, and lower tiers never exceed their floor (or guarantee) while an LC is busy without shrink.
func TestDecideRandomDynamic(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for it := 0; it < 3000; it++ {
		n := 1 + r.Intn(20)
		gs := groups(n, 8)
		var ts []Tenant
		left := n
		for s := 0; s < 1+r.Intn(6); s++ {
			tier := table.Tier(r.Intn(3))
			g := 0
			if tier != table.TierBestEffort && left > 0 {
				g = r.Intn(left + 1)
				left -= g
			}
			ts = append(ts, Tenant{Slot: s, ID: fmt.Sprint("t", s), Tier: tier, Weight: uint32(1 + r.Intn(4)),
				Guarantee: g, Lend: r.Intn(2) == 0, Busy: r.Intn(2) == 0, Prev: r.Uint64() & (1<<n - 1),
				Pinned: r.Intn(3) == 0})
		}
		o := DefaultOptions()
		o.Floor = r.Intn(3)
		o.PowerNearLimit = r.Intn(4) == 0
		d := Decide(gs, ts, o)
		checkInvariants(t, gs, ts, d)
		lcBusy := false // a busy latency-critical tenant that throttles: a pinned one is a static partition
		for _, x := range ts {
			lcBusy = lcBusy || (x.Tier == table.TierLatencyCritical && x.Busy && !x.Pinned)
		}
		for i, x := range ts {
			got := bits.OnesCount64(d.Grants[i].Groups)
			if lcBusy && x.Tier != table.TierLatencyCritical && x.Busy && got > max(o.Floor, x.Guarantee) {
				t.Fatalf("it %d: %s (%v) has %d groups while an LC is busy (floor %d, guarantee %d): %q", it, x.ID,
					x.Tier, got, o.Floor, x.Guarantee, d.Grants[i].Reason)
			}
			if lcBusy && x.Tier != table.TierLatencyCritical && d.Grants[i].Gate.Depth == 0 {
				t.Fatalf("it %d: %s not gated while an LC is busy", it, x.ID)
			}
		}
	}
}

// Without MPS a latency-critical tenant gets the GPU when what the token holder has queued has drained, so lower
// tiers must get the tightest gate whenever one is present (idle included: its next request may come at any
// moment), never the latency-critical tenant itself, and nobody when none is present.
func TestTemporalGatesBoundLowerTiersBesideLatencyCritical(t *testing.T) {
	o := DefaultOptions()
	tight := Gate{Depth: 1, Budget: o.GateBudget / 2}
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4},
		{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		{Slot: 2, ID: "burst", Tier: table.TierBurstable, Weight: 1, Guarantee: 2, Busy: true},
	}
	g := TemporalGates(ts, o)
	if g[0] != (Gate{}) || g[1] != tight || g[2] != tight {
		t.Fatalf("idle LC present: gates %+v, want none for the LC and %+v for the others", g, tight)
	}
	ts[0].Busy = true
	if g := TemporalGates(ts, o); g[0] != (Gate{}) || g[1] != tight || g[2] != tight {
		t.Fatalf("busy LC: gates %+v, want %+v for lower tiers", g, tight)
	}
	if g := TemporalGates(ts[1:], o); g[0] != (Gate{}) || g[1] != (Gate{}) {
		t.Fatalf("no LC present: gates %+v, want none", g)
	}
	o.GateBudget = 0
	if g := TemporalGates(ts, o); g[1] != (Gate{Depth: 1, Budget: DefaultOptions().GateBudget / 2}) {
		t.Fatalf("an unset budget must fall back to the default: %+v", g[1])
	}
}

// A pinned latency-critical tenant is a static partition (issue 26): busy or idle it runs on exactly its
// guarantee, and its neighbours keep the whole complement at full depth — no floor, no dispatch gate — also near
// the board's power limit. Only when it lends (and so may take groups back at any moment) are they gated, still
// without being squeezed.
func TestPinnedIsAStaticPartition(t *testing.T) {
	gs := groups(15, 8)
	for _, c := range []struct {
		name       string
		lend, busy bool
		power      bool
	}{{"busy", false, true, false}, {"idle", false, false, false}, {"busy near the power limit", false, true, true},
		{"busy lending", true, true, false}} {
		t.Run(c.name, func(t *testing.T) {
			o := DefaultOptions()
			o.PowerNearLimit = c.power
			ts := []Tenant{
				{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Busy: c.busy, Pinned: true,
					Lend: c.lend},
				{Slot: 1, ID: "be1", Tier: table.TierBestEffort, Weight: 3, Busy: true, Prev: 0x7ff0},
				{Slot: 2, ID: "be2", Tier: table.TierBestEffort, Weight: 1, Busy: true},
				{Slot: 3, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 2, Busy: true},
			}
			d := Decide(gs, ts, o)
			checkInvariants(t, gs, ts, d)
			if n := bits.OnesCount64(d.Grants[0].Groups); n != 4 {
				t.Errorf("pinned LC got %d groups, want exactly its guarantee 4", n)
			}
			lower := 0
			for i := 1; i < len(ts); i++ {
				n := bits.OnesCount64(d.Grants[i].Groups)
				lower += n
				if n < ts[i].Guarantee || (ts[i].Guarantee == 0 && n <= o.Floor) {
					t.Errorf("%s: %d groups (%q): squeezed to its floor beside a pinned LC", ts[i].ID, n, d.Grants[i].Reason)
				}
				gated := d.Grants[i].Gate != (Gate{})
				if gated != c.lend {
					t.Errorf("%s: gate %+v; want a gate only when the pinned LC lends (lend=%v)", ts[i].ID, d.Grants[i].Gate, c.lend)
				}
			}
			if lower != 11 {
				t.Errorf("lower tiers hold %d groups together, want the whole complement, 11", lower)
			}
		})
	}
}

// An idle latency-critical tenant whose SLO controller gives groups back is not offered the groups its neighbour
// will keep when it wakes (its floor plus what is given back): its first kernel would wait for theirs.
func TestIdleOfferLeavesWhatIsGivenBack(t *testing.T) {
	gs := groups(15, 8)
	o := DefaultOptions()
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Shrink: 5},
		{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
	}
	d := Decide(gs, ts, o)
	checkInvariants(t, gs, ts, d)
	// busy LC with the same shrink: what the BE keeps then
	busy := append([]Tenant(nil), ts...)
	busy[0].Busy, busy[0].Prev, busy[1].Prev = true, d.Grants[0].Groups, d.Grants[1].Groups
	db := Decide(gs, busy, o)
	kept := db.Grants[1].Groups
	if n := bits.OnesCount64(kept); n != 1+5 {
		t.Fatalf("busy LC giving back 5: BE keeps %d groups, want 6 (floor 1 + 5)", n)
	}
	if d.Grants[0].Groups&kept != 0 {
		t.Fatalf("idle LC offered %#x, which overlaps the %#x the BE keeps when it wakes", d.Grants[0].Groups, kept)
	}
	if n := bits.OnesCount64(d.Grants[0].Groups); n != 15-6 {
		t.Fatalf("idle LC offered %d groups, want the 9 the BE will not keep", n)
	}
}

// A Sized latency-critical tenant (its share set by the SLO controller) is a partition: it holds ReserveOf groups
// exclusively, busy or idle, its neighbour keeps the complement ungated, and nothing flips between requests.
func TestSizedLatencyCriticalIsAPartition(t *testing.T) {
	gs := groups(15, 8)
	o := DefaultOptions()
	o.LCOverlap = false // the partition alone; the overlap has its own tests
	for _, shrink := range []int{0, 4, 10, 99} {
		want := max(4, 15-1-shrink)
		var prevLC, prevBE uint64
		for _, busy := range []bool{true, false, true} {
			ts := []Tenant{
				{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Busy: busy, Shrink: shrink,
					Sized: true, Prev: prevLC},
				{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true, Prev: prevBE},
			}
			d := Decide(gs, ts, o)
			checkInvariants(t, gs, ts, d)
			lc, be := d.Grants[0].Groups, d.Grants[1].Groups
			if bits.OnesCount64(lc) != want || bits.OnesCount64(be) != 15-want || lc&be != 0 {
				t.Fatalf("shrink %d busy %v: LC %d BE %d groups (overlap %#x), want %d and %d", shrink, busy,
					bits.OnesCount64(lc), bits.OnesCount64(be), lc&be, want, 15-want)
			}
			if d.Grants[1].Gate != (Gate{}) {
				t.Fatalf("shrink %d: the BE beside a partition is gated %+v", shrink, d.Grants[1].Gate)
			}
			if prevLC != 0 && (lc != prevLC || be != prevBE) {
				t.Fatalf("shrink %d: the partition moved when the LC turned busy=%v", shrink, busy)
			}
			prevLC, prevBE = lc, be
		}
		ts := []Tenant{{Tier: table.TierLatencyCritical, Guarantee: 4, Shrink: shrink, Sized: true, Busy: true}}
		Decide(gs, ts, o)
		if ts[0].Pinned || ts[0].Guarantee != 4 || ts[0].Shrink != shrink {
			t.Fatalf("Decide changed the caller's tenant: %+v", ts[0])
		}
	}
}

// The default reserve is the same with one best-effort neighbour or several: half of 8 groups is 4 whether one or
// three lower tiers keep the rest (each keeps at least its floor), and never more than their floors leave.
func TestDefaultReserveDoesNotShrinkWithNeighbours(t *testing.T) {
	o := DefaultOptions()
	lc := Tenant{Tier: table.TierLatencyCritical, Guarantee: 2, Sized: true, Shrink: ReserveShrink(2, 8, o)}
	for lower, want := range map[int]int{1: 4, 3: 4, 5: 3, 7: 2} {
		if got := ReserveOf(lc, 8, 0, lower, o); got != want {
			t.Errorf("%d lower tiers: reserve %d groups, want %d", lower, got, want)
		}
	}
}

// With LCOverlap a sized latency-critical tenant is granted every group, busy or idle, while only its partition is
// exclusive: the best-effort neighbour keeps exactly the complement of that partition, ungated, and neither grant
// moves when the LC turns busy or idle (the trainer never flips). Without the option the LC runs on its partition only.
func TestOverlapGrantsTheLCEveryGroupAndTheNeighbourItsComplement(t *testing.T) {
	gs := groups(16, 8)
	for _, overlap := range []bool{false, true} {
		o := DefaultOptions()
		o.LCOverlap = overlap
		var prevLC, prevBE uint64
		for _, busy := range []bool{true, false, true} {
			ts := []Tenant{
				{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Busy: busy, Sized: true,
					Shrink: ReserveShrink(2, 16, o), Prev: prevLC},
				{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true, Prev: prevBE},
			}
			d := Decide(gs, ts, o)
			lc, be, excl := d.Grants[0].Groups, d.Grants[1].Groups, d.Exclusive[0]
			if bits.OnesCount64(excl) != 8 || be != (uint64(1)<<16-1)&^excl {
				t.Fatalf("overlap %v busy %v: LC exclusive %#x, BE %#x: want 8 exclusive groups and BE on the rest",
					overlap, busy, excl, be)
			}
			if want := map[bool]uint64{false: excl, true: uint64(1)<<16 - 1}[overlap]; lc != want {
				t.Fatalf("overlap %v busy %v: LC granted %#x, want %#x", overlap, busy, lc, want)
			}
			if d.Grants[0].SMs != map[bool]uint32{false: 64, true: 128}[overlap] || d.Grants[1].Gate != (Gate{}) {
				t.Fatalf("overlap %v: LC %d SMs, BE gate %+v", overlap, d.Grants[0].SMs, d.Grants[1].Gate)
			}
			if prevLC != 0 && (lc != prevLC || be != prevBE) {
				t.Fatalf("overlap %v: a grant moved when the LC turned busy=%v", overlap, busy)
			}
			prevLC, prevBE = lc, be
		}
	}
}

// Under ShareOverlap two busy best-effort tenants (two trainers) are each granted every group nobody holds
// exclusively, instead of half each; beside a sized latency-critical tenant both keep its complement; a burstable
// tenant's busy guarantee stays exclusive. Off, the split by weight stands.
func TestShareOverlapGrantsEveryBusySharerTheSharedGroups(t *testing.T) {
	gs := groups(16, 8)
	all := uint64(1)<<16 - 1
	for _, on := range []bool{false, true} {
		o := DefaultOptions()
		o.ShareOverlap = on
		ts := []Tenant{
			{Slot: 0, ID: "a", Tier: table.TierBestEffort, Weight: 1, Busy: true},
			{Slot: 1, ID: "b", Tier: table.TierBestEffort, Weight: 3, Busy: true},
		}
		d := Decide(gs, ts, o)
		a, b := d.Grants[0].Groups, d.Grants[1].Groups
		if on && (a != all || b != all) {
			t.Fatalf("share overlap: grants %#x, %#x: want every group for both", a, b)
		}
		if !on && (a&b != 0 || bits.OnesCount64(a) != 4 || bits.OnesCount64(b) != 12) {
			t.Fatalf("split: grants %#x, %#x: want disjoint 4 and 12 groups (weights 1:3)", a, b)
		}

		o.LCOverlap = true
		ts = []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Busy: true, Sized: true,
				Shrink: ReserveShrink(2, 16, o)},
			{Slot: 1, ID: "a", Tier: table.TierBestEffort, Weight: 1, Busy: true},
			{Slot: 2, ID: "b", Tier: table.TierBestEffort, Weight: 1, Busy: true},
			{Slot: 3, ID: "c", Tier: table.TierBurstable, Weight: 1, Guarantee: 1, Busy: true},
		}
		d = Decide(gs, ts, o)
		excl := d.Exclusive[0] | d.Exclusive[3]
		if d.Exclusive[3] == 0 || d.Grants[3].Groups&d.Exclusive[3] != d.Exclusive[3] {
			t.Fatalf("share overlap %v: burstable exclusive %#x, granted %#x", on, d.Exclusive[3], d.Grants[3].Groups)
		}
		for i := 1; i <= 3; i++ {
			if g := d.Grants[i].Groups; g&d.Exclusive[0] != 0 {
				t.Fatalf("share overlap %v: tenant %s granted %#x, inside the LC's partition %#x", on, ts[i].ID, g, d.Exclusive[0])
			}
		}
		if on {
			for i := 1; i <= 2; i++ {
				if g := d.Grants[i].Groups; g != all&^excl {
					t.Fatalf("share overlap: tenant %s granted %#x, want the complement of the exclusive groups %#x", ts[i].ID, g, all&^excl)
				}
			}
		} else if a, b, c := d.Grants[1].Groups, d.Grants[2].Groups, d.Grants[3].Groups; a&b != 0 || a&c != 0 || b&c != 0 {
			t.Fatalf("split: the sharers' grants overlap: %#x %#x %#x", a, b, c)
		}
	}
}

// Under LCOverlap a sized latency-critical tenant is granted every group but another tenant's exclusive ones: a busy
// burstable neighbour's guarantee stays its own.
func TestOverlapNeverGrantsAnotherTenantsExclusiveGroups(t *testing.T) {
	gs := groups(16, 8)
	o := DefaultOptions()
	o.LCOverlap = true
	ts := []Tenant{
		{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Busy: true, Sized: true,
			Shrink: ReserveShrink(2, 16, o)},
		{Slot: 1, ID: "burst", Tier: table.TierBurstable, Weight: 1, Guarantee: 3, Busy: true},
		{Slot: 2, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
	}
	d := Decide(gs, ts, o)
	if d.Exclusive[1] == 0 || d.Grants[0].Groups&d.Exclusive[1] != 0 {
		t.Fatalf("LC granted %#x, burstable's exclusive guarantee %#x", d.Grants[0].Groups, d.Exclusive[1])
	}
	if want := (uint64(1)<<16 - 1) &^ d.Exclusive[1]; d.Grants[0].Groups != want {
		t.Fatalf("LC granted %#x, want every group but the burstable's: %#x", d.Grants[0].Groups, want)
	}
}

// NarrowGroups: beside a latency-critical tenant (sized, pinned or expanding; busy or idle) every lower tier is told
// to run its memory-bound kernels on NarrowGroups of its grant, and the latency-critical tenant never is; two trainers
// without one, a grant no wider than NarrowGroups, or the option at 0 narrow nothing.
func TestNarrowOnlyBesideALatencyCriticalTenant(t *testing.T) {
	gs := groups(16, 8)
	lcs := map[string]Tenant{
		"sized": {Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Sized: true,
			Shrink: ReserveShrink(2, 16, DefaultOptions())},
		"pinned":    {Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Pinned: true},
		"expanding": {Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2},
	}
	for name, lc := range lcs {
		for _, busy := range []bool{false, true} {
			lc.Busy = busy
			ts := []Tenant{lc, {Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
				{Slot: 2, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 1, Busy: true}}
			d := Decide(gs, ts, DefaultOptions())
			if d.Grants[0].Narrow != 0 {
				t.Errorf("%s LC busy=%v: the latency-critical tenant was narrowed to %d groups", name, busy, d.Grants[0].Narrow)
			}
			for i := 1; i < 3; i++ {
				want := uint32(2)
				if bits.OnesCount64(d.Grants[i].Groups) <= 2 {
					want = 0 // nothing narrower to give it
				}
				if d.Grants[i].Narrow != want {
					t.Errorf("%s LC busy=%v: %s granted %#x narrowed to %d groups, want %d", name, busy, ts[i].ID,
						d.Grants[i].Groups, d.Grants[i].Narrow, want)
				}
			}
		}
	}
	two := []Tenant{{Slot: 0, ID: "a", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		{Slot: 1, ID: "b", Tier: table.TierBestEffort, Weight: 1, Busy: true}}
	for i, g := range Decide(gs, two, DefaultOptions()).Grants {
		if g.Narrow != 0 {
			t.Errorf("two trainers, no latency-critical tenant: tenant %d narrowed to %d groups", i, g.Narrow)
		}
	}
	off := DefaultOptions()
	off.NarrowGroups = 0
	ts := []Tenant{lcs["sized"], {Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true}}
	if n := Decide(gs, ts, off).Grants[1].Narrow; n != 0 {
		t.Errorf("narrow_groups = 0: the neighbour was narrowed to %d groups", n)
	}
}

// The SLO controller's position widens the neighbours' narrow part for memory-bound kernels before it gives back any
// group of the default partition, keeps that part at the default grant's width while it gives back the rest, and
// widens it to the whole grant last; going down it retraces the same steps. Every step gives the neighbours one more
// group of room (or one less), never two at once.
func TestSLOLadderOneStepAtATime(t *testing.T) {
	o := DefaultOptions()
	start := ReserveShrink(2, 15, o) // 15 groups, the LC holds 8: its neighbour 7
	maxShrink := 15 - 2 - 1          // down to the LC's guarantee of 2, the neighbour's floor of 1 kept
	l := NewSLOLadder(start, maxShrink, o)
	if l.Widen != 5 || l.Grow != 6 || l.Top() != start+5+2*6 {
		t.Fatalf("ladder %+v (top %d): want 5 widen steps (2 groups to the neighbour's 7) and 6 to grow, twice", l, l.Top())
	}
	room := func(s, w int) int { // groups the neighbour gains over the most protective share, in either dimension
		if w == NarrowOff {
			w = l.Widen + l.Grow
		}
		return s + w
	}
	prevS, prevW := -1, 0
	for pos := 0; pos <= l.Top()+2; pos++ {
		s, w := l.Levels(pos)
		if want := min(pos, l.Top()); room(s, w) != want || s < prevS || room(0, w) < room(0, prevW) {
			t.Fatalf("position %d: shrink %d, widen %d (before %d, %d): not one step along", pos, s, w, prevS, prevW)
		}
		if s < start && w != 0 {
			t.Fatalf("position %d: the neighbour's narrow part widened (%d) before the default partition was reached", pos, w)
		}
		if s > start && w < l.Widen {
			t.Fatalf("position %d: the partition shrank (%d) while the narrow part (%d) was narrower than the default grant", pos, s, w)
		}
		if s < start+l.Grow && s > start && w != l.Widen {
			t.Fatalf("position %d: the narrow part moved (%d) while the partition was still giving groups back", pos, w)
		}
		prevS, prevW = s, w
	}
	if s, w := l.Levels(l.Top()); s != maxShrink || w != NarrowOff {
		t.Fatalf("top: shrink %d, widen %d, want the LC on its guarantee and narrowing off", s, w)
	}
	off := o
	off.NarrowGroups = 0
	lo := NewSLOLadder(start, maxShrink, off)
	if lo.Widen != 0 || lo.Top() != maxShrink {
		t.Fatalf("narrow_groups = 0: ladder %+v top %d, want the partition alone (%d steps)", lo, lo.Top(), maxShrink)
	}
	for pos := 0; pos <= maxShrink; pos++ {
		if s, _ := lo.Levels(pos); s != pos {
			t.Fatalf("narrow_groups = 0, position %d: shrink %d", pos, s)
		}
	}
	// the neighbour's narrow part follows the latency-critical tenant's widen, and stays at the default grant's width
	// while the partition gives groups back
	gs := groups(15, 8)
	lc := Tenant{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Sized: true, Shrink: start}
	be := Tenant{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true}
	for w, want := range map[int]uint32{0: 2, 2: 4, 4: 6, 5: 0, NarrowOff: 0} {
		lc.NarrowWiden = w
		if got := Decide(gs, []Tenant{lc, be}, o).Grants[1].Narrow; got != want {
			t.Errorf("widen %d: the neighbour's memory-bound kernels on %d groups, want %d", w, got, want)
		}
	}
	for _, pos := range []int{start + l.Widen + 2, start + l.Widen + l.Grow + 3} {
		lc.Shrink, lc.NarrowWiden = l.Levels(pos)
		d := Decide(gs, []Tenant{lc, be}, o)
		wantGroups, wantNarrow := 1+lc.Shrink, uint32(o.NarrowGroups+lc.NarrowWiden)
		if n := bits.OnesCount64(d.Grants[1].Groups); n != wantGroups || d.Grants[1].Narrow != wantNarrow {
			t.Errorf("position %d: the neighbour on %d groups, memory-bound kernels on %d; want %d and %d",
				pos, n, d.Grants[1].Narrow, wantGroups, wantNarrow)
		}
	}
}

// An SLO the LC cannot meet at any share must not leave its neighbours on their floor for nothing. Modelled on what
// an H100 showed (BENCHMARKS.md, issue 26): the LC's P99 is flat near the most protective share (1.6 ms, +-5 %, for
// the first five groups given back) and grows beyond; a 1.5 ms SLO is missed everywhere. The controller must report
// it unattainable with the floor it measured and hold the largest share that cost the LC no more than that floor
// (within sloNoWorse), not the most protective one; a window worse than the floor sends it looking again, and a
// window that meets the SLO clears the report.
func TestUnattainableSLOHoldsTheLargestShareNoWorseThanTheFloor(t *testing.T) {
	const maxShrink, start = 12, 7
	p99At := func(k int, jitter float64) time.Duration {
		ms := 1.6
		if k > 5 {
			ms += 0.25 * float64(k-5)
		}
		return time.Duration(ms * jitter * float64(time.Millisecond))
	}
	slo := 1500 * time.Microsecond
	rng := rand.New(rand.NewSource(7))
	c := SLOControl{Shrink: start}
	sum, n := 0, 0
	for w := 0; w < 200; w++ {
		c.Step(slo, p99At(c.Shrink, 0.95+0.1*rng.Float64()), 100, maxShrink)
		if w >= 50 {
			if !c.Infeasible || !c.Miss {
				t.Fatalf("window %d: an SLO missed at every share is not reported unattainable: %+v", w, c)
			}
			sum += c.Shrink
			n++
		}
	}
	if mean := float64(sum) / float64(n); mean < 3 || mean > 5.5 {
		t.Fatalf("unattainable SLO: mean share given back %.2f groups, want the flat part's 3..5 (0 is the most "+
			"protective share, which bought the LC nothing here)", mean)
	}
	if c.Floor < 1520*time.Microsecond || c.Floor > 1680*time.Microsecond {
		t.Fatalf("floor %v, want the flat part's 1.6 ms (+-5 %%)", c.Floor)
	}
	// the neighbours turn heavier: far above the floor, the controller protects again
	held := c.Shrink
	c.Step(slo, 3*time.Millisecond, 100, maxShrink)
	if c.Holding || c.Shrink >= held {
		t.Fatalf("a window far worse than the floor must end the hold and take groups back: shrink %d -> %d, holding %v",
			held, c.Shrink, c.Holding)
	}
	// and a window inside the SLO clears the report
	c.Step(slo, time.Millisecond, 100, maxShrink)
	if c.Infeasible || c.Holding || c.Miss {
		t.Fatalf("a window inside the SLO must clear the report: %+v", c)
	}
}

// A feasible SLO is never held above it: the return to a no-worse share only follows misses at the most protective
// share, so the convergence model (TestSLOControllerConvergesInTheModel) never holds; here the P99 at the most
// protective share meets the SLO, so nothing is reported unattainable whatever came before.
func TestFeasibleSLOIsNeverHeld(t *testing.T) {
	slo := 2 * time.Millisecond
	c := SLOControl{Shrink: 6}
	for _, p := range []time.Duration{2600, 2500, 2400, 2300, 2200, 2100} { // misses all the way down
		c.Step(slo, p*time.Microsecond, 100, 10)
	}
	for w := 0; w < 5 && c.Shrink > 0; w++ {
		c.Step(slo, 2100*time.Microsecond, 100, 10)
	}
	if c.Shrink != 0 {
		t.Fatalf("misses must reach the most protective share: %d", c.Shrink)
	}
	c.Step(slo, 1800*time.Microsecond, 100, 10) // inside: 90 %, dead band
	if c.Infeasible || c.Holding || c.Shrink != 0 {
		t.Fatalf("a share that meets the SLO must be kept: %+v", c)
	}
}

// A window is stepped on once it can say something: a P99 inside the SLO needs P99Samples completions (fewer make
// it the window's largest sample), a miss only MissEvidence completions certainly above the SLO among enough
// samples, and the longest window steps whatever it holds.
func TestSLOWindowReadiness(t *testing.T) {
	for _, c := range []struct {
		n, above uint64
		full     bool
		want     bool
	}{
		{27, 0, false, false}, {27, 1, false, false}, {27, 2, false, true}, {99, 1, false, false},
		{100, 0, false, true}, {10, 5, false, false}, {10, 0, true, true},
	} {
		if got := WindowReady(c.n, c.above, c.full); got != c.want {
			t.Errorf("WindowReady(n %d, above %d, full %v) = %v, want %v", c.n, c.above, c.full, got, c.want)
		}
	}
	slo := 2 * time.Millisecond
	var coarse [LatencyBuckets]uint64
	var fine [FineBuckets]uint64
	coarse[10], coarse[11] = 90, 10 // 1.0-2.0 ms and 2.0-4.1 ms: the second octave lies wholly above 2 ms
	if a := WindowAbove(coarse, fine, slo); a != 10 {
		t.Fatalf("octave histogram: %d above, want 10 (no fine histogram counted them)", a)
	}
	// the fine histogram, counting the same 100, splits the 1-2 ms octave: only buckets from 2 ms up count
	fine[39], fine[40], fine[41] = 90, 5, 5 // 1.92-2.05 ms straddles 2 ms; 2.05-2.30 ms and above do not
	if fineUpper(38) >= slo || fineUpper(39) <= slo {
		t.Fatalf("bucket edges moved: %v %v", fineUpper(38), fineUpper(39))
	}
	if a := WindowAbove(coarse, fine, slo); a != 10 {
		t.Fatalf("fine histogram: %d above, want 10 (the straddling bucket never counts)", a)
	}
	fine[39], fine[38] = 5, 85 // against 1.9 ms: 1.79-1.92 straddles it, 1.92-2.05 lies above
	if a := WindowAbove(coarse, fine, 1900*time.Microsecond); a != 15 {
		t.Fatalf("fine histogram at 1.9 ms: %d above, want 15", a)
	}
}
