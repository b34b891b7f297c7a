package daemon

import (
	"math/bits"
	"sync/atomic"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/gpuinfo"
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

// An LC with an SLO whose library reports latencies far inside it gives groups back to best-effort one window at
// a time; reports above it make it take everything again.
func TestSLOSizingFromObservedLatency(t *testing.T) {
	dir, tb, lc, be := sloPair(t)
	s := startSched(t, dir, testConfig(), nil)
	pl, pb := play(t, tb, lc), play(t, tb, be)
	pb.busy(true)
	pl.busy(true)
	waitGrant(t, tb, lc.Slot, time.Second, "busy LC expands to 7 groups", groupsIs(7))
	pg := pl.cl.Page()
	report := func(bucket int, n uint64) { // what libdetshare does at each completion
		atomic.AddUint64(&pg.LatHist[bucket], n)
		atomic.AddUint64(&pg.LatCount, n)
	}
	// 1 ms completions (bucket 9: 512..1024 us) against a 5 ms SLO: one group back per window.
	deadline := time.Now().Add(3 * time.Second)
	for {
		report(9, 50)
		tb.RingDoorbell()
		g, _ := tb.ReadGrant(lc.Slot)
		if groupsIs(5)(g) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LC well inside its SLO did not give 2 groups back: %+v (%q)", g, s.TenantStats()["lc"].Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g, _ := tb.ReadGrant(be.Slot); !groupsIs(3)(g) {
		t.Fatalf("BE did not get the groups back: %+v", g)
	}
	// 8 ms completions: above the SLO, full expansion at once and the tightest gate on BE.
	deadline = time.Now().Add(3 * time.Second)
	for {
		report(13, 50)
		tb.RingDoorbell()
		g, _ := tb.ReadGrant(lc.Slot)
		if groupsIs(7)(g) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LC above its SLO did not expand again: %+v", g)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitGrant(t, tb, be.Slot, time.Second, "BE back at its floor", groupsIs(1))
	if d, _ := tb.Gate(be.Slot); d != 1 {
		t.Fatalf("BE gate depth %d while the LC misses its SLO, want 1", d)
	}
	if p := s.TenantStats()["lc"].ObservedP99; p < 5*time.Millisecond {
		t.Fatalf("observed P99 %v, want above the 5 ms SLO", p)
	}
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
	waitGrant(t, tb, lc.Slot, time.Second, "busy LC expands to 7 groups", groupsIs(7))
	lp, bp := pl.cl.Page(), pb.cl.Page()
	for round := 0; round < 20; round++ {
		for i := range lp.LatHist {
			v := ^uint64(0) >> uint(round%3) // huge, then smaller: counters going backwards
			atomic.StoreUint64(&lp.LatHist[i], v)
			atomic.StoreUint64(&bp.LatHist[i], v)
		}
		tb.RingDoorbell()
		time.Sleep(30 * time.Millisecond)
		gl, _ := tb.ReadGrant(lc.Slot)
		gb, _ := tb.ReadGrant(be.Slot)
		if n := bits.OnesCount64(gl.Groups); n > 7 {
			t.Fatalf("round %d: forged latency widened the LC to %d groups", round, n)
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
