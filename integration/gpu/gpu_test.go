package gpu

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

func here(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

func buildDir(t *testing.T) string {
	if d := os.Getenv("DETSHARE_BUILD_DIR"); d != "" {
		return d
	}
	return filepath.Join(here(t), "..", "..", "build")
}

func python(t *testing.T) string {
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 not found: the GPU suite's scripts are Python (%v)", err)
	}
	return p
}

// torchPython finds an interpreter with PyTorch (CPU is enough) for the harness checks.
func torchPython(t *testing.T) string {
	cands := []string{os.Getenv("DETSHARE_TORCH_PYTHON"), "/usr/bin/python3", "python3"}
	for _, c := range cands {
		if c == "" {
			continue
		}
		if exec.Command(c, "-c", "import torch").Run() == nil {
			return c
		}
	}
	if os.Getenv("DETSHARE_SKIP_TORCH") == "1" {
		t.Skip("DETSHARE_SKIP_TORCH=1: no PyTorch, harness check skipped")
	}
	t.Fatalf("no python3 with PyTorch (apt-get install python3-torch, or DETSHARE_TORCH_PYTHON=...); " +
		"set DETSHARE_SKIP_TORCH=1 to skip the CPU harness checks")
	return ""
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func need(t *testing.T, paths ...string) {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing: run `make build` first", p)
		}
	}
}

// hami.sh builds HAMi-core the way its own build.sh does (Debug: a Release build hides the hooks its dlsym hands out,
// so it limits nothing) and refuses a library that does not export cuInit. The CUDA toolkit and cmake are stand-ins:
// cmake records its arguments and "builds" a library with or without cuInit among thousands of other symbols, enough
// that nm is still writing when a grep -q would have stopped reading.
func TestHamiBuildRefusesALibraryThatHidesItsHooks(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Fatalf("cc is needed to build the stand-in library: %v", err)
	}
	dir := t.TempDir()
	src, cuda, bin := filepath.Join(dir, "src"), filepath.Join(dir, "cuda"), filepath.Join(dir, "bin")
	for _, d := range []string{filepath.Join(src, "src"), filepath.Join(cuda, "include"), bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var lib strings.Builder
	lib.WriteString("int cuInit(unsigned f) { return (int)f; }\n")
	for i := 0; i < 6000; i++ {
		fmt.Fprintf(&lib, "int zz_hook_%04d(void) { return %d; }\n", i, i)
	}
	files := map[string]string{
		filepath.Join(src, "CMakeLists.txt"):     "project(libvgpu)\n",
		filepath.Join(src, "src", "libvgpu.c"):   lib.String(),
		filepath.Join(cuda, "include", "cuda.h"): "/* stand-in */\n",
		// configure: record the arguments; build: compile the source into <build dir>/libvgpu.so, cuInit hidden
		// when HIDE is set (what -fvisibility=hidden does to HAMi-core's unmarked hooks)
		filepath.Join(bin, "cmake"): `#!/bin/sh
if [ "$1" = --build ]; then
  vis=default; [ -n "$HIDE" ] && vis=hidden
  sed "s/^int cuInit/__attribute__((visibility(\"$vis\"))) int cuInit/" "$SRC/src/libvgpu.c" > "$2/l.c"
  exec cc -shared -fPIC -o "$2/libvgpu.so" "$2/l.c"
fi
echo "$@" > "$ARGS"
`,
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := func(hide bool) (string, string, error) {
		out, args := filepath.Join(dir, fmt.Sprintf("out-%v", hide)), filepath.Join(dir, fmt.Sprintf("args-%v", hide))
		cmd := exec.Command("bash", filepath.Join(here(t), "hami.sh"), src)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "CUDA_HOME="+cuda, "HAMI_OUT="+out,
			"SRC="+src, "ARGS="+args)
		if hide { // and a library of an earlier build in place, which a refused build must not leave behind
			cmd.Env = append(cmd.Env, "HIDE=1")
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(out, "libvgpu.so"), []byte("stale"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		o, err := cmd.CombinedOutput()
		a, _ := os.ReadFile(args)
		return out, string(o) + "\n[cmake " + string(a) + "]", err
	}
	out, log, err := build(false)
	if err != nil || !strings.Contains(log, "-DCMAKE_BUILD_TYPE=Debug") || !strings.Contains(log, "-DDLSYM_HOOK_ENABLE=1") {
		t.Fatalf("hami.sh with cuInit exported: want a Debug build with the dlsym hook, got %v\n%s", err, log)
	}
	if _, err := os.Stat(filepath.Join(out, "libvgpu.so")); err != nil {
		t.Errorf("hami.sh succeeded but left no library: %v\n%s", err, log)
	}
	out, log, err = build(true)
	if err == nil || !strings.Contains(log, "does not export cuInit") {
		t.Errorf("hami.sh with cuInit hidden: want a refusal naming cuInit, got %v\n%s", err, log)
	}
	if _, err := os.Stat(filepath.Join(out, "libvgpu.so")); err == nil {
		t.Errorf("hami.sh refused the library but left one where bench.py looks\n%s", log)
	}
}

// Every script answers --help without PyTorch (the GPU box's operator reads them before running anything).
func TestScriptsHelpWithoutTorch(t *testing.T) {
	py := python(t)
	for _, s := range []string{"bench.py", "worker.py", "report.py", "determinism.py", "memquota.py", "dstable.py",
		"gpuinfo.py", "rebind.py", "isolation.py", "graphsync.py", "kernelgrid.py", "mpsdet.py", "smtarget.py",
		"hami_probe.py"} {
		cmd := exec.Command(py, filepath.Join(here(t), s), "--help")
		cmd.Env = append(os.Environ(), "PYTHONPATH=/nonexistent") // no site torch either way
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(strings.ToLower(string(out)), "usage") {
			t.Errorf("%s --help: %v\n%s", s, err, out)
		}
	}
	if out := run(t, nil, "bash", filepath.Join(here(t), "hami.sh"), "--help"); !strings.Contains(out, "SRC: a HAMi-core checkout") {
		t.Errorf("hami.sh --help does not say what SRC is:\n%s", out)
	}
	if out, err := exec.Command("bash", filepath.Join(here(t), "hami.sh"), t.TempDir()).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "is not a HAMi-core source tree") {
		t.Errorf("hami.sh on a directory that is not HAMi-core: want a refusal naming why, got %v\n%s", err, out)
	}
	for _, s := range []string{"reclaim.sh", "mpsdet.sh", "coloc_prio.sh", "smtarget.sh"} {
		if out := run(t, nil, "bash", filepath.Join(here(t), s), "--help"); !strings.Contains(out, "OUTDIR") {
			t.Errorf("%s --help does not say what OUTDIR is:\n%s", s, out)
		}
	}
	out := run(t, nil, "bash", filepath.Join(here(t), "run_all.sh"), "--help")
	if !strings.Contains(out, "--quick") || !strings.Contains(out, "OUTDIR") {
		t.Errorf("run_all.sh --help does not document --quick and OUTDIR:\n%s", out)
	}
	cmd := exec.Command("bash", filepath.Join(here(t), "run_all.sh"), "--bogus", "x")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "unknown option --bogus") {
		t.Errorf("run_all.sh --bogus: want a refusal naming the option, got %v\n%s", err, out)
	}
}

