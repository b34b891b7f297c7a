package libdetshare_test

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
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
