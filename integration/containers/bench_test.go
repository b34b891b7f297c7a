package containers

import (
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// BenchmarkStartLatency compares `ctr run --rm … true` with the DetShare shim and a quota against the same with
// containerd's runc shim, 20 runs each, interleaved in one process so both see the same machine state. Run with
// -benchtime=1x; it reports the medians and their difference (DetShare's target: at most 30 ms added).
func BenchmarkStartLatency(b *testing.B) {
	if setupErr != nil {
		b.Fatalf("container test environment not available: %v", setupErr)
	}
	e := E
	// containerd's own runc shim (v1.7.35) built with this toolchain, under another runtime name: separates the cost
	// of a Go 1.26 shim binary from DetShare's work.
	upstream := filepath.Join(e.bin, "containerd-shim-runcupstream-v1")
	if out, err := run(5*time.Minute, nil, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", upstream,
		"github.com/containerd/containerd/cmd/containerd-shim-runc-v2"); err != nil {
		b.Fatalf("build upstream runc shim: %v: %s", err, out)
	}
	const runs = 20
	for i := 0; i < b.N; i++ {
		var plain, det, shimOnly, up []float64
		for r := 0; r < runs; r++ {
			for _, ds := range []bool{false, true} {
				id := fmt.Sprintf("ds-bench-%d-%d-%v", i, r, ds)
				args := []string{"run", "--rm", "--runtime", "io.containerd.runc.v2"}
				if ds {
					args = []string{"run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=burstable",
						"--env", "DETSHARE_SMS=16", "--env", "DETSHARE_MEMORY=1GiB"}
				}
				start := time.Now()
				out, err := e.ctr(append(args, imageRef, id, "true")...)
				ms := float64(time.Since(start).Microseconds()) / 1000
				if err != nil {
					b.Fatalf("%s: %v: %s", id, err, out)
				}
				if ds {
					det = append(det, ms)
				} else {
					plain = append(plain, ms)
				}
			}
			// The DetShare shim with a container that has no DetShare settings: the shim's own cost.
			id := fmt.Sprintf("ds-bench-%d-%d-shim", i, r)
			start := time.Now()
			if out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, imageRef, id, "true"); err != nil {
				b.Fatalf("%s: %v: %s", id, err, out)
			}
			shimOnly = append(shimOnly, float64(time.Since(start).Microseconds())/1000)
			id = fmt.Sprintf("ds-bench-%d-%d-up", i, r)
			start = time.Now()
			if out, err := e.ctr("run", "--rm", "--runtime", "io.containerd.runcupstream.v1", imageRef, id, "true"); err != nil {
				b.Fatalf("%s: %v: %s", id, err, out)
			}
			up = append(up, float64(time.Since(start).Microseconds())/1000)
		}
		mp, md := median(plain), median(det)
		b.ReportMetric(mp, "runc-median-ms")
		b.ReportMetric(md, "detshare-median-ms")
		b.ReportMetric(md-mp, "added-ms")
		b.ReportMetric(median(shimOnly), "detshare-shim-no-quota-median-ms")
		b.ReportMetric(median(up), "upstream-shim-go126-median-ms")
		b.Logf("ctr run --rm true, median of %d: runc %.1f ms, detshare %.1f ms (added %.1f ms); detshare shim without a quota %.1f ms; containerd's runc shim rebuilt with this Go %.1f ms",
			runs, mp, md, md-mp, median(shimOnly), median(up))
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkDockerStartLatency is BenchmarkStartLatency for `docker run --rm` with --runtime=detshare (the runc
// wrapper) and a quota against --runtime=runc.
func BenchmarkDockerStartLatency(b *testing.B) {
	if setupErr != nil {
		b.Fatalf("container test environment not available: %v", setupErr)
	}
	e := E
	if err := e.startDocker(); err != nil {
		b.Fatalf("dockerd not available: %v", err)
	}
	const runs = 20
	for i := 0; i < b.N; i++ {
		var plain, det []float64
		for r := 0; r < runs; r++ {
			for _, ds := range []bool{false, true} {
				args := []string{"run", "--rm", "--network", "none", "--runtime=runc"}
				if ds {
					args = []string{"run", "--rm", "--network", "none", "--runtime=detshare", "-e", "DETSHARE_TIER=burstable",
						"-e", "DETSHARE_SMS=16", "-e", "DETSHARE_MEMORY=1GiB"}
				}
				start := time.Now()
				out, err := e.docker(append(args, dockerImage, "true")...)
				ms := float64(time.Since(start).Microseconds()) / 1000
				if err != nil {
					b.Fatalf("docker run: %v: %s", err, out)
				}
				if ds {
					det = append(det, ms)
				} else {
					plain = append(plain, ms)
				}
			}
		}
		mp, md := median(plain), median(det)
		b.ReportMetric(mp, "runc-median-ms")
		b.ReportMetric(md, "detshare-median-ms")
		b.ReportMetric(md-mp, "added-ms")
		b.Logf("docker run --rm true, median of %d: runc %.1f ms, detshare %.1f ms (added %.1f ms)", runs, mp, md, md-mp)
	}
}