// quotaKeys lists the keys of a quota file in order.
func quotaKeys(data []byte) []string {
	var keys []string
	for _, line := range strings.Split(string(data), "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys = append(keys, k)
		}
	}
	return keys
}

// The Python writer's table is what the Go mirror (internal/table) reads: header, GPU split, tenants, grants and
// client pages, and a grant published from Go is read back by Python.
func TestPythonTableMatchesGoMirror(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	run(t, nil, py, filepath.Join(here(t), "dstable.py"), "create", "--run-dir", dir, "--sms", "132",
		"--groups", "8,8,8,8,8,8,8,8,8,8,8,8,8,8,8", "--tenant", "lc:latency-critical:0-3:8589934592",
		"--tenant", "be:best-effort:4-14::none", "--tenant", "dec:burstable:0x3:0:decode")
	tb, err := table.OpenReadOnly(dir)
	if err != nil {
		t.Fatalf("Go cannot open the table Python wrote: %v", err)
	}
	defer tb.Close()
	gpus := tb.GPUs()
	if len(gpus) != 1 || gpus[0].SMCount != 132 || len(gpus[0].Split.Groups) != 15 || gpus[0].Split.Remainder != 12 || !gpus[0].Split.Published {
		t.Fatalf("GPU as Go sees it: %+v", gpus)
	}
	want := []struct {
		id     string
		tier   table.Tier
		groups uint64
		sms    uint32
		mem    uint64
	}{{"lc", table.TierLatencyCritical, 0xf, 32, 8 << 30}, {"be", table.TierBestEffort, 0x7ff0, 88, 0},
		{"dec", table.TierBurstable, 0x3, 16, 0}}
	for slot, w := range want {
		c := tb.Container(slot)
		id := strings.TrimRight(string(c.ID[:]), "\x00")
		if id != w.id || table.Tier(c.Tier) != w.tier || c.State != table.SlotActive || c.MemLimit != w.mem {
			t.Errorf("slot %d: id %q tier %d state %d mem %d, want %+v", slot, id, c.Tier, c.State, c.MemLimit, w)
		}
		g, err := tb.ReadGrant(slot)
		if err != nil || g.Groups != w.groups || g.SMs != w.sms || g.Mode != table.ModeSpatial {
			t.Errorf("slot %d grant %+v (%v), want groups %#x sms %d spatial", slot, g, err, w.groups, w.sms)
		}
		cp, err := table.OpenClientPageReadOnly(filepath.Join(dir, "clients", w.id+".page"))
		if err != nil {
			t.Fatalf("client page of %s: %v", w.id, err)
		}
		if p := cp.Page(); p.Slot != uint32(slot) || p.SlotGen != c.Gen {
			t.Errorf("client page of %s: slot %d gen %d, table slot %d gen %d", w.id, p.Slot, p.SlotGen, slot, c.Gen)
		}
		cp.Close()
	}
	if table.Role(tb.Container(2).Role) != table.RoleDecode {
		t.Errorf("dec role = %d, want decode", tb.Container(2).Role)
	}
	q, err := os.ReadFile(filepath.Join(dir, "tenants", "lc", "quota"))
	if err != nil || !strings.Contains(string(q), "slot=0\n") || !strings.Contains(string(q), "table="+dir+"/table\n") {
		t.Fatalf("lc quota file: %v\n%s", err, q)
	}
	// Python writes the keys Go writes, in Go's order, and Go's parser reads them back.
	qf, err := quota.ParseFile(q)
	if err != nil || qf.ID != "lc" || qf.Slot != 0 || qf.SlotGen != tb.Container(0).Gen ||
		qf.ClientPage != filepath.Join(dir, "clients", "lc.page") || qf.Doorbell != filepath.Join(dir, "doorbell") {
		t.Errorf("lc quota file as Go parses it: %+v %v\n%s", qf, err, q)
	}
	if py, gokeys := quotaKeys(q), quotaKeys(quota.Render(qf)); strings.Join(py, " ") != strings.Join(gokeys, " ") {
		t.Errorf("dstable.py writes quota keys %q, cgroupgpu/quota.Render writes %q", py, gokeys)
	}
	// Go writes a grant; Python reads it back through its parsed layout.
	rw, err := table.Open(dir)
	if err != nil {
		t.Fatalf("open read-write: %v", err)
	}
	if err := rw.PublishGrant(1, table.Grant{Groups: 0x30, SMs: 16, Mode: table.ModeSpatial}); err != nil {
		t.Fatalf("PublishGrant: %v", err)
	}
	rw.Close()
	out := run(t, nil, py, "-c", `import sys, mmap, json; sys.path.insert(0, sys.argv[1]); import dstable
L = dstable.Layout(); f = open(sys.argv[2] + "/table", "rb"); mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
c = dstable.Region(mm, L["DS_CONTAINERS_OFFSET"] + L.structs["ds_container"].size, L.structs["ds_container"])
print(json.dumps({"groups": c.get("grant_groups"), "sms": c.get("grant_sms"), "seq": c.get("grant_seq")}))`,
		here(t), dir)
	var g struct{ Groups, SMs, Seq uint64 }
	if err := json.Unmarshal([]byte(out), &g); err != nil || g.Groups != 0x30 || g.SMs != 16 || g.Seq%2 != 0 {
		t.Fatalf("Python read of Go's grant: %s (%v)", out, err)
	}
}

