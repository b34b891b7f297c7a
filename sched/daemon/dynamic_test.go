package daemon

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/policy"
	"github.com/detshare/detshare/sched/view"
)

// A board near its power limit (a fake NVML sample) throttles best-effort beside an idle latency-critical tenant;
// when the draw falls back below the hysteresis band the throttle lifts.
func TestPowerNearLimitThrottlesBestEffort(t *testing.T) {
	dir, tb := newRunDir(t)
	register(t, tb, "lc", table.TierLatencyCritical, table.RoleNone, 2, false, 0)
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	var watts atomic.Int64
	watts.Store(300)
	startSched(t, dir, testConfig(), nil, func(o *Options) {
		o.Board = func(int) (gpuinfo.Board, error) {
			return gpuinfo.Board{PowerW: float64(watts.Load()), LimitW: 700, SMClockMHz: 1980}, nil
		}
	})
	pb := play(t, tb, be)
	pb.busy(true)
	waitGrant(t, tb, be.Slot, time.Second, "BE takes the 6 groups the idle LC does not hold", groupsIs(6))
	watts.Store(690) // 0.986 of the limit
	waitGrant(t, tb, be.Slot, time.Second, "BE throttled to its floor near the power limit", groupsIs(1))
	if d, _ := tb.Gate(be.Slot); d != 1 {
		t.Fatalf("gate depth near the power limit %d, want 1", d)
	}
	watts.Store(620) // 0.886: inside the hysteresis band, still throttled
	time.Sleep(300 * time.Millisecond)
	if g, _ := tb.ReadGrant(be.Slot); !groupsIs(1)(g) {
		t.Fatalf("throttle lifted inside the hysteresis band: %+v", g)
	}
	watts.Store(400)
	waitGrant(t, tb, be.Slot, time.Second, "BE back to 6 groups once power fell", groupsIs(6))
}

// sloPair registers a latency-critical tenant with a 5 ms SLO and 2 groups and a best-effort one.
func sloPair(t *testing.T) (string, *table.Table, table.Registration, table.Registration) {
	t.Helper()
	dir, tb := newRunDir(t)
	lc, err := tb.Register(table.RegisterRequest{ID: "lc", Tier: table.TierLatencyCritical, GPU: 0, Weight: 1,
		SMGroups: 2, SMs: 16, SLOP99Us: 5000})
	if err != nil {
		t.Fatal(err)
	}
	return dir, tb, lc, register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
}

// reportLatency is what libdetshare does at each completion of pg's tenant: n completions in both histograms, at
// fine bucket fine (octave oct of microseconds, sub-bucket sub).
func reportLatency(pg *table.ClientPage, oct, sub int, n uint64) {
	atomic.AddUint64(&pg.LatHist[oct], n)
	atomic.AddUint64(&pg.LatFine[(oct-table.LatFineMinOct)*table.LatFineSub+sub], n)
	atomic.AddUint64(&pg.LatCount, n)
}

