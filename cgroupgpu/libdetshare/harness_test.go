// Package libdetshare_test drives the C tests of libdetshare (cgroupgpu/libdetshare): it runs the C test programs
// built in build/tests under LD_PRELOAD=build/lib/libdetshare.so against the simulated GPU (a test double,
// build/lib/simgpu) and asserts on their output and on the tenant's client page.
package libdetshare_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// buildDir is $DETSHARE_BUILD_DIR or the repository's build/.
func buildDir(t testing.TB) string {
	if d := os.Getenv("DETSHARE_BUILD_DIR"); d != "" {
		return d
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("cannot locate the test file to find build/")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "build")
}

// need returns the path of a build output, failing loudly when it was not built.
func need(t testing.TB, rel string) string { t.Helper(); return need2(t, rel) }

func need2(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(buildDir(t), rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s missing (%v): run `make c-build` first", p, err)
	}
	return p
}

// simGPU returns the simulated GPU's library directory, or fails (DETSHARE_SKIP_SIMGPU=1 skips instead).
func simGPU(t testing.TB) string {
	t.Helper()
	p := filepath.Join(buildDir(t), "lib", "simgpu", "libcuda.so.1")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("DETSHARE_SKIP_SIMGPU") == "1" {
			t.Skipf("simulated GPU not built (%v) and DETSHARE_SKIP_SIMGPU=1", err)
		}
		t.Fatalf("simulated GPU (test double) %s missing (%v): run `make c-build`", p, err)
	}
	return filepath.Dir(p)
}

const simMem = 8 << 30 // bytes of the simulated GPU in these tests

// env is a test process environment: simulated GPU with its own state file, libdetshare preloaded.
type env struct {
	t         testing.TB
	vars      []string
	runDir    string
	tbl       *table.Table
	reg       table.Registration
	client    *table.Client
	quotaFile string
}

// newEnv makes an environment with the simulated GPU and no tenant (pure pass-through).
func newEnv(t testing.TB, preload bool) *env {
	t.Helper()
	dir := t.TempDir()
	vars := []string{
		"PATH=" + os.Getenv("PATH"),
		"LD_LIBRARY_PATH=" + simGPU(t),
		"DETSHARE_SIMGPU_STATE=" + filepath.Join(dir, "simgpu-state"),
		"DETSHARE_SIMGPU_MEM=" + strconv.Itoa(simMem),
		"DETSHARE_SIMGPU_SMS=132",
	}
	if preload {
		vars = append(vars, "LD_PRELOAD="+need(t, "lib/libdetshare.so"))
	}
	return &env{t: t, vars: vars, runDir: filepath.Join(dir, "run")}
}

var tenantSeq atomic.Int32

// withTenant registers a tenant with the given memory limit (0 = unlimited) in a fresh table in the test's run
// directory and points the library at its quota file.
func (e *env) withTenant(memLimit uint64, mpsPipeDir string) *env {
	t := e.t
	t.Helper()
	tbl, err := table.Create(e.runDir)
	if err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Cleanup(func() { tbl.Close() })
	if len(tbl.GPUs()) == 0 {
		if err := tbl.SetGPUs([]table.GPUInfo{{Index: 0, UUID: "SIM-0", Name: "DetShare simulated GPU (test double)",
			SMCount: 132, MemTotal: simMem}}); err != nil {
			t.Fatalf("set GPUs: %v", err)
		}
	}
	id := fmt.Sprintf("lib-test-%d", tenantSeq.Add(1))
	reg, err := tbl.Register(table.RegisterRequest{ID: id, Tier: table.TierBestEffort, Weight: 1, GPU: 0,
		MemLimit: memLimit})
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	client, err := table.OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatalf("open client page: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	qf := filepath.Join(e.runDir, "tenants", id, "quota-test")
	if err := os.MkdirAll(filepath.Dir(qf), 0o755); err != nil {
		t.Fatal(err)
	}
	data := quota.Render(quota.File{Version: quota.QuotaFileVersion, ID: id, Slot: reg.Slot, SlotGen: reg.Gen,
		GPU: 0, FilePaths: quota.FilePaths{Table: tbl.Paths().Table(), ClientPage: reg.ClientPagePath,
			Doorbell: tbl.Paths().Doorbell(), MPSPipeDir: mpsPipeDir}})
	if err := os.WriteFile(qf, data, 0o644); err != nil {
		t.Fatal(err)
	}
	e.tbl, e.reg, e.client, e.quotaFile = tbl, reg, client, qf
	e.vars = append(e.vars, "DETSHARE_QUOTA_FILE="+qf)
	return e
}

// another returns a second tenant in the same table and simulated GPU (same run directory and state file).
func (e *env) another(memLimit uint64) *env {
	e.t.Helper()
	var vars []string
	for _, v := range e.vars {
		if !strings.HasPrefix(v, "DETSHARE_QUOTA_FILE=") {
			vars = append(vars, v)
		}
	}
	o := &env{t: e.t, vars: vars, runDir: e.runDir}
	return o.withTenant(memLimit, "")
}

func (e *env) memUsed() uint64 { return atomic.LoadUint64(&e.client.Page().MemUsed) }

// result is the parsed output of a probe run: step -> key -> value ("rc" always present).
type result struct {
	lines []string
	steps map[string]map[string]string
	order []stepLine
}

type stepLine struct {
	step string
	kv   map[string]string
}

func parse(out string) result {
	r := result{steps: map[string]map[string]string{}}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		r.lines = append(r.lines, line)
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		kv := map[string]string{}
		for _, x := range f[1:] {
			if k, v, ok := strings.Cut(x, "="); ok {
				kv[k] = v
			}
		}
		r.steps[f[0]] = kv // the last occurrence of a step wins
		r.order = append(r.order, stepLine{f[0], kv})
	}
	return r
}

func (r result) get(t testing.TB, step, key string) string {
	t.Helper()
	kv, ok := r.steps[step]
	if !ok {
		t.Fatalf("no output line for step %q in:\n%s", step, strings.Join(r.lines, "\n"))
	}
	v, ok := kv[key]
	if !ok {
		t.Fatalf("step %q has no %s in:\n%s", step, key, strings.Join(r.lines, "\n"))
	}
	return v
}

// infos returns the free/total pairs of every "info" step, in order.
func (r result) infos(t testing.TB) (free, total []uint64) {
	t.Helper()
	for _, l := range r.order {
		if l.step != "info" {
			continue
		}
		if l.kv["rc"] != "0" {
			t.Fatalf("info failed: %v\n%s", l.kv, strings.Join(r.lines, "\n"))
		}
		f, _ := strconv.ParseUint(l.kv["free"], 10, 64)
		tt, _ := strconv.ParseUint(l.kv["total"], 10, 64)
		free, total = append(free, f), append(total, tt)
	}
	return free, total
}

func (r result) num(t testing.TB, step, key string) uint64 {
	t.Helper()
	v := r.get(t, step, key)
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("step %q %s=%q is not a number", step, key, v)
	}
	return n
}

// run runs a test program with the environment and steps and returns its parsed output; a non-zero exit fails.
func (e *env) run(prog string, steps ...string) result {
	e.t.Helper()
	cmd := exec.Command(need(e.t, "tests/"+prog), steps...)
	cmd.Env = e.vars
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("%s %v: %v\n%s", prog, steps, err, out)
	}
	return parse(string(out))
}

// probes are the two driver paths: runtime-style lookup and -lcuda.
var probes = []string{"ds_probe_rt", "ds_probe_lcuda"}