// Bad input names the field and the allowed values, and leaves no run directory behind.
func TestPythonTableRefusesBadInput(t *testing.T) {
	py := python(t)
	for _, c := range []struct{ tenant, want string }{
		{"lc:gold:0-3", "tier='gold', allowed best-effort, burstable, latency-critical"},
		{"lc:latency-critical:0-15", "groups='0-15', the split has groups 0..14"},
		{"lc:best-effort:0-3:0:chef", "role='chef', allowed none, prefill, decode"},
		{"../x:best-effort:0", "id='../x'"},
	} {
		dir := filepath.Join(t.TempDir(), "run")
		cmd := exec.Command(py, filepath.Join(here(t), "dstable.py"), "create", "--run-dir", dir, "--sms", "132",
			"--groups", "8,8,8,8,8,8,8,8,8,8,8,8,8,8,8", "--tenant", c.tenant)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("--tenant %s: exit %v, want 2 with %q:\n%s", c.tenant, err, c.want, out)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("--tenant %s left %s behind", c.tenant, dir)
		}
	}
}

// hami_probe.py (does a preloaded limiter apply at all) on the simulated GPU (a test double, which runs no PTX): its
// driver-API path works, it reads the device's SM count rather than assuming an H100's, and it launches exactly
// what it counts (the double's own kernel count: the launches plus the one before the timed window).
func TestHamiProbeCountsWhatItLaunches(t *testing.T) {
	py := python(t)
	sim := filepath.Join(buildDir(t), "lib", "simgpu")
	need(t, filepath.Join(sim, "libcuda.so.1"))
	dir := t.TempDir()
	cmd := exec.Command(py, filepath.Join(here(t), "hami_probe.py"), "--duration", "0.2", "--blocks-per-sm", "2",
		"--spin-us", "1")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+sim, "DETSHARE_SIMGPU_STATE="+filepath.Join(dir, "simgpu-state"),
		"DETSHARE_SIMGPU_SMS=64", "DETSHARE_SIMGPU_CALLS=1")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hami_probe.py on the simulated GPU: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	var res struct {
		Launches int     `json:"launches"`
		PerS     float64 `json:"launches_per_s"`
		Grid     int     `json:"grid"`
		SMs      int     `json:"sms"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("hami_probe.py: not one JSON line: %v\n%s", err, stdout.String())
	}
	if res.SMs != 64 || res.Grid != 128 || res.Launches < 8 || res.Launches%8 != 0 || res.PerS <= 0 {
		t.Errorf("hami_probe.py: %+v, want 64 SMs, a grid of 2 blocks per SM and launches in batches of 8", res)
	}
	if want := fmt.Sprintf(" kernels=%d ", res.Launches+1); !strings.Contains(stderr.String(), want) {
		t.Errorf("the simulated GPU ran other than the %d launches counted plus one (want %q):\n%s", res.Launches,
			want, stderr.String())
	}
}

type probeOut struct {
	DistinctSMs int   `json:"distinct_sms"`
	SMs         []int `json:"sms"`
}

// The table and grants the Python stand-in writes drive the real libdetshare: on the simulated GPU (a test
// double) under simulated MPS, the LC tenant's kernels run on exactly its 32 SMs and the BE tenant's on the
// other 88, disjoint. gpuinfo.py reads the same split through the driver API.
func TestPythonGrantsConfineLibdetshareOnSimulatedGPU(t *testing.T) {
	py := python(t)
	b := buildDir(t)
	lib := filepath.Join(b, "lib", "libdetshare.so")
	sim := filepath.Join(b, "lib", "simgpu")
	probe := filepath.Join(b, "tests", "simgpu-probe")
	need(t, lib, filepath.Join(sim, "libcuda.so.1"), probe)
	dir := t.TempDir()
	env := []string{"LD_LIBRARY_PATH=" + sim, "DETSHARE_SIMGPU_STATE=" + filepath.Join(dir, "simgpu-state"),
		"DETSHARE_SIMGPU_MPS=1"}
	var info struct {
		Name  string
		SMs   int `json:"sms"`
		Split struct {
			Groups    []int
			Remainder int
		}
	}
	if err := json.Unmarshal([]byte(run(t, env, py, filepath.Join(here(t), "gpuinfo.py"))), &info); err != nil {
		t.Fatalf("gpuinfo.py: %v", err)
	}
	if info.SMs != 132 || len(info.Split.Groups) != 15 || info.Split.Remainder != 12 ||
		!strings.Contains(info.Name, "simulated") {
		t.Fatalf("gpuinfo.py on the simulated GPU: %+v, want 132 SMs split 15x8 + 12", info)
	}
	groups := strings.Trim(strings.Join(strings.Fields(strings.Trim(strings.Repeat("8 ", 15), " ")), ","), ",")
	run(t, nil, py, filepath.Join(here(t), "dstable.py"), "create", "--run-dir", filepath.Join(dir, "run"), "--sms",
		"132", "--groups", groups, "--tenant", "lc:latency-critical:0-3", "--tenant", "be:best-effort:4-14")
	sms := map[string]map[int]bool{}
	for _, tc := range []struct {
		id   string
		want int
	}{{"lc", 32}, {"be", 100}} { // be: groups 4-14 (88 SMs) and the 12 left over, which run with group 14
		out := run(t, append(env, "LD_PRELOAD="+lib, "DETSHARE_QUOTA_FILE="+filepath.Join(dir, "run", "tenants", tc.id,
			"quota")), probe, "spin", "--blocks", "132", "--us", "100", "--iters", "2")
		var p probeOut
		line := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			t.Fatalf("%s: probe output %q: %v", tc.id, out, err)
		}
		if p.DistinctSMs != tc.want {
			t.Fatalf("%s: kernels ran on %d SMs, its grant has %d (output %s)", tc.id, p.DistinctSMs, tc.want, out)
		}
		sms[tc.id] = map[int]bool{}
		for _, s := range p.SMs {
			sms[tc.id][s] = true
		}
	}
	for s := range sms["lc"] {
		if sms["be"][s] {
			t.Fatalf("SM %d used by both tenants: grants are not disjoint", s)
		}
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// report.py's arithmetic on recorded inputs whose answers are known: P99 ratio to solo, normalised throughput
// and their sum, bit-equality, TPOT violation rates and the targets' verdicts.
func TestReportArithmetic(t *testing.T) {
	py := python(t)
	out := t.TempDir()
	raw := filepath.Join(out, "raw")
	if err := os.MkdirAll(raw, 0o755); err != nil {
		t.Fatal(err)
	}
	lc := func(cfg string, svc float64, hash string) map[string]any {
		var reqs [][3]float64
		for i := 0; i < 100; i++ {
			a := 0.05 + 0.1*float64(i)
			reqs = append(reqs, [3]float64{a, a, a + svc})
		}
		return map[string]any{"group": "p", "config": cfg, "label": "lc", "role": "infer", "duration": 10.0,
			"requests": reqs, "offered": 100, "rate": 10.0, "calibration": map[string]any{"mean_s": 0.01},
			"output_hash": hash, "output_hashes": map[string]int{hash: 100}}
	}
	be := func(cfg string, period float64) map[string]any {
		var ends []float64
		for x := period / 2; x < 10; x += period {
			ends = append(ends, x)
		}
		return map[string]any{"group": "p", "config": cfg, "label": "be", "role": "train", "duration": 10.0,
			"step_ends": ends}
	}
	dec := func(cfg string, every int) map[string]any {
		var st []float64
		x := 0.0
		for i := 1; x < 10; i++ {
			st = append(st, x)
			if every > 0 && i%every == 0 {
				x += 0.150
			} else {
				x += 0.010
			}
		}
		return map[string]any{"group": "llm", "config": cfg, "label": "decode", "role": "decode", "duration": 10.0,
			"batch": 1, "token_stamps": st, "output_hash": "d"}
	}
	writeJSON(t, filepath.Join(raw, "a_lc.json"), lc("alone", 0.010, "h"))
	writeJSON(t, filepath.Join(raw, "a_be.json"), be("alone", 0.1))
	writeJSON(t, filepath.Join(raw, "d_lc.json"), lc("detshare", 0.020, "h"))
	writeJSON(t, filepath.Join(raw, "d_be.json"), be("detshare", 0.2))
	writeJSON(t, filepath.Join(raw, "m_lc.json"), lc("mps", 0.050, "x"))
	writeJSON(t, filepath.Join(raw, "m_be.json"), be("mps", 0.4))
	writeJSON(t, filepath.Join(raw, "l_a.json"), dec("alone", 0))
	writeJSON(t, filepath.Join(raw, "l_to.json"), dec("detshare-to", 10))
	writeJSON(t, filepath.Join(raw, "l_tp.json"), dec("detshare-tpot", 40))
	writeJSON(t, filepath.Join(out, "meta.json"), map[string]any{"started": "T", "gpu": map[string]any{"name": "G",
		"sms": 132}, "duration": 10, "load": 0.5, "lc_groups": 4, "tpot_slo_ms": 100})
	md := run(t, nil, py, filepath.Join(here(t), "report.py"), out)
	var res struct {
		Infer map[string]map[string]struct {
			LCSvcP99Ratio *float64 `json:"lc_svc_p99_ratio"`
			LCNorm        *float64 `json:"lc_norm"`
			BENorm        *float64 `json:"be_norm"`
			Sum           *float64 `json:"sum"`
			BitIdentical  *bool    `json:"bit_identical"`
		}
		LLM     map[string]json.RawMessage
		Targets []struct {
			What string
			Met  *bool
			Miss string
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil || json.Unmarshal(b, &res) != nil {
		t.Fatalf("results.json: %v\n%s", err, b)
	}
	near := func(name string, got *float64, want float64) {
		if got == nil || *got < want-1e-6 || *got > want+1e-6 {
			t.Errorf("%s = %v, want %g", name, got, want)
		}
	}
	d := res.Infer["p"]["detshare"]
	near("detshare LC P99 ratio", d.LCSvcP99Ratio, 2.0)
	near("detshare LC norm (90 served in 9 s / capacity 100)", d.LCNorm, 0.1)
	near("detshare BE norm", d.BENorm, 0.5)
	near("detshare sum", d.Sum, 0.6)
	near("mps LC P99 ratio", res.Infer["p"]["mps"].LCSvcP99Ratio, 5.0)
	near("mps BE norm (23 steps in 9 s vs 10/s)", res.Infer["p"]["mps"].BENorm, 23.0/90)
	if d.BitIdentical == nil || !*d.BitIdentical {
		t.Errorf("detshare bit_identical = %v, want true (same hash as alone)", d.BitIdentical)
	}
	if m := res.Infer["p"]["mps"].BitIdentical; m == nil || *m {
		t.Errorf("mps bit_identical = %v, want false (hash differs)", m)
	}
	var cut float64
	if err := json.Unmarshal(res.LLM["tpot_violation_cut"], &cut); err != nil || cut < 0.7 || cut > 0.8 {
		t.Errorf("TPOT violation cut = %v (%v), want ~0.75 (every 10th vs every 40th gap over the SLO)", cut, err)
	}
	verdict := map[string]string{}
	for _, tg := range res.Targets {
		v := "unmeasured"
		if tg.Met != nil {
			v = map[bool]string{true: "met", false: "missed " + tg.Miss}[*tg.Met]
		}
		verdict[tg.What] = v
	}
	for what, want := range map[string]string{
		"p: LC P99 (service) within 5% of solo beside training":   "missed by 0.95",
		"p: BE keeps >= 50% of its solo throughput":               "met",
		"p: LC outputs bit-identical to solo":                     "met",
		"LLM: TPOT violations at least 20% lower with TPOT-First": "met",
	} {
		if verdict[what] != want {
			t.Errorf("target %q: %q, want %q (all: %v)", what, verdict[what], want, verdict)
		}
	}
	for _, s := range []string{"| detshare |", "| mps |", "**NO**", "### Targets (issue 8)", "TPOT-First vs throughput-oriented"} {
		if !strings.Contains(md, s) {
			t.Errorf("results.md lacks %q:\n%s", s, md)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "latency_cdf.csv")); err != nil {
		t.Errorf("latency_cdf.csv not written: %v", err)
	}
}

// The whole harness, end to end, on CPU with tiny models (PyTorch without a GPU) under the real `detshare sched`
// on the simulated GPU (a test double): workers start together, results land in raw/, the report compares
// configurations, the library is preloaded where it should be, and the determinism script finds CPU runs
// bit-identical. It checks the plumbing, not performance.
func TestHarnessOnCPU(t *testing.T) {
	tpy := torchPython(t)
	py := python(t)
	b := buildDir(t)
	lib := filepath.Join(b, "lib", "libdetshare.so")
	ds := filepath.Join(b, "bin", "detshare")
	need(t, lib, ds)
	out := t.TempDir()
	run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", out, "--device", "cpu", "--suite", "infer",
		"--pairs", "quick", "--configs", "alone,detshare", "--duration", "1", "--python", tpy, "--lib", lib,
		"--detshare", ds)
	md := run(t, nil, py, filepath.Join(here(t), "report.py"), out)
	for _, s := range []string{"| alone |", "| detshare |", "yes"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
	logb, err := os.ReadFile(filepath.Join(out, "logs", "infer_resnet50-resnet50_detshare__lc.log"))
	if err != nil || !strings.Contains(string(logb), "tenant lc slot") {
		t.Errorf("the detshare case's LC worker did not run under the library as tenant lc: %v\n%s", err, logb)
	}
	var r map[string]any
	rb, _ := os.ReadFile(filepath.Join(out, "raw", "infer_resnet50-resnet50_detshare__lc.json"))
	if json.Unmarshal(rb, &r) != nil || r["grant_mid_run"] == nil {
		t.Errorf("detshare LC result lacks the grant it ran under: %s", rb)
	} else if g := r["grant_mid_run"].(map[string]any); g["sms"] != float64(32) || g["pinned"] != true {
		t.Errorf("LC grant %v, want 32 SMs (4 groups), pinned", g)
	}
	det := t.TempDir()
	dm := run(t, nil, py, filepath.Join(here(t), "determinism.py"), det, "--device", "cpu", "--tiny", "--steps", "3",
		"--modes", "native,lib-changing",
		"--python", tpy, "--lib", lib)
	if !strings.Contains(dm, "**bit-identical**") || !strings.Contains(dm, "| lib-changing | yes |") {
		t.Errorf("determinism on CPU:\n%s", dm)
	}
}

// The library configurations run under the real `detshare sched` with workers started by `detshare run` (on CPU
// the scheduler describes the simulated GPU, a test double): the tenants it registered carry the tiers and the LC
// guarantee the benchmark asked for, and the case's results land as usual.
func TestHarnessWithRealSchedulerOnCPU(t *testing.T) {
	tpy := torchPython(t)
	py := python(t)
	b := buildDir(t)
	lib := filepath.Join(b, "lib", "libdetshare.so")
	ds := filepath.Join(b, "bin", "detshare")
	need(t, lib, ds)
	out := t.TempDir()
	run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", out, "--device", "cpu", "--suite", "infer",
		"--pairs", "quick", "--configs", "detshare", "--duration", "4", "--python", tpy, "--lib", lib,
		"--scheduler", "detshare", "--detshare", ds) // --scheduler detshare: still accepted from old command lines
	// bench.py looks at the scheduler every 0.25 s from the start signal on and keeps the last look in which both
	// tenants were registered (a single look at a fixed time, taken late on a loaded CI machine, once saw only the
	// trainer, whose last CPU step outlived the LC).
	b2, err := os.ReadFile(filepath.Join(out, "logs", "infer_resnet50-resnet50_detshare__status.json"))
	if err != nil {
		t.Fatalf("no scheduler snapshot: %v", err)
	}
	// and every look in short, one JSON line each, for the report's means over the run
	looks, err := os.ReadFile(filepath.Join(out, "logs", "infer_resnet50-resnet50_detshare__looks.jsonl"))
	if err != nil {
		t.Fatalf("no looks kept: %v", err)
	}
	for i, line := range strings.Split(strings.TrimSpace(string(looks)), "\n") {
		var l struct {
			Tenants []struct {
				ID          string `json:"id"`
				GrantGroups *int   `json:"grant_groups"`
			} `json:"tenants"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || len(l.Tenants) != 2 || l.Tenants[0].GrantGroups == nil {
			t.Fatalf("look %d: %v %q", i, err, line)
		}
	}
	var st struct {
		Tenants []struct {
			ID            string `json:"id"`
			Tier          string `json:"tier"`
			GuaranteedSMs int    `json:"guaranteed_sms"`
		} `json:"tenants"`
	}
	if err := json.Unmarshal(b2, &st); err != nil {
		t.Fatalf("status snapshot: %v\n%s", err, b2)
	}
	got := map[string]string{}
	for _, tn := range st.Tenants {
		got[tn.ID] = tn.Tier + "/" + strconv.Itoa(tn.GuaranteedSMs)
	}
	if got["lc"] != "latency-critical/32" || got["be"] != "best-effort/0" {
		logs, _ := filepath.Glob(filepath.Join(out, "logs", "*"))
		var tails strings.Builder
		for _, l := range logs {
			if lb, err := os.ReadFile(l); err == nil {
				fmt.Fprintf(&tails, "--- %s (last 2000 bytes)\n%s\n", filepath.Base(l), lb[max(0, len(lb)-2000):])
			}
		}
		t.Fatalf("tenants seen by detshare sched mid-run: %v, want lc latency-critical/32 and be best-effort/0\n"+
			"snapshot: %s\n%s", got, b2, tails.String())
	}
	for _, l := range []string{"lc", "be"} {
		var r map[string]any
		rb, err := os.ReadFile(filepath.Join(out, "raw", "infer_resnet50-resnet50_detshare__"+l+".json"))
		if err != nil || json.Unmarshal(rb, &r) != nil || !strings.HasPrefix(fmt.Sprint(r["scheduler"]), "detshare sched") {
			t.Errorf("%s result missing or not marked as run under detshare sched: %v %s", l, err, rb)
		}
	}
}

