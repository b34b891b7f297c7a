package containers

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/shimv2"
)

// BenchmarkStartLatency compares `ctr run --rm … true` with the DetShare shim and a quota against the same with
// containerd's runc shim, 20 runs each, interleaved in one process so both see the same machine state. Run with
// -benchtime=1x; it reports the medians and their difference (DetShare's target: at most 30 ms added).
func BenchmarkStartLatency(b *testing.B) {
	if setupErr != nil {
		b.Fatalf("container test environment not available: %v", setupErr)
	}
	e := E
	buildUpstreamShim(b, e)
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

// BenchmarkShimLabelLookup is the shim's round trip to containerd for a container's labels (shimv2.ContainerdLabels:
// a new gRPC connection and one Get), made once per container start outside CRI (DETSHARE_SHIM_LABELS=0 turns it
// off). One part of the start cost BenchmarkStartLatency reports as a whole (BENCHMARKS.md, issue 28).
func BenchmarkShimLabelLookup(b *testing.B) {
	if setupErr != nil {
		b.Fatalf("container test environment not available: %v", setupErr)
	}
	e := E
	const id = "ds-bench-labels"
	if out, err := e.ctr("container", "create", "--label", "detshare.io/tier=burstable", imageRef, id); err != nil {
		b.Fatalf("ctr container create: %v: %s", err, out)
	}
	defer e.ctr("container", "delete", id)
	get := shimv2.ContainerdLabels(e.ctrSock, ctrNS)
	const lookups = 200 // per iteration, so that -benchtime=1x (BenchmarkStartLatency's) still measures
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N*lookups; i++ {
		l, err := get(context.Background(), id)
		if err != nil || l["detshare.io/tier"] != "burstable" {
			b.Fatalf("labels of %s: %v, %v; want detshare.io/tier=burstable", id, l, err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N*lookups), "ms/lookup")
}

// buildUpstreamShim builds containerd's own runc shim (v1.7.35) with this toolchain, under another runtime name
// (io.containerd.runcupstream.v1): it separates the cost of a Go 1.26 shim binary from DetShare's work.
func buildUpstreamShim(b *testing.B, e *env) {
	upstream := filepath.Join(e.bin, "containerd-shim-runcupstream-v1")
	if out, err := run(5*time.Minute, nil, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", upstream,
		"github.com/containerd/containerd/cmd/containerd-shim-runc-v2"); err != nil {
		b.Fatalf("build upstream runc shim: %v: %s", err, out)
	}
}

// BenchmarkStartCPU is BenchmarkStartLatency in CPU time: what containerd, the shim processes and runc spend per
// `ctr run --rm … true` (containerd is moved into a cgroup v1 cpuacct group of its own for the benchmark, which the
// shims and runc inherit; the container's own processes go to the container's cgroup), plus ctr's own CPU time, 20
// runs of each runtime interleaved. On a machine shared with other work the wall-clock medians of
// BenchmarkStartLatency wander by ±100 ms between runs; CPU time does not, so this is the figure to compare there.
// DETSHARE_BENCH_PAIRS sets the runs of each (default 20; a random order every round), DETSHARE_BENCH_UPSTREAM=0
// leaves out containerd's own shim (a build of it), DETSHARE_BENCH_REF_SHIM adds a reference build of the DetShare
// shim (BenchmarkStartPaired). Skipped where the cpuacct hierarchy is not mounted.
func BenchmarkStartCPU(b *testing.B) {
	if setupErr != nil {
		b.Fatalf("container test environment not available: %v", setupErr)
	}
	e := E
	root := "/sys/fs/cgroup/cpuacct"
	if _, err := os.Stat(filepath.Join(root, "cpuacct.usage")); err != nil {
		b.Skipf("no cgroup v1 cpuacct hierarchy at %s: %v", root, err)
	}
	upstream := os.Getenv("DETSHARE_BENCH_UPSTREAM") != "0"
	if upstream {
		buildUpstreamShim(b, e)
	}
	cg := filepath.Join(root, fmt.Sprintf("detshare-bench-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		b.Fatalf("cpuacct group: %v", err)
	}
	pid := strconv.Itoa(e.ctrd.Cmd.Process.Pid)
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(pid), 0o644); err != nil {
		b.Fatalf("move containerd %s into %s: %v", pid, cg, err)
	}
	defer func() {
		// containerd back to the root group; the group is removed once the last shim of the benchmark has exited
		_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(pid), 0o644)
		for t := 0; t < 50 && os.Remove(cg) != nil; t++ {
			time.Sleep(100 * time.Millisecond)
		}
	}()
	usage := func() float64 {
		raw, err := os.ReadFile(filepath.Join(cg, "cpuacct.usage"))
		if err != nil {
			b.Fatalf("read %s: %v", cg, err)
		}
		ns, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			b.Fatalf("cpuacct.usage %q: %v", raw, err)
		}
		return float64(ns) / 1e6
	}
	kinds := []struct {
		name string
		args []string
	}{
		{"runc", []string{"--runtime", "io.containerd.runc.v2"}},
		{"detshare", []string{"--runtime", shimRuntime, "--env", "DETSHARE_TIER=burstable", "--env", "DETSHARE_SMS=16",
			"--env", "DETSHARE_MEMORY=1GiB"}},
		{"detshare-no-quota", []string{"--runtime", shimRuntime}},
	}
	if upstream {
		kinds = append(kinds, struct {
			name string
			args []string
		}{"upstream-go126", []string{"--runtime", "io.containerd.runcupstream.v1"}})
	}
	if ref := os.Getenv("DETSHARE_BENCH_REF_SHIM"); ref != "" { // as in BenchmarkStartPaired
		if err := installRefShim(e, ref); err != nil {
			b.Fatal(err)
		}
		kinds = append(kinds, struct {
			name string
			args []string
		}{"reference", append([]string{"--runtime", refRuntime}, detshareQuota...)})
	}
	evictShims(b, e)
	runs := benchCount("DETSHARE_BENCH_PAIRS", 20)
	order := rand.New(rand.NewSource(1))
	for i := 0; i < b.N; i++ {
		cpu := map[string][]float64{}
		for r := 0; r < runs; r++ {
			for _, j := range order.Perm(len(kinds)) { // a random order every round, as in BenchmarkStartPaired
				k := kinds[j]
				id := fmt.Sprintf("ds-cpu-%d-%d-%s", i, r, k.name)
				args := append([]string{"--address", e.ctrSock, "--namespace", ctrNS, "run", "--rm"}, k.args...)
				cmd := exec.Command(e.ctrBin, append(args, imageRef, id, "true")...)
				u0 := usage()
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%s: %v: %s", id, err, out)
				}
				time.Sleep(200 * time.Millisecond) // the shim exits after ctr's delete returns
				ctrCPU := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
				cpu[k.name] = append(cpu[k.name], usage()-u0+float64(ctrCPU.Microseconds())/1000)
			}
		}
		for _, k := range kinds {
			b.ReportMetric(median(cpu[k.name]), k.name+"-cpu-ms")
		}
		b.ReportMetric(median(cpu["detshare"])-median(cpu["runc"]), "added-cpu-ms")
		added := paired(cpu["runc"], cpu["detshare"])
		b.ReportMetric(added.addedP50, "paired-added-cpu-ms")
		b.Logf("CPU per start, paired by round: DetShare over runc P50 %.1f ms (95%% CI %.1f..%.1f); without a quota over runc %.1f ms",
			added.addedP50, added.addedLo, added.addedHi, paired(cpu["runc"], cpu["detshare-no-quota"]).addedP50)
		if len(cpu["reference"]) > 0 {
			ref := paired(cpu["reference"], cpu["detshare"])
			b.ReportMetric(ref.addedP50, "vs-ref-cpu-ms")
			b.Logf("this shim minus the reference shim (DETSHARE_BENCH_REF_SHIM), CPU per start, paired: P50 %.1f ms (95%% CI %.1f..%.1f); reference over runc %.1f ms",
				ref.addedP50, ref.addedLo, ref.addedHi, paired(cpu["runc"], cpu["reference"]).addedP50)
		}
		b.Logf("ctr run --rm true, CPU ms per start (containerd + shims + runc + ctr), median of %d: runc %.1f, detshare %.1f (added %.1f), detshare shim without a quota %.1f, containerd's runc shim rebuilt with this Go %.1f (0: not run)",
			runs, median(cpu["runc"]), median(cpu["detshare"]), median(cpu["detshare"])-median(cpu["runc"]),
			median(cpu["detshare-no-quota"]), median(cpu["upstream-go126"]))
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
