package table

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// buildTableBench compiles integration/tablebench (the C grant-read benchmark) the way its build.mk does.
func buildTableBench(t testing.TB) string {
	cc := needGCC(t)
	root := filepath.Join(filepath.Dir(headerPath(t)), "..", "..")
	bin := filepath.Join(t.TempDir(), "tablebench")
	out, err := exec.Command(cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-I", root, "-o", bin,
		filepath.Join(root, "integration", "tablebench", "tablebench.c"), "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("build tablebench: %v\n%s", err, out)
	}
	return bin
}

// TestCGrantReadConsistent runs the C benchmark briefly: it exits non-zero if any seqlock read under a concurrent
// writer was torn.
func TestCGrantReadConsistent(t *testing.T) {
	out, err := exec.Command(buildTableBench(t), "-n", "200000").CombinedOutput()
	if err != nil {
		t.Fatalf("tablebench: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "BenchmarkCGrantRead ") || !strings.Contains(string(out), "torn 0") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}

// BenchmarkCGrantRead reports the C fast-path numbers (ns/op of ds_grant_read on a quiescent grant, and of the
// epoch check) as metrics.
func BenchmarkCGrantRead(b *testing.B) {
	bin := buildTableBench(b)
	b.ResetTimer()
	out, err := exec.Command(bin, "-n", strconv.Itoa(max(b.N, 1000000))).CombinedOutput()
	if err != nil {
		b.Fatalf("tablebench: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[3] == "ns/op" {
			v, _ := strconv.ParseFloat(f[2], 64)
			b.ReportMetric(v, strings.TrimPrefix(f[0], "Benchmark")+"-ns/op")
		}
	}
}