// rebind.py's analysis on a synthetic trace with known answers: the SM ids of each group are learnt from the
// calibration windows, and each flip's delay is measured to the first kernel that ran only on the new SMs, with
// the kernel still in flight on the old SMs counted as stale.
func TestRebindAnalysis(t *testing.T) {
	py := python(t)
	prog := `import sys, json; sys.path.insert(0, sys.argv[1]); import rebind
MS = 1_000_000
groups = {g: list(range(8 * g, 8 * g + 8)) for g in range(8)}
events, recs, now = [], [], 0
def kernels(until, sms):
    global now
    while now + MS <= until:
        recs.append((now, now + 10_000, now + 200_000, sms)); now += MS
for g in range(8):
    events.append(("calib", 1 << g, now)); kernels(now + 150 * MS, groups[g])
A, B = 0x0f, 0xf0
cur = sum((groups[g] for g in range(4)), [])
for i in range(4):
    m = (A, B)[i % 2]
    new = sum((groups[g] for g in range(8) if m >> g & 1), [])
    pub = now + 100_000          # published 100 us after the last launch, which is still in flight (stale)
    events.append(("flip", m, pub))
    recs.append((now, now + 10_000, now + 300_000, cur)); now = pub + 50_000   # next launch 50 us after publication
    kernels(now + 50 * MS, new); cur = new
s, d = rebind.analyze(events, recs)
print(json.dumps(s))`
	var s struct {
		Flips     int            `json:"flips"`
		Confined  int            `json:"confined_flips"`
		LaunchP50 float64        `json:"launch_us_p50"`
		DoneP50   float64        `json:"done_us_p50"`
		StaleMax  int            `json:"stale_kernels_max"`
		Groups    map[string]int `json:"group_sm_counts"`
	}
	out := run(t, nil, py, "-c", prog, here(t))
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if s.Flips != 4 || s.Confined != 4 || s.LaunchP50 != 50 || s.DoneP50 != 250 || s.StaleMax != 1 ||
		len(s.Groups) != 8 || s.Groups["3"] != 8 {
		t.Fatalf("analysis of the synthetic trace: %s; want 4/4 flips confined, launch 50 us, done 250 us, 1 stale "+
			"kernel, 8 groups of 8 SMs", out)
	}
}