// untilGrant rings the doorbell with feed() before each look until slot's grant satisfies ok.
func untilGrant(t *testing.T, tb *table.Table, slot int, within time.Duration, what string, feed func(), ok func(table.Grant) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		feed()
		tb.RingDoorbell()
		g, _ := tb.ReadGrant(slot)
		if ok(g) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not reached within %v: %+v", what, within, g)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An LC with an SLO is a partition sized by the SLO controller: it starts on the default reserve, takes groups from
// the best-effort neighbour while its windows miss the SLO, and gives them back one or two a window while they are
// comfortably inside it. The neighbour's grant does not flip with the LC's
// requests: it never drops below its floor and is never gated. With scheduler.lc_overlap (the default) the LC is
// granted every group besides and the partition shows in what its neighbour keeps.
func TestSLOSizingFromObservedLatency(t *testing.T) {
	for _, overlap := range []bool{true, false} {
		t.Run(fmt.Sprintf("lc_overlap=%v", overlap), func(t *testing.T) { sloSizing(t, overlap) })
	}
}

func sloSizing(t *testing.T, overlap bool) {
	dir, tb, lc, be := sloPair(t)
	c := steadyDemand(testConfig())
	c.Scheduler.LCReserve = 0.5
	c.Scheduler.LCOverlap = overlap
	s := startSched(t, dir, c, nil)
	pl, pb := play(t, tb, lc), play(t, tb, be)
	pb.busy(true)
	pl.busy(true)
	lcHolds := func(n int) func(table.Grant) bool { // its partition; every group under lc_overlap
		if overlap {
			return groupsIs(8)
		}
		return groupsIs(n)
	}
	waitGrant(t, tb, lc.Slot, time.Second, "a new LC starts on the default reserve, half the GPU", lcHolds(4))
	waitGrant(t, tb, be.Slot, time.Second, "its neighbour on the other half", groupsIs(4))
	if n := tb.Narrow(be.Slot); n != 2 {
		t.Fatalf("BE beside a new LC: memory-bound kernels on %d groups, want scheduler.narrow_groups = 2", n)
	}
	pg := pl.cl.Page()
	// 8.2 ms completions (octave 13) against a 5 ms SLO: the partition grows to everything but the BE's floor.
	untilGrant(t, tb, be.Slot, 3*time.Second, "LC above its SLO takes 7 groups: the BE keeps its floor", func() { reportLatency(pg, 13, 0, 50) }, groupsIs(1))
	if g, _ := tb.ReadGrant(lc.Slot); !lcHolds(7)(g) {
		t.Fatalf("LC above its SLO: %+v", g)
	}
	if g, _ := tb.ReadGrant(be.Slot); !groupsIs(1)(g) {
		t.Fatalf("BE beside an LC missing its SLO: %+v, want its floor of 1 group", g)
	}
	if d, _ := tb.Gate(be.Slot); d != 0 {
		t.Fatalf("BE beside a partition gated (depth %d): nobody reclaims its groups", d)
	}
	if p := s.TenantStats()["lc"].ObservedP99; p < 5*time.Millisecond {
		t.Fatalf("observed P99 %v, want above the 5 ms SLO", p)
	}
	if v := lcView(t, tb); v.SLOState != "missing" && v.SLOState != "infeasible" {
		t.Fatalf("status of an LC above its SLO: %q", v.SLOState)
	}
	// ~1 ms completions, a fifth of the SLO: groups go back to the BE.
	untilGrant(t, tb, be.Slot, 3*time.Second, "BE gets groups back", func() { reportLatency(pg, 10, 0, 50) },
		func(g table.Grant) bool { return bits.OnesCount64(g.Groups) >= 4 })
	if v := lcView(t, tb); v.SLOState != "meeting" || v.SLOGivenBackGroups < 3 {
		t.Fatalf("status of an LC inside its SLO: state %q, %d groups given back", v.SLOState, v.SLOGivenBackGroups)
	}
	// still far inside: the partition shrinks below the default only once the BE's memory-bound kernels run on its
	// whole default grant (4 groups), and they stay on those while the BE gains the groups given back
	// (policy.SLOLadder)
	inside := func() { reportLatency(pg, 10, 0, 50) }
	untilGrant(t, tb, be.Slot, 3*time.Second, "BE gets more than the default half", inside,
		func(g table.Grant) bool { return bits.OnesCount64(g.Groups) >= 5 })
	if n, g := tb.Narrow(be.Slot), bits.OnesCount64(grantOf(tb, be.Slot).Groups); n < 4 || n >= uint32(g) {
		t.Fatalf("the partition shrank below the default (BE on %d groups) with the BE's memory-bound kernels on %d "+
			"groups: want the default grant's 4 (5 at most), narrowing still on", g, n)
	}
	// at the top the LC runs on its guarantee and, last, the BE's memory-bound kernels on its whole grant
	untilGrant(t, tb, be.Slot, 3*time.Second, "BE gets everything but the LC's guarantee", inside, groupsIs(6))
	deadline := time.Now().Add(3 * time.Second)
	for tb.Narrow(be.Slot) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("far inside its SLO at the top of the ladder the BE's memory-bound kernels stay on %d of its 6 groups",
				tb.Narrow(be.Slot))
		}
		inside()
		time.Sleep(20 * time.Millisecond)
	}
}

// steadyDemand keeps a tenant that set its busy flag busy for the whole test (without launches the scheduler
// stops believing a busy flag after tenants.demand_window).
func steadyDemand(c config.Config) config.Config {
	c.Tenants.DemandWindow = config.Duration{Duration: time.Minute}
	return c
}

// lcView is the status view of the tenant "lc".
func lcView(t *testing.T, tb *table.Table) view.Tenant {
	t.Helper()
	for _, x := range view.Take(tb).Tenants {
		if x.ID == "lc" {
			return x
		}
	}
	t.Fatal("no tenant lc in the view")
	return view.Tenant{}
}

