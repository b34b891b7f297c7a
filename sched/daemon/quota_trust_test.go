package daemon

// Attacks on the share (issue 13 item 4, docs/threat-model-quota.md): forged demand in the client page, and weight or
// tier above the host's ceilings.

import (
	"math/bits"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

func registerWeighted(t *testing.T, tb *table.Table, id string, tier table.Tier, weight, groups uint32, lend bool) table.Registration {
	t.Helper()
	r, err := tb.Register(table.RegisterRequest{ID: id, Tier: tier, GPU: 0, Weight: weight, SMGroups: groups,
		SMs: groups * 8, Lend: lend})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// An idle tenant writing demand=1000 into its own client page (and marking a process busy) gets no SMs: the
// scheduler believes demand only while the counters the library increments move.
func TestForgedDemandGetsNoSMs(t *testing.T) {
	dir, tb := newRunDir(t)
	busy := register(t, tb, "busy", table.TierBestEffort, table.RoleNone, 0, false, 0)
	forger := registerWeighted(t, tb, "forger", table.TierBestEffort, 100, 0, false)
	startSched(t, dir, testConfig(), nil)
	play(t, tb, busy).busy(true)
	waitGrant(t, tb, busy.Slot, time.Second, "the busy tenant takes all 8 groups", groupsIs(8))

	f := play(t, tb, forger)
	pg := f.cl.Page()
	atomic.StoreUint32(&pg.Demand, 1000)
	atomic.StoreUint32(&pg.Procs[f.idx].Busy, 1)
	atomic.AddUint32(&pg.DemandSeq, 1)
	atomic.StoreUint64(&pg.DemandSinceNs, table.MonotonicNs())
	tb.RingDoorbell()
	// several passes (doorbell + ticks of 100 ms)
	time.Sleep(350 * time.Millisecond)
	tb.RingDoorbell()
	time.Sleep(50 * time.Millisecond)
	// (an idle tenant may keep an overlapping grant it does not use: the policy's no-churn rule; what matters is
	// that nothing is taken from the busy tenant)
	if g, _ := tb.ReadGrant(busy.Slot); g.Groups != 0xff {
		t.Fatalf("the busy neighbour lost groups to a forged demand: %b", g.Groups)
	}
}

// Demand whose counters stop moving for longer than tenants.demand_window is no longer believed.
func TestStaleDemandExpires(t *testing.T) {
	dir, tb := newRunDir(t)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	b := register(t, tb, "b", table.TierBestEffort, table.RoleNone, 0, false, 0)
	c := testConfig()
	c.Tenants.DemandWindow.Duration = 300 * time.Millisecond
	startSched(t, dir, c, nil)
	pa, pb := play(t, tb, a), play(t, tb, b)
	pa.busy(true)
	pb.busy(true)
	waitGrant(t, tb, a.Slot, time.Second, "two busy tenants: 4 groups each", groupsIs(4))
	waitGrant(t, tb, b.Slot, time.Second, "two busy tenants: 4 groups each", groupsIs(4))
	// a keeps launching; b's page still says busy but nothing of b moves
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				atomic.AddUint64(&pa.cl.Page().Procs[pa.idx].Launches, 1)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	waitGrant(t, tb, a.Slot, 2*time.Second, "the tenant still launching takes all 8 groups", groupsIs(8))
}

// A tenant asking for weight 10000 is scheduled at tenants.max_weight unless the host trusts it.
func TestWeightCeiling(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		name := "untrusted"
		if trusted {
			name = "trusted"
		}
		t.Run(name, func(t *testing.T) {
			dir, tb := newRunDir(t)
			heavy := registerWeighted(t, tb, "heavy", table.TierBestEffort, 10000, 0, false)
			light := register(t, tb, "light", table.TierBestEffort, table.RoleNone, 0, false, 0)
			c := testConfig()
			c.Tenants.MaxWeight = 1
			if trusted {
				c.Tenants.Trusted = []string{"hea*"}
			}
			startSched(t, dir, c, nil)
			play(t, tb, heavy).busy(true)
			play(t, tb, light).busy(true)
			if trusted {
				waitGrant(t, tb, heavy.Slot, time.Second, "a trusted weight of 10000 takes (nearly) all",
					func(g table.Grant) bool { return g.Mode == table.ModeSpatial && bits.OnesCount64(g.Groups) >= 7 })
				return
			}
			waitGrant(t, tb, heavy.Slot, time.Second, "weight capped at 1: 4 groups", groupsIs(4))
			waitGrant(t, tb, light.Slot, time.Second, "weight capped at 1: 4 groups", groupsIs(4))
		})
	}
}

// A latency-critical tenant above tenants.max_tier is scheduled at the ceiling: demoted to best-effort it holds no
// exclusive groups.
func TestTierCeiling(t *testing.T) {
	dir, tb := newRunDir(t)
	registerWeighted(t, tb, "lc", table.TierLatencyCritical, 1, 2, false)
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	c := testConfig()
	c.Tenants.MaxTier = "best-effort"
	startSched(t, dir, c, nil)
	play(t, tb, be).busy(true)
	waitGrant(t, tb, be.Slot, time.Second, "the LC's groups are not reserved without the host's consent", groupsIs(8))
}

// Without MPS, which tenants the scheduler gates is what lets a latency-critical tenant's library launch past the
// token holder (ds_grant.c reads the gates, not the tier claimed in the table). A claimant demoted by
// tenants.max_tier must be gated beside a real (trusted) latency-critical tenant, and the real one never.
func TestTierCeilingDecidesTemporalGates(t *testing.T) {
	dir, tb := newRunDir(t)
	real := registerWeighted(t, tb, "prod-lc", table.TierLatencyCritical, 1, 2, false)
	claimant := registerWeighted(t, tb, "lc", table.TierLatencyCritical, 1, 2, false)
	c := testConfig()
	c.Tenants.MaxTier = "best-effort"
	c.Tenants.Trusted = []string{"prod-*"}
	m := &mps.Manager{Paths: table.NewPaths(dir), Control: filepath.Join(t.TempDir(), "no-such-mps-control")}
	startSched(t, dir, c, m)
	deadline := time.Now().Add(time.Second)
	for d, _ := tb.Gate(claimant.Slot); d == 0; d, _ = tb.Gate(claimant.Slot) {
		if time.Now().After(deadline) {
			t.Fatal("a latency-critical claimant demoted by max_tier is not gated in temporal mode: its library would launch past the token holder")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d, _ := tb.Gate(real.Slot); d != 0 {
		t.Fatalf("the trusted latency-critical tenant is gated (depth %d)", d)
	}
}

// The scheduler sets the MPS server-side per-client memory limit (which a client cannot raise) to the largest quota
// on the GPU, at once when registrations change, and removes it while an unlimited tenant is there.
func TestMPSServerSideMemoryLimit(t *testing.T) {
	dir, tb := newRunDir(t)
	reg := func(id string, mem uint64) table.Registration {
		r, err := tb.Register(table.RegisterRequest{ID: id, Tier: table.TierBestEffort, GPU: 0, Weight: 1, MemLimit: mem})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	reg("small", 1<<30)
	startSched(t, dir, testConfig(), nil)
	file := filepath.Join(table.NewPaths(dir).MPSPipeDir(0), mps.SimMemLimitFile)
	waitFile := func(want string) {
		t.Helper()
		deadline := time.Now().Add(500 * time.Millisecond) // well inside the 1 s watcher period: the wake-up did it
		for {
			b, err := os.ReadFile(file)
			got := strings.TrimSpace(string(b))
			if err != nil {
				got = "absent"
			}
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("server-side limit %s, want %s", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFile("1073741824")
	big := reg("big", 4<<30)
	tb.RingDoorbell()
	waitFile("4294967296")
	free := reg("unlimited", 0)
	tb.RingDoorbell()
	waitFile("absent")
	for _, r := range []table.Registration{big, free} {
		if err := tb.Deregister(r.ID); err != nil {
			t.Fatal(err)
		}
	}
	tb.RingDoorbell()
	waitFile("1073741824")
}