// isolation.py report: each LC workload's median over runs, its change against no neighbour, and the SM clock and
// power nvidia-smi logged inside that workload's window only.
func TestIsolationReport(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	var results, clocks strings.Builder
	t0 := float64(time.Now().Add(-time.Hour).Unix())
	lc := func(tag, name string, at, median float64) {
		fmt.Fprintf(&results, `{"tag": %q, "lc": %q, "n": 100, "median_ms": %g, "p99_ms": %g, "t0": %g, "t1": %g, "hash": "h1"}`+"\n",
			tag, name, median, median*1.1, t0+at, t0+at+4)
	}
	lc("none", "gemm", 0, 1.00)
	lc("none", "gemm", 100, 1.02)
	lc("none", "gemm", 200, 0.98)
	lc("train", "gemm", 10, 1.10)
	lc("train", "gemm", 110, 1.04)
	for s := 0.0; s < 300; s += 0.5 {
		mhz := 1980
		if (s >= 10 && s <= 14) || (s >= 110 && s <= 114) {
			mhz = 1800 // a neighbour's load lowers the clock only inside its windows
		}
		ts := time.Unix(int64(t0+s), int64((s-float64(int64(s)))*1e9)).Local().Format("2006/01/02 15:04:05.000")
		fmt.Fprintf(&clocks, "%s, %d, 2619, %d\n", ts, mhz, 300+mhz/10)
	}
	clocks.WriteString("not a row\n")
	rp, cp := filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "clocks.csv")
	if err := os.WriteFile(rp, []byte(results.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cp, []byte(clocks.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(t, nil, py, filepath.Join(here(t), "isolation.py"), "report", rp, cp)
	for _, want := range []string{
		"| gemm | none | 1.000 / 1.020 / 0.980 | +0.0% |",
		"| gemm | train | 1.100 / 1.040 | +7.0% |", // median of 1.10 and 1.04 = 1.07 against 1.00
		"| 1980 | 498 | h1 |",
		"| 1800 | 480 | h1 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// Issue 26: a trainer's result says whether its first losses were finite, so that a configuration that breaks its
// math (the bf16 trainer under MPS at 67 and 80 % of threads computed NaN on the H100) is not read as throughput.
func TestWorkerRecordsWhetherLossesAreFinite(t *testing.T) {
	py := python(t)
	facts := run(t, nil, py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import worker; "+
		"print(worker.loss_facts([1.5, float('nan')])); print(worker.loss_facts([1.5, 2.0]))", here(t))
	if !strings.Contains(facts, "'losses_first5': ['1.5', 'nan'], 'losses_finite': False") ||
		!strings.Contains(facts, "'losses_first5': ['1.5', '2.0'], 'losses_finite': True") {
		t.Fatalf("loss_facts:\n%s", facts)
	}
	tpy := torchPython(t)
	out := filepath.Join(t.TempDir(), "train.json")
	run(t, nil, tpy, filepath.Join(here(t), "worker.py"), "--role", "train", "--model", "gpt2-tiny",
		"--device", "cpu", "--duration", "0.5", "--warmup", "1", "--out", out)
	var r map[string]any
	b, err := os.ReadFile(out)
	if err != nil || json.Unmarshal(b, &r) != nil {
		t.Fatalf("worker result: %v\n%s", err, b)
	}
	if r["losses_finite"] != true || len(r["losses_first5"].([]any)) != 5 {
		t.Errorf("a tiny GPT-2 trainer on CPU: losses_finite %v, losses_first5 %v", r["losses_finite"], r["losses_first5"])
	}
}