// Without an SLO, a latency-critical tenant holds scheduler.lc_reserve of the GPU (half by default) as an exclusive
// partition, busy or idle, and its best-effort neighbour keeps the rest, ungated: neither waits for the other's
// kernels and nothing flips at every request. With lc_reserve = 0 it expands over its throttled neighbour at every
// request instead (issue 12's behaviour).
func TestDefaultReserveIsAPartition(t *testing.T) {
	for _, reserve := range []float64{0.5, 0.75, 0} {
		for _, overlap := range []bool{true, false} {
			reservePartition(t, reserve, overlap)
		}
	}
}

// reservePartition: with overlap (scheduler.lc_overlap, the default) the LC is granted every group, its partition
// exclusive, and the BE keeps the complement; without, the LC is granted its partition alone.
func reservePartition(t *testing.T, reserve float64, overlap bool) {
	{
		dir, tb := newRunDir(t)
		lc, err := tb.Register(table.RegisterRequest{ID: "lc", Tier: table.TierLatencyCritical, GPU: 0, Weight: 1,
			SMGroups: 2, SMs: 16})
		if err != nil {
			t.Fatal(err)
		}
		be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
		c := steadyDemand(testConfig())
		c.Scheduler.LCReserve = reserve
		c.Scheduler.LCOverlap = overlap
		startSched(t, dir, c, nil)
		pl, pb := play(t, tb, lc), play(t, tb, be)
		pb.busy(true)
		if reserve == 0 {
			pl.busy(true)
			waitGrant(t, tb, lc.Slot, time.Second, "lc_reserve = 0: the busy LC expands to 7 groups", groupsIs(7))
			return
		}
		want := int(reserve * 8)
		granted := want
		if overlap {
			granted = 8
		}
		waitGrant(t, tb, lc.Slot, time.Second, fmt.Sprintf("idle LC holds %d groups (overlap %v)", want, overlap), groupsIs(granted))
		waitGrant(t, tb, be.Slot, time.Second, fmt.Sprintf("BE keeps the other %d", 8-want), groupsIs(8-want))
		idleLC, idleBE := grantOf(tb, lc.Slot), grantOf(tb, be.Slot)
		if n := bits.OnesCount64(idleLC.Groups &^ idleBE.Groups); n != want {
			t.Fatalf("reserve %v overlap %v: the LC holds %d groups its neighbour lacks, want its partition of %d", reserve, overlap, n, want)
		}
		for i := 0; i < 5; i++ {
			pl.busy(i%2 == 0)
			time.Sleep(30 * time.Millisecond)
			if g := grantOf(tb, lc.Slot); g.Groups != idleLC.Groups {
				t.Fatalf("reserve %v: the LC's partition moved with its demand: %#x -> %#x", reserve, idleLC.Groups, g.Groups)
			}
			if g := grantOf(tb, be.Slot); g.Groups != idleBE.Groups {
				t.Fatalf("reserve %v: the BE's grant flipped with the LC's demand: %#x -> %#x", reserve, idleBE.Groups, g.Groups)
			}
			if d, _ := tb.Gate(be.Slot); d != 0 {
				t.Fatalf("reserve %v: BE gated beside a partition (depth %d)", reserve, d)
			}
		}
	}
}

func grantOf(tb *table.Table, slot int) table.Grant {
	g, _ := tb.ReadGrant(slot)
	return g
}

// Hostile tenants: latency counters are tenant-written. A latency-critical tenant that forges them (huge, then
// going backwards) never gets more than a busy LC without an SLO gets (at worst it gives groups away); a
// best-effort tenant forging them keeps at least its floor; the scheduler does not crash on either.
func TestForgedLatencyCannotWidenAGrant(t *testing.T) {
	dir, tb, lc, be := sloPair(t)
	startSched(t, dir, testConfig(), nil)
	pl, pb := play(t, tb, lc), play(t, tb, be)
	pb.busy(true)
	pl.busy(true)
	waitGrant(t, tb, be.Slot, time.Second, "a new LC starts on its guarantee: the BE keeps the other 6 groups", groupsIs(6))
	lp, bp := pl.cl.Page(), pb.cl.Page()
	for round := 0; round < 20; round++ {
		v := ^uint64(0) >> uint(round%3) // huge, then smaller: counters going backwards
		for i := range lp.LatHist {
			atomic.StoreUint64(&lp.LatHist[i], v)
			atomic.StoreUint64(&bp.LatHist[i], v)
		}
		for i := range lp.LatFine {
			atomic.StoreUint64(&lp.LatFine[i], v>>(i%5))
			atomic.StoreUint64(&bp.LatFine[i], v)
		}
		tb.RingDoorbell()
		time.Sleep(30 * time.Millisecond)
		gl, _ := tb.ReadGrant(lc.Slot)
		gb, _ := tb.ReadGrant(be.Slot)
		if n := bits.OnesCount64(gl.Groups &^ gb.Groups); n > 7 {
			t.Fatalf("round %d: forged latency widened the LC's own groups to %d", round, n)
		}
		if n := bits.OnesCount64(gb.Groups); n < 1 {
			t.Fatalf("round %d: BE lost its floor beside a busy LC (%d groups)", round, n)
		}
	}
}

