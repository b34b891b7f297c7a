package tenant

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/placement"
	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
)

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// scalingSizes are the tenant counts of BenchmarkRegisterScaling (the n-th registration, n-1 already registered).
var scalingSizes = []int{1, 16, 64, 128, 256}
var _ = os.Getenv

// BenchmarkRegisterScaling registers the n-th tenant as the shim and `detshare run` do (the container Registrar:
// placement by the neighbours' measured profile, quota gpu=auto by default; admission; slot; client page; quota
// files) while n-1 tenants are registered, for n from 1 to 256, and deregisters it again outside the timing. The
// sizes take turns registration by registration (one run directory each, all set up first), each round starting
// with the next size, so load on the machine and the work of the size before fall on every size alike; it reports
// each size's median, the ratio of the 256th to the 1st (issue 28: registration must cost the same for the 256th
// tenant as for the 1st), that ratio taken round by round (its median: less blurred by load that changes from one
// second to the next) and each size's heap allocations per registration (median; not blurred by load at all).
// gpus=1 is the common host; gpus=2 makes placement choose between two GPUs.
func BenchmarkRegisterScaling(b *testing.B) {
	for _, gpus := range []int{1, 2} {
		b.Run(fmt.Sprintf("gpus=%d", gpus), func(b *testing.B) { benchRegisterScaling(b, gpus, true) })
	}
	// placement measuring every page itself, as without a scheduler publishing (the fallback, and before issue 28)
	b.Run("gpus=2/unpublished", func(b *testing.B) { benchRegisterScaling(b, 2, false) })
}

func benchRegisterScaling(b *testing.B, gpus int, published bool) {
	b.Setenv("DETSHARE_SIMGPU", "1")
	b.Setenv("DETSHARE_SIMGPU_COUNT", fmt.Sprint(gpus))
	b.Setenv("DETSHARE_SIMGPU_SMS", "132")
	b.Setenv("DETSHARE_SIMGPU_MEM", fmt.Sprint(80<<30))
	be := quota.Inputs{Annotations: map[string]string{"detshare.io/memory": "64MiB"}}.Resolve() // best-effort, gpu=auto
	type size struct {
		n      int
		dir    string
		reg    Registrar
		ms     []float64
		allocs []float64
		rp     *table.Reaper // the scheduler's reaper: publishes each GPU's pressure, as every reaper round does
	}
	var sizes []*size
	for _, n := range scalingSizes {
		dir := filepath.Join(b.TempDir(), "run")
		s := &size{n: n, dir: dir, reg: Registrar{DiscoverGPUs: simgpu.Discover, Placer: &placement.Placer{RunDir: dir}}}
		for i := 1; i < n; i++ {
			if _, err := s.reg.Register(context.Background(), dir, Request{ID: fmt.Sprint("tenant-", i), Quota: be,
				OwnerPID: os.Getpid()}); err != nil {
				b.Fatal(err)
			}
		}
		sizes = append(sizes, s)
	}
	// A live leader, as on a host where the scheduler runs (its reaper reaps dead host tenants, not registration,
	// and publishes each GPU's pressure, which gpu=auto placement reads instead of every tenant's page).
	for _, s := range sizes {
		t, err := table.Create(s.dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { t.Close() })
		if _, err := t.SetLeader(os.Getpid()); err != nil {
			b.Fatal(err)
		}
		s.rp = t.NewReaper()
		b.Cleanup(s.rp.Close)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if published {
			// Every size's reaper publishes at the start of the round, not each just before its own size's
			// registration: the reaper runs in the scheduler's process, 4 times a second, whatever registers. Right
			// before a registration in this process, its walk of up to 255 pages made that registration cost more
			// the more pages it walked (CPU time, mostly the kernel's, which followed the reaper's size and not the
			// registration's when the two were swapped: BENCHMARKS.md, issue 28, 2026-11-27).
			b.StopTimer()
			for _, s := range sizes {
				s.rp.PublishPressure(time.Now())
			}
			b.StartTimer()
		}
		for k := range sizes {
			s := sizes[(i+k)%len(sizes)] // each round starts one size later: no size always comes first or last
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			t0 := time.Now()
			if _, err := s.reg.Register(context.Background(), s.dir, Request{ID: "nth", Quota: be, OwnerPID: os.Getpid()}); err != nil {
				b.Fatal(err)
			}
			s.ms = append(s.ms, float64(time.Since(t0).Nanoseconds())/1e6)
			b.StopTimer()
			runtime.ReadMemStats(&m1)
			s.allocs = append(s.allocs, float64(m1.Mallocs-m0.Mallocs))
			if err := Deregister(s.dir, "nth"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	first, last := median(sizes[0].ms), median(sizes[len(sizes)-1].ms)
	for _, s := range sizes {
		b.ReportMetric(median(s.ms), fmt.Sprintf("ms/reg-n%d", s.n))
		b.ReportMetric(median(s.allocs), fmt.Sprintf("allocs/reg-n%d", s.n))
	}
	b.ReportMetric(last/first, "ratio-256th/1st")
	// The same ratio taken within each round (the two registrations a few milliseconds apart), its median over the
	// rounds: load that comes and goes over seconds falls on both sides of each ratio.
	var paired []float64
	for i, ms := range sizes[len(sizes)-1].ms {
		paired = append(paired, ms/sizes[0].ms[i])
	}
	b.ReportMetric(median(paired), "paired-ratio-256th/1st")
}
