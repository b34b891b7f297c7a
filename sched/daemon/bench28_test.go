package daemon

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
)

// Issue 28's scheduler benchmarks: reaction with n tenants of mixed tiers and churning demand, and the idle CPU of
// the scheduler. Both use only what main had before issue 28, so that the same file builds a paired baseline.

// simGPU1 is a second simulated GPU (a test double), where BenchmarkReactionMixed's churning tenants live.
var simGPU1 = table.GPUInfo{Index: 1, UUID: "SIM-daemon-test-1", Name: "simulated GPU (test double)", SMCount: 64, MemTotal: 1 << 34}

// BenchmarkReactionMixed is BenchmarkReaction (doorbell of a lending latency-critical tenant turning busy or idle ->
// its best-effort borrower's new grant published) with n tenants of mixed tiers while others' demand churns: GPU 0
// holds the measured pair and idle burstable and best-effort tenants; GPU 1 holds latency-critical, burstable and
// best-effort tenants, up to 32 of which flip between busy and idle every millisecond (each flip rings the doorbell,
// so the loop is kept busy deciding). Reports p50 and p99 of the reaction.
func BenchmarkReactionMixed(b *testing.B) {
	for _, n := range []int{2, 16, 64, 128, 256} {
		b.Run(fmt.Sprint("tenants=", n), func(b *testing.B) {
			dir, tb := benchRunDir(b)
			if err := tb.SetGPUs([]table.GPUInfo{simGPU, simGPU1}); err != nil {
				b.Fatal(err)
			}
			lc := mustRegister(b, tb, "lc", table.TierLatencyCritical, 2, true)
			be := mustRegister(b, tb, "be", table.TierBestEffort, 0, false)
			var churn []table.Registration
			for i := 2; i < n; i++ {
				req := table.RegisterRequest{ID: fmt.Sprint("t", i), Tier: table.Tier(i % 2), GPU: 0, Weight: uint32(1 + i%4)}
				if i%3 != 0 { // two thirds on GPU 1, of every tier
					req.GPU, req.Tier = 1, table.Tier(i%3)
				}
				r, err := tb.Register(req)
				if err != nil {
					b.Fatal(err)
				}
				if r.GPU == 1 && len(churn) < 32 {
					churn = append(churn, r)
				}
			}
			startSchedB(b, dir)
			pl, pb := playB(b, tb, lc), playB(b, tb, be)
			var churners []*player
			for _, r := range churn {
				churners = append(churners, playB(b, tb, r))
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for k := 0; ; k++ {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					for i, p := range churners {
						atomic.AddUint64(&p.cl.Page().Procs[p.idx].Launches, 1)
						if i%4 == k%4 {
							p.busy(k%8 < 4)
						}
					}
				}
			}()
			defer func() { close(stop); <-done }()
			measureReaction(b, tb, pl, pb)
		})
	}
}

// BenchmarkIdleCPU is the CPU the scheduler uses (this process's user + system time over wall time, in % of one
// core) with n idle tenants of mixed tiers, each with one live process attached (this one), under the default
// configuration (tick 100 ms, reap_every 250 ms). Nothing else runs in the process. One iteration is one second.
func BenchmarkIdleCPU(b *testing.B) {
	for _, n := range []int{1, 2, 16, 64, 128, 256} {
		b.Run(fmt.Sprint("tenants=", n), func(b *testing.B) {
			dir, tb := benchRunDir(b)
			for i := 0; i < n; i++ {
				tier := table.Tier(i % 3)
				g := uint32(0)
				if tier != table.TierBestEffort && i < 4 {
					g = 1
				}
				playB(b, tb, mustRegister(b, tb, fmt.Sprint("t", i), tier, g, i%2 == 0))
			}
			startSchedConfigB(b, dir, config.Default()) // tick 100 ms, reap_every 250 ms
			time.Sleep(500 * time.Millisecond)          // first reaps and decisions done
			cpu0, t0 := cpuTime(b), time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				time.Sleep(time.Second)
			}
			b.StopTimer()
			b.ReportMetric(100*float64(cpuTime(b)-cpu0)/float64(time.Since(t0)), "cpu-%")
		})
	}
}

// cpuTime is the user + system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