// TestBlockedReaperDoesNotDelayReaction: reaping and liveness run beside the decision loop, never in it (issue 28:
// they ran in the loop 4 times a second, and a doorbell waited behind them). The reaper is stopped inside its
// round for the whole test: in its walk of /proc, or after the walk and before it applies it (client pages, host
// tenants' owners, the registration lock). While it is stuck there, a latency-critical tenant turning busy and idle
// still has its best-effort neighbour throttled and released, five times over. A reaper run from the loop would
// hold the loop in the same place and no grant would ever move: the bounds below only say "never", nothing is timed.
func TestBlockedReaperDoesNotDelayReaction(t *testing.T) {
	for _, stage := range []string{"walk", "apply"} {
		t.Run(stage, func(t *testing.T) {
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			var armed atomic.Bool // from the first round after start: a scheduler that reaps in its loop still starts
			block := func() {
				if !armed.Load() {
					return
				}
				select {
				case entered <- struct{}{}:
				default:
				}
				<-release
			}
			oldScan, oldStart := scanProcesses, reapStarting
			if stage == "walk" {
				scanProcesses = func() (*table.ProcSet, error) { block(); return table.ScanProcesses() }
			} else {
				reapStarting = block
			}
			// Restored once the scheduler has stopped (cleanups run last-registered first).
			t.Cleanup(func() { scanProcesses, reapStarting = oldScan, oldStart })
			dir, tb := newRunDir(t)
			lc := register(t, tb, "lc", table.TierLatencyCritical, table.RoleNone, 2, false, 0)
			be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
			startSched(t, dir, testConfig(), nil)
			t.Cleanup(func() { close(release) }) // before the scheduler stops: Run waits for its reaper
			armed.Store(true)
			tb.RingDoorbell() // a reaper in the loop would block in the pass this rings for
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the reaper never ran")
			}
			pl, pb := play(t, tb, lc), play(t, tb, be)
			pb.busy(true)
			waitGrant(t, tb, be.Slot, 5*time.Second, "BE takes what the idle LC does not hold", groupsIs(6))
			for i := 0; i < 5; i++ {
				pl.busy(true)
				waitGrant(t, tb, be.Slot, 5*time.Second, "BE throttled while the LC is busy (reaper blocked)", groupsIs(1))
				pl.busy(false)
				waitGrant(t, tb, be.Slot, 5*time.Second, "BE back once the LC is idle (reaper blocked)", groupsIs(6))
			}
			select {
			case <-release:
				t.Fatal("the reaper was released before the reactions were checked")
			default:
			}
		})
	}
}

// An SLO the controller found not attainable and that it holds at the largest share no worse than its floor is
// published as such, so that status, top and metrics say why the neighbours keep more than their floor.
func TestSLOReportSaysHolding(t *testing.T) {
	st := sloState{ctl: policy.SLOControl{Shrink: 4, Miss: true, Infeasible: true, Holding: true,
		LastP99: 3 * time.Millisecond, Floor: 2900 * time.Microsecond}, stepped: true, shrink: 4}
	r := sloReport(st)
	want := uint32(table.SLOActive | table.SLOMiss | table.SLOInfeasible | table.SLOHolding)
	if r.State != want || r.GivenBack != 4 || r.FloorUs != 2900 || r.WindowUs != 3000 {
		t.Fatalf("report %+v, want state %b, 4 groups given back, floor 2900us, window 3000us", r, want)
	}
	st.ctl.Holding = false
	if r := sloReport(st); r.State&table.SLOHolding != 0 {
		t.Fatalf("not holding, yet reported holding: %+v", r)
	}
}
