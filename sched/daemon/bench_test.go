package daemon

import (
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
)

// BenchmarkReaction measures the time from a tenant's doorbell ring to the grant that answers it being published
// (futex wake of the scheduler, one decision pass, seqlock publish, futex wake of the waiter), on the simulated GPU.
// Each iteration a lending latency-critical tenant turns busy (or idle) and the borrowing best-effort tenant's grant
// must shrink (or grow) before the LC may rely on its groups; the other tenants are registered and idle. Two is the
// fewest tenants with a reaction to measure: a lone tenant holds every group busy or idle, so its grant never moves.
// Reports mean (ns/op), p50 and p99.
//
// The borrowing tenant counts a launch each iteration, as a busy tenant does: the scheduler believes demand only
// while a tenant's counters move (tenants.demand_window, trust.go), so a borrower that turned busy once and then
// sat still stopped counting as busy once the run outlasted the window (2 s by default: 256 tenants at the default
// benchtime, or any count at -benchtime=3s), and its grant stopped answering the LC.
func BenchmarkReaction(b *testing.B) {
	for _, n := range []int{2, 16, 64, 128, 256} {
		b.Run(fmt.Sprint("tenants=", n), func(b *testing.B) {
			dir, tb := benchRunDir(b)
			lc := mustRegister(b, tb, "lc", table.TierLatencyCritical, 2, true)
			be := mustRegister(b, tb, "be", table.TierBestEffort, 0, false)
			for i := 2; i < n; i++ {
				mustRegister(b, tb, fmt.Sprint("idle", i), table.TierBestEffort, 0, false)
			}
			startSchedB(b, dir)
			measureReaction(b, tb, playB(b, tb, lc), playB(b, tb, be))
		})
	}
}

// measureReaction times b.N reactions: the lender pl flips between busy and idle, and each time the borrower pb's
// grant must change (it counts a launch each time, so that its demand stays believed). Reports p50 and p99.
func measureReaction(b *testing.B, tb *table.Table, pl, pb *player) {
	pb.busy(true)
	waitEpochChangeB(b, tb, pb.reg.Slot, 0, time.Second)
	time.Sleep(20 * time.Millisecond)
	launches := &pb.cl.Page().Procs[pb.idx].Launches
	lat := make([]time.Duration, 0, b.N)
	busy := false
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		busy = !busy
		atomic.AddUint64(launches, 1)
		ep := tb.GrantEpoch(pb.reg.Slot)
		start := time.Now()
		pl.busy(busy)
		for tb.GrantEpoch(pb.reg.Slot) == ep {
			if _, err := tb.WaitGrantChange(pb.reg.Slot, ep, time.Second); err != nil {
				b.Fatal(err)
			}
			if time.Since(start) > time.Second {
				b.Fatalf("no grant change within 1 s (iteration %d)", i)
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkPass is the decision loop's cost per pass (client pages + policy + publish) with n tenants of mixed
// tiers, one tenant's demand flipping every pass so that every pass decides anew. allocs/op must not grow with n
// (issue 28: about 1.3 KB per tenant per pass before). Reaping is not part of a pass (reaper.go).
func BenchmarkPass(b *testing.B) {
	for _, n := range []int{1, 2, 16, 64, 128, 256} {
		b.Run(fmt.Sprint("tenants=", n), func(b *testing.B) {
			dir, tb := benchRunDir(b)
			var regs []table.Registration
			for i := 0; i < n; i++ {
				tier := table.Tier(i % 3)
				g := uint32(0)
				if tier != table.TierBestEffort && i < 4 {
					g = 1
				}
				regs = append(regs, mustRegister(b, tb, fmt.Sprint("t", i), tier, g, i%2 == 0))
			}
			cfg := testConfig()
			cfg.MPS.Enable = true
			s, err := New(Options{RunDir: dir, Config: cfg, MPS: simMPS(dir)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ps := make([]*player, n)
			for i, r := range regs {
				ps[i] = playB(b, tb, r)
			}
			s.decide(time.Now())
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := ps[i%n]
				atomic.AddUint64(&p.cl.Page().Procs[p.idx].Launches, 1)
				p.busy(i/n%2 == 0)
				s.decide(time.Now())
			}
		})
	}
}

func benchRunDir(b *testing.B) (string, *table.Table) {
	dir := b.TempDir() + "/run"
	tb, err := table.Create(dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := tb.SetGPUs([]table.GPUInfo{simGPU}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tb.Close() })
	return dir, tb
}

func mustRegister(b *testing.B, tb *table.Table, id string, tier table.Tier, groups uint32, lend bool) table.Registration {
	r, err := tb.Register(table.RegisterRequest{ID: id, Tier: tier, GPU: 0, Weight: 1, SMGroups: groups, SMs: groups * 8, Lend: lend})
	if err != nil {
		b.Fatal(err)
	}
	return r
}

func startSchedB(b *testing.B, dir string) *Scheduler { return startSchedConfigB(b, dir, testConfig()) }

// startSchedConfigB runs a scheduler of dir with configuration c (MPS on, simulated) until the benchmark ends.
func startSchedConfigB(b *testing.B, dir string, c config.Config) *Scheduler {
	c.MPS.Enable = true
	ready := make(chan struct{})
	s, err := New(Options{RunDir: dir, Config: c, MPS: simMPS(dir), Ready: ready})
	if err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := ctxFromChan(stop)
		defer cancel()
		_ = s.Run(ctx)
	}()
	b.Cleanup(func() { close(stop); <-done; s.Close() })
	<-ready
	return s
}

func playB(b *testing.B, tb *table.Table, reg table.Registration) *player {
	cl, err := table.OpenClientPage(reg.ClientPagePath)
	if err != nil {
		b.Fatal(err)
	}
	id, err := table.SelfIdentity()
	if err != nil {
		b.Fatal(err)
	}
	i, err := cl.AttachProcess(id)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	return &player{tb: tb, cl: cl, idx: i, reg: reg}
}

func waitEpochChangeB(b *testing.B, tb *table.Table, slot int, seen uint32, d time.Duration) {
	deadline := time.Now().Add(d)
	for tb.GrantEpoch(slot) == seen {
		if time.Now().After(deadline) {
			b.Fatal("no grant")
		}
		time.Sleep(time.Millisecond)
	}
}
