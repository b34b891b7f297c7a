package libdetshare_test

import (
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// BenchmarkLaunchAddedCost measures what libdetshare adds to one kernel launch (target: <= 100 ns median). It runs
// the C micro-benchmark ds_bench_launch against the null driver (a test double whose cuLaunchKernel returns at
// once) without the library, with the library and no tenant, and with the library and a tenant, and reports the
// medians and the differences.
//
//	go test ./cgroupgpu/libdetshare -run '^$' -bench LaunchAddedCost -benchtime 1x
func BenchmarkLaunchAddedCost(b *testing.B) {
	nulldrv := need2(b, "tests/nulldrv")
	prog := need2(b, "tests/ds_bench_launch")
	run := func(extra ...string) float64 {
		cmd := exec.Command(prog, "2000", "1000")
		cmd.Env = append([]string{"LD_LIBRARY_PATH=" + nulldrv}, extra...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("%s: %v\n%s", prog, err, out)
		}
		for _, f := range strings.Fields(string(out)) {
			if v, ok := strings.CutPrefix(f, "median_ns="); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				return x
			}
		}
		b.Fatalf("no median in %s", out)
		return 0
	}
	lib := "LD_PRELOAD=" + need2(b, "lib/libdetshare.so")
	e := newEnv(b, false).withTenant(0, "")
	for i := 0; i < b.N; i++ {
		base := run()
		pass := run(lib)
		tenant := run(lib, "DETSHARE_QUOTA_FILE="+e.quotaFile)
		b.ReportMetric(base, "ns/launch-bare")
		b.ReportMetric(pass-base, "ns/launch-added-no-tenant")
		b.ReportMetric(tenant-base, "ns/launch-added-tenant")
	}
}

// BenchmarkRebind measures, on the simulated GPU (a test double), what a grant change costs the next kernel: a
// probe launches one small kernel and synchronises per step; the test flips the grant between two group sets
// before every step (or leaves it, for the baseline) and times each step from the test's side. The difference of
// the medians is the library's rebinding cost at a kernel boundary (grant seqlock read, switch of the logical
// stream to another cached green stream, event edges). The first switch to a new group set also creates its green
// context (reported separately; about 2 ms on an H100, much less in the simulation).
//
//	go test ./cgroupgpu/libdetshare -run '^$' -bench Rebind -benchtime 1x
func BenchmarkRebind(b *testing.B) {
	const steps = 200
	measure := func(flip bool) (first time.Duration, median time.Duration) {
		e := newEnv(b, true).withTenant(0, "")
		e.playScheduler()
		e.grant(table.ModeSpatial, 0b11)
		args := []string{"init", "stream", "smid:8"}
		for i := 0; i < steps; i++ {
			args = append(args, "pause", "smid:8")
		}
		p := e.start("ds_probe_rt", args...)
		p.until()
		var d []time.Duration
		for i := 0; i < steps; i++ {
			if flip {
				if i%2 == 0 {
					e.grant(table.ModeSpatial, 0b1100)
				} else {
					e.grant(table.ModeSpatial, 0b11)
				}
			}
			t0 := time.Now()
			p.resume()
			if i == steps-1 {
				p.finish()
			} else {
				p.until()
			}
			d = append(d, time.Since(t0))
		}
		first = d[0]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return first, d[len(d)/2]
	}
	for i := 0; i < b.N; i++ {
		_, base := measure(false)
		first, flipped := measure(true)
		b.ReportMetric(float64(base.Nanoseconds()), "ns/step-same-grant")
		b.ReportMetric(float64(flipped.Nanoseconds()-base.Nanoseconds()), "ns/rebind-added")
		b.ReportMetric(float64(first.Nanoseconds()), "ns/first-step-new-group-set")
	}
}

// BenchmarkStreamTableScaling reports, on the simulated GPU (a test double), what a free plus a context
// synchronisation costs a process with one live stream after it created (and destroyed) 1, 4096 and 1 000 000
// streams over its life (issue 28: it used to grow with every stream ever created, and streams past 4096 ran
// unconfined). Each case is one probe process under a partial grant; the metric is the median of 300 rounds.
//
//	go test ./cgroupgpu/libdetshare -run '^$' -bench StreamTableScaling -benchtime 1x
func BenchmarkStreamTableScaling(b *testing.B) {
	for i := 0; i < b.N; i++ {
		for _, n := range []int{1, 4096, 1000000} {
			e := newEnv(b, true).withTenant(0, "")
			e.playScheduler()
			e.grant(table.ModeSpatial, 0b11)
			r := e.start("ds_probe_rt", "init", "churn:"+strconv.Itoa(n), "stream", "synccost:300").finish()
			if got := r.num(b, "churn", "n"); got != uint64(n) || r.get(b, "churn", "rc") != "0" {
				b.Fatalf("churn of %d streams: rc %s n %d", n, r.get(b, "churn", "rc"), got)
			}
			b.ReportMetric(float64(r.num(b, "synccost", "ns")), "ns/free+sync-after-"+strconv.Itoa(n)+"-streams")
		}
	}
}

// BenchmarkAllocLedger measures what the memory ledger (ds_ledger.c: OFD locks on the client page, issue 27) adds to
// an allocation on the simulated GPU (a test double): one probe makes 4000 allocations of 64 KiB (each needs a new
// ledger unit: one F_OFD_GETLK and one F_OFD_SETLK) and frees them, in a tenant with a 1 GiB quota (ledger used) and
// in an unlimited one (no ledger); the difference of the probe's CPU time (user + system: the machine's wall time is
// mostly waiting here) over 4000 is the ledger's cost per allocation, frees included.
//
//	go test ./cgroupgpu/libdetshare -run '^$' -bench AllocLedger -benchtime 3x
func BenchmarkAllocLedger(b *testing.B) {
	steps := []string{"init"}
	for i := 0; i < 4000; i++ {
		steps = append(steps, "alloc:65536")
	}
	steps = append(steps, "free-all")
	limited := newEnv(b, true).withTenant(1<<30, "")
	unlimited := newEnv(b, true).withTenant(0, "")
	timeRun := func(e *env) time.Duration {
		cmd := exec.Command(need2(b, "tests/ds_probe_rt"), steps...)
		cmd.Env = e.vars
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Count(string(out), "rc=0") < 4000 {
			b.Fatalf("probe: %v\n%.2000s", err, out)
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	var with, without []time.Duration
	for i := 0; i < b.N; i++ {
		without = append(without, timeRun(unlimited))
		with = append(with, timeRun(limited))
	}
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	b.ReportMetric(float64(med(with)-med(without))/4000, "ns/alloc-added-by-ledger")
}
