package gpu

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The co-location plan (issue 12): every LC workload beside every trainer in every configuration, each workload
// alone once, DetShare-static pinned and DetShare-dynamic lending when asked.
func TestColocPlan(t *testing.T) {
	py := python(t)
	ds := filepath.Join(buildDir(t), "bin", "detshare")
	need(t, ds)
	out := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--dry-run")
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "coloc/") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 62 {
		t.Fatalf("%d cases, want 3 LC + 2 trainers alone, 3 LC alone under MPS and 3 x 2 x 9 shared = 62:\n%s",
			len(lines), out)
	}
	for _, want := range []string{"coloc/bert/alone", "coloc/llama-step/alone", "coloc/lin8192-fp32/alone",
		"coloc/resnet50+lin8192-bf16/detshare-dynamic", "coloc/llama-step+lin8192-fp32/mps-pct", "(MPS 66%)",
		"coloc/bert+lin8192-bf16/detshare-dynamic-noprio", "coloc/llama-step/alone-mps", "coloc/resnet50+lin8192-fp32/detshare-dynamic-pause",
		"coloc/llama-step+lin8192-bf16/detshare-temporal"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	// only the trainer is lowered under plain MPS; with the library the tier decides, unless switched off
	for _, l := range lines {
		f := strings.Fields(l)
		// MPS for every shared configuration but time-slicing and DetShare's temporal mode (no MPS by definition)
		if wantMPS := f[1] != "alone" && f[1] != "timeslice" && f[1] != "detshare-temporal"; strings.HasSuffix(l, " [MPS]") != wantMPS {
			t.Errorf("%s: under MPS = %v, want %v: %s", f[1], !wantMPS, wantMPS, l)
		}
		lcPart, bePart, _ := strings.Cut(l, " | be: ")
		switch {
		case f[1] == "mps-prio" && (strings.Contains(lcPart, "CUDA_MPS_CLIENT_PRIORITY") ||
			!strings.Contains(bePart, "(CUDA_MPS_CLIENT_PRIORITY=1)")):
			t.Errorf("mps-prio must lower the trainer alone: %s", l)
		case f[1] == "detshare-dynamic-noprio" && strings.Count(l, "(DETSHARE_MPS_PRIORITY=off)") != 2:
			t.Errorf("detshare-dynamic-noprio must switch the tier priority off for both: %s", l)
		case f[1] != "mps-prio" && f[1] != "detshare-dynamic-noprio" && strings.Contains(l, "PRIORITY"):
			t.Errorf("%s must leave priorities alone: %s", f[1], l)
		}
	}
	// issue 26's sweep: any DetShare configuration with -n<N> (scheduler.narrow_groups = N) is planned as asked; a width
	// the scheduler would refuse is refused here first, naming the allowed range
	swept := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--dry-run", "--coloc-lc", "bert", "--coloc-be", "lin8192-fp32", "--configs",
		"alone,detshare-overlap0.25-n6,detshare-default-n1,detshare-sloov1.5x-n4")
	for _, want := range []string{"coloc/bert+lin8192-fp32/detshare-overlap0.25-n6",
		"coloc/bert+lin8192-fp32/detshare-default-n1", "coloc/bert+lin8192-fp32/detshare-sloov1.5x-n4"} {
		if !strings.Contains(swept, want) {
			t.Errorf("plan lacks %q:\n%s", want, swept)
		}
	}
	// each trainer alone on part of the GPU: under MPS at a thread percentage, or under DetShare pinned to S SMs as a
	// latency-critical tenant (nothing beside it narrows it); no LC runs in these cases
	alone := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--dry-run", "--coloc-lc", "bert", "--coloc-be", "lin8192-fp32,lin8192-bf16",
		"--configs", "alone,trainer-mps67,trainer-sm88")
	for _, l := range strings.Split(alone, "\n") {
		switch {
		case strings.Contains(l, "coloc/lin8192-fp32/trainer-mps67") || strings.Contains(l, "coloc/lin8192-bf16/trainer-mps67"):
			if !strings.Contains(l, "(MPS 67%)") || strings.Contains(l, "lc:") {
				t.Errorf("trainer-mps67 must run the trainer alone at 67 %% of threads: %s", l)
			}
		case strings.Contains(l, "trainer-sm88"):
			if strings.Contains(l, "lc:") || strings.Contains(l, "MPS ") {
				t.Errorf("trainer-sm88 must run the trainer alone under the scheduler: %s", l)
			}
		}
	}
	for _, want := range []string{"coloc/lin8192-fp32/trainer-sm88", "coloc/lin8192-bf16/trainer-sm88",
		"coloc/lin8192-bf16/trainer-mps67"} {
		if !strings.Contains(alone, want) {
			t.Errorf("plan lacks %q:\n%s", want, alone)
		}
	}
	// trainer-hami<P>: each trainer alone under HAMi-core, its library and limit on the trainer, without MPS
	ha, hamiAlone := planLine(t, py, ds, "coloc/lin8192-bf16/trainer-hami30", "--coloc-lc", "bert", "--coloc-be",
		"lin8192-bf16", "--configs", "alone,trainer-hami30", "--hami-lib", "/opt/hami/libvgpu.so")
	if !strings.Contains(hamiAlone, "(LD_PRELOAD=/opt/hami/libvgpu.so)") || !strings.Contains(hamiAlone, "(CUDA_DEVICE_SM_LIMIT=30)") ||
		strings.Contains(hamiAlone, "lc:") || strings.Contains(hamiAlone, "[MPS]") || strings.Contains(ha, "+lin8192-bf16/trainer-hami") {
		t.Errorf("trainer-hami30: want the trainer alone under HAMi-core at 30 %%, no LC, no MPS:\n%s", ha)
	}
	benchRefuses(t, py, "HAMi-core's SM limit is a percentage 1..100",
		"--device", "cpu", "--suite", "coloc", "--configs", "trainer-hami101", "--dry-run")
	// on the GPU a HAMi-core case shorter than its limiter's cycle measures its unlimited start (issue 26, run D);
	// refused before the GPU is queried, so this runs where there is none
	fakeHami := filepath.Join(t.TempDir(), "libvgpu.so")
	if err := os.WriteFile(fakeHami, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	benchRefuses(t, py, "--duration 5 with --configs hami-sm30,trainer-hami30: HAMi-core's limiter settles over seconds",
		"--device", "cuda", "--suite", "coloc", "--configs", "alone,trainer-hami30,hami-sm30", "--duration", "5",
		"--hami-lib", fakeHami, "--dry-run")
	if strings.Contains(alone, "+lin8192-fp32/trainer-") {
		t.Errorf("a trainer-alone configuration was planned beside an LC:\n%s", alone)
	}
	benchRefuses(t, py, "the thread percentage must be 1..100",
		"--device", "cpu", "--suite", "coloc", "--configs", "trainer-mps0", "--dry-run")
	benchRefuses(t, py, "the trainer needs at least one SM",
		"--device", "cpu", "--suite", "coloc", "--configs", "trainer-sm0", "--dry-run")
	benchRefuses(t, py, "narrow_groups (-n<N>) is 0..63",
		"--device", "cpu", "--suite", "coloc", "--configs", "detshare-overlap0.25-n64", "--dry-run")
	// a named configuration is recognised by its whole name: with a suffix it would run as another one
	benchRefuses(t, py, "-n<N> applies to detshare-default and the numbered DetShare configurations",
		"--device", "cpu", "--suite", "coloc", "--configs", "detshare-temporal-n2", "--dry-run")
	// --be-env reaches every trainer, alone included, and no LC; it may not override what the harness sets
	plan := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--configs", "alone,mps", "--be-env", "DISABLE_ADDMM_CUDA_LT=1", "--dry-run")
	trainers := 0
	for _, l := range strings.Split(plan, "\n") {
		if !strings.HasPrefix(l, "coloc/") {
			continue
		}
		lcPart, bePart, _ := strings.Cut(l, "be: ")
		if bePart != "" {
			trainers++
		}
		if strings.Contains(lcPart, "DISABLE_ADDMM_CUDA_LT") || (bePart != "" && !strings.Contains(bePart, "(DISABLE_ADDMM_CUDA_LT=1)")) {
			t.Errorf("--be-env must reach every trainer and no LC: %s", l)
		}
	}
	if trainers < 8 { // 2 trainers alone and 3 LCs x 2 trainers under MPS
		t.Errorf("--be-env plan: %d cases with a trainer, want 8:\n%s", trainers, plan)
	}
	benchRefuses(t, py, "not one the harness sets itself",
		"--device", "cpu", "--suite", "coloc", "--be-env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "--dry-run")
	benchRefuses(t, py, "KEY=VALUE", "--device", "cpu", "--suite", "coloc", "--be-env", "NOVALUE", "--dry-run")
	// -n<N>-noprio: the numbered configuration with its narrow width, every tenant at normal MPS priority
	np := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--coloc-lc", "bert", "--coloc-be", "lin8192-bf16", "--configs",
		"detshare-overlap0.05-n0-noprio", "--dry-run")
	if !strings.Contains(np, "coloc/bert+lin8192-bf16/detshare-overlap0.05-n0-noprio") ||
		strings.Count(np, "(DETSHARE_MPS_PRIORITY=off)") != 2 {
		t.Errorf("detshare-overlap0.05-n0-noprio: want the case with both tenants at normal priority:\n%s", np)
	}
	// HAMi-core (a peer): the trainer preloads its library with the SM limit and a shared-state file of the case's own,
	// the LC runs without either, and neither runs under MPS
	hp, hamiCase := planLine(t, py, ds, "coloc/bert+lin8192-bf16/hami-sm50", "--coloc-lc", "bert", "--coloc-be",
		"lin8192-bf16", "--configs", "alone,hami-sm50", "--hami-lib", "/opt/hami/libvgpu.so")
	lcPart, bePart, _ := strings.Cut(hamiCase, "be: ")
	if !strings.Contains(bePart, "(LD_PRELOAD=/opt/hami/libvgpu.so)") || !strings.Contains(bePart, "(CUDA_REDIRECT=/opt/hami/libvgpu.so)") ||
		!strings.Contains(bePart, "(CUDA_DEVICE_SM_LIMIT=50)") ||
		!strings.Contains(bePart, "hami-coloc_bert-lin8192-bf16_hami-sm50.cache)") || strings.Contains(lcPart, "LD_PRELOAD") ||
		strings.Contains(lcPart, "CUDA_REDIRECT") || strings.Contains(hamiCase, "[MPS]") {
		t.Errorf("hami-sm50: want the trainer under HAMi-core at 50 %%, the LC plain, no MPS:\n%s", hp)
	}
	benchRefuses(t, py, "HAMi-core's SM limit is a percentage 1..100",
		"--device", "cpu", "--suite", "coloc", "--configs", "hami-sm0", "--dry-run")
	benchRefuses(t, py, "HAMi-core limits a GPU; on --device cpu only with --dry-run",
		"--device", "cpu", "--suite", "coloc", "--configs", "hami-sm50")
	benchRefuses(t, py, "HAMi-core's library /nonexistent/libvgpu.so is missing",
		"--suite", "coloc", "--configs", "hami-sm50", "--hami-lib", "/nonexistent/libvgpu.so", "--dry-run")
	// the trainers' cuBLAS SM target is a GPU diagnostic: on CPU there is no cuBLAS to tell
	benchRefuses(t, py, "--be-sm-target 88: a number of SMs >= 1 (0: off), on --device cuda only",
		"--device", "cpu", "--suite", "coloc", "--be-sm-target", "88", "--dry-run")
	benchRefuses(t, py, "--be-sm-target -1: a number of SMs >= 1",
		"--suite", "coloc", "--be-sm-target", "-1", "--dry-run")
	// detshare-shared (the frontier's unprotected end): run only when named; the LC is labelled best-effort like the
	// trainer and the scheduler grants busy sharers every group (share_overlap), with no LC partition or narrowing;
	// what `detshare sched` and `detshare run` are given, from bench.py's own functions
	if strings.Contains(out, "detshare-shared") || strings.Contains(out, "detshare-timeshared") {
		t.Errorf("detshare-shared and detshare-timeshared must run only when named:\n%s", out)
	}
	tmp := t.TempDir()
	given := run(t, []string{"TMPDIR=" + tmp}, py, "-c", `import sys, json; sys.path.insert(0, sys.argv[1]); import bench
a = bench.parse(["--out", sys.argv[2], "--device", "cpu", "--suite", "coloc", "--coloc-lc", "bert", "--coloc-be",
                 "lin8192-bf16", "--configs", "alone,detshare-shared,detshare-timeshared,detshare-overlap0.05-n0,detshare-overlap0.05-n0-lend", "--dry-run"])
r = bench.Runner(a)
r.gpu = r.gpu_info()
print(json.dumps({c.config: {"config": r.sched_config(c), "flags": r.tenant_flags(c), "mps": c.needs_mps} for c in r.plan() if c.uses_lib()}))`,
		here(t), tmp)
	var sched map[string]struct {
		Config string              `json:"config"`
		Flags  map[string][]string `json:"flags"`
		MPS    bool                `json:"mps"`
	}
	gl := strings.Split(strings.TrimSpace(given), "\n") // bench.py may log before the JSON line
	if err := json.Unmarshal([]byte(gl[len(gl)-1]), &sched); err != nil {
		t.Fatalf("sched_config/tenant_flags: %v\n%s", err, given)
	}
	sh, ok := sched["detshare-shared"]
	if !ok || strings.Join(sh.Flags["lc"], " ") != "--tier best-effort" || strings.Join(sh.Flags["be"], " ") != "--tier best-effort" ||
		!strings.Contains(sh.Config, "share_overlap = true") || strings.Contains(sh.Config, "lc_reserve") ||
		strings.Contains(sh.Config, "narrow_groups") {
		t.Errorf("detshare-shared: want both tenants best-effort under share_overlap, nothing else: %+v", sched)
	}
	// detshare-timeshared: the same tenants and share_overlap on a GPU without MPS (the scheduler then leaves them to
	// the driver's time-slicing): MPS neither enabled in its config nor started for it
	if ts, ok := sched["detshare-timeshared"]; !ok || !sh.MPS || ts.MPS || strings.Join(ts.Flags["lc"], " ") != "--tier best-effort" ||
		strings.Join(ts.Flags["be"], " ") != "--tier best-effort" ||
		ts.Config != strings.Replace(sh.Config, "[mps]\nenable = true\n", "[mps]\nenable = false\n", 1) || ts.Config == sh.Config {
		t.Errorf("detshare-timeshared: want detshare-shared with mps.enable = false and no MPS daemon: %+v", sched)
	}
	if ov := sched["detshare-overlap0.05-n0"]; strings.Join(ov.Flags["lc"], " ") != "--tier latency-critical --sm 32" ||
		!strings.Contains(ov.Config, "lc_reserve = 0.05\nlc_overlap = true\nnarrow_groups = 0\n") ||
		strings.Contains(ov.Config, "share_overlap") {
		t.Errorf("detshare-overlap0.05-n0: want the LC latency-critical with its 4-group guarantee, a 0.05 partition overlapping, no "+
			"narrowing: %+v", ov)
	}
	// -n<N>-lend: the same partition and narrowing, the LC also lending its idle partition; the trainer unchanged
	if ld := sched["detshare-overlap0.05-n0-lend"]; strings.Join(ld.Flags["lc"], " ") != "--tier latency-critical --sm 32 --lend" ||
		ld.Config != sched["detshare-overlap0.05-n0"].Config || strings.Join(ld.Flags["be"], " ") != "--tier best-effort" {
		t.Errorf("detshare-overlap0.05-n0-lend: want detshare-overlap0.05-n0 with the LC's --lend: %+v", sched)
	}
	// the Python stand-in scheduler is gone: an old command line that asks for it is refused, naming why
	benchRefuses(t, py, "the only scheduler is the real `detshare sched`",
		"--device", "cpu", "--suite", "coloc", "--scheduler", "python", "--dry-run")
}

// planLine runs bench.py's coloc plan on CPU (--dry-run) with args and returns the whole plan and its line for the
// case whose name starts with prefix ("" when there is none).
func planLine(t *testing.T, py, ds, prefix string, args ...string) (plan, line string) {
	t.Helper()
	plan = run(t, nil, py, append([]string{filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu",
		"--suite", "coloc", "--detshare", ds, "--dry-run"}, args...)...)
	for _, l := range strings.Split(plan, "\n") {
		if strings.HasPrefix(l, prefix) {
			line = l
		}
	}
	return plan, line
}

// benchRefuses wants bench.py, given args, to fail with a message that contains want (what was wrong, and why).
func benchRefuses(t *testing.T, py, want string, args ...string) {
	t.Helper()
	cmd := exec.Command(py, append([]string{filepath.Join(here(t), "bench.py"), "--out", t.TempDir()}, args...)...)
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), want) {
		t.Fatalf("bench.py %s must be refused, naming why (%q): %v\n%s", strings.Join(args, " "), want, err, b)
	}
}

// colocReport runs report.py on worker results (file name -> result) and a power log ("" for none); its markdown.
func colocReport(t *testing.T, results map[string]map[string]any, power string) string {
	t.Helper()
	return colocReportWith(t, results, power, nil)
}

// colocReportWith is colocReport with more files in the run directory (path relative to it -> JSON), such as the
// `detshare status` bench.py saves per case under logs/.
func colocReportWith(t *testing.T, results map[string]map[string]any, power string, files map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw")
	for _, d := range []string{raw, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, d := range results {
		writeJSON(t, filepath.Join(raw, name+".json"), d)
	}
	for name, d := range files {
		if text, ok := d.(string); ok { // verbatim (JSON lines)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		writeJSON(t, filepath.Join(dir, name), d)
	}
	writeJSON(t, filepath.Join(dir, "meta.json"), map[string]any{"load": 0.5, "duration": 5})
	if power != "" {
		if err := os.WriteFile(filepath.Join(dir, "power.csv"), []byte(power), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return run(t, nil, python(t), filepath.Join(here(t), "report.py"), dir)
}

// report.py's co-location tables on synthetic results with known answers: ratios to solo, BE normalised
// throughput, the power log cut into the case's window, bit-equality, and the issue-12 targets.
func TestColocReport(t *testing.T) {
	const t0 = 1000.0
	lc := func(cfg, group string, svcMs float64, hash string) map[string]any {
		d := lcResult(cfg, group, func(int) float64 { return svcMs })
		d["output_hashes"] = map[string]int{hash: 100}
		return d
	}
	be := func(cfg, group string, steps int, hash string) map[string]any {
		var ends []float64
		for i := 0; i < steps; i++ {
			ends = append(ends, 5.0*float64(i)/float64(steps))
		}
		return map[string]any{"role": "train", "duration": 5.0, "t0": t0, "step_ends": ends,
			"loss_hash_first5": hash, "group": group, "config": cfg, "label": "be"}
	}
	p := "coloc:bert+lin8192-bf16"
	results := map[string]map[string]any{
		"a": lc("alone", "coloc:bert", 2, "h0"), "b": be("alone", "coloc:lin8192-bf16", 100, "l0"),
		"c": lc("mps", p, 10, "h0"), "d": be("mps", p, 90, "l0"), "g": lc("alone-mps", "coloc:bert", 2.5, "h0"),
		"e": lc("detshare-dynamic", p, 2.1, "h0"), "f": be("detshare-dynamic", p, 40, "l1"),
	}
	pw := "time,power_w,power_limit_w,sm_clock_mhz\n"
	for i := 0; i < 60; i++ {
		w := "100"
		if i >= 5 && i <= 50 { // the window: [t0 + 0.5, t0 + 5]
			w = "600"
		}
		pw += strings.Join([]string{jsonNum(t0 + 0.1*float64(i)), w, "700", "1900"}, ",") + "\n"
	}
	md := colocReport(t, results, pw)
	reportHas(t, md,
		"Alone under plain MPS (what MPS itself costs it): service P50 2.500 / P99 2.500 ms (P99 1.25 of alone); 1 distinct output in 100 requests.",
		"| lin8192-bf16 | mps | 10.000 / 10.000 | 5.00 | 4.00 | 10.00 | 5.00 | 18.00 | 0.90 | 600 / 600 | 1900 / 1900 | yes / yes |",
		"| lin8192-bf16 | detshare-dynamic | 2.100 / 2.100 | 1.05 | 0.84 | 2.10 | 1.05 | 8.00 | 0.40 | 600 / 600 | 1900 / 1900 | yes / **NO** |",
		"DetShare-dynamic: LC P99 service <= 1.10x solo | 1.0500 | <= 1.1 | yes |",
		"DetShare-dynamic: BE >= 0.5 of solo throughput | 0.4000 | >= 0.5 | **no** (by 0.1) |",
		"DetShare-dynamic: LC outputs and BE losses bit-identical to solo | 0.0000 | >= 1.0 | **no**",
	)
}

// Issue 26: the report shows where each SLO case's controller stood at the end of its window, from the `detshare
// status` bench.py saved: an SLO the scheduler reported not attainable with the floor it measured (and that floor as a
// ratio to the LC's solo P99), and one it met with the groups it gave back and the trainer's grant and narrow part,
// and, from every look bench.py took, the mean of both over the run.
func TestColocReportShowsTheSLOController(t *testing.T) {
	lc := func(cfg, group string, svcMs float64) map[string]any {
		return lcResult(cfg, group, func(int) float64 { return svcMs })
	}
	be := func(cfg, group string, steps int) map[string]any {
		var ends []float64
		for i := 0; i < steps; i++ {
			ends = append(ends, 5.0*float64(i)/float64(steps))
		}
		return map[string]any{"role": "train", "duration": 5.0, "t0": 1000.0, "step_ends": ends,
			"loss_hash_first5": "l0", "group": group, "config": cfg, "label": "be"}
	}
	p := "coloc:bert+lin8192-bf16"
	results := map[string]map[string]any{
		"a": lc("alone", "coloc:bert", 2), "b": be("alone", "coloc:lin8192-bf16", 100),
		"c": lc("detshare-sloov1.5x", p, 3.2), "d": be("detshare-sloov1.5x", p, 20),
		"e": lc("detshare-sloov2x", p, 3.5), "f": be("detshare-sloov2x", p, 60),
	}
	look := func(given, beGroups int) string {
		return fmt.Sprintf(`{"t": 1, "tenants": [{"id": "lc", "slo_given_back_groups": %d}, {"id": "be", "grant_groups": %d}]}`+"\n",
			given, beGroups)
	}
	status := func(lcT, beT map[string]any) map[string]any {
		lcT["id"], beT["id"] = "lc", "be"
		return map[string]any{"tenants": []any{lcT, beT}}
	}
	md := colocReportWith(t, results, "", map[string]any{
		"logs/coloc_bert-lin8192-bf16_detshare-sloov1.5x__status.json": status(
			map[string]any{"slo_p99_ms": 3.0, "slo_state": "infeasible", "slo_window_p99_ms": 3.4, "slo_floor_ms": 3.2},
			map[string]any{"grant_groups": 1 << 14}),
		"logs/coloc_bert-lin8192-bf16_detshare-sloov2x__status.json": status(
			map[string]any{"slo_p99_ms": 4.0, "slo_state": "meeting", "slo_window_p99_ms": 3.5,
				"slo_given_back_groups": 6},
			map[string]any{"grant_groups": 0x7f00, "narrow_groups": 2}),
		// every look of bench.py's watch: given back 2, 4 and 6 over the run, the trainer on 3, 5 and 7 groups
		"logs/coloc_bert-lin8192-bf16_detshare-sloov2x__looks.jsonl": look(2, 0x7) + look(4, 0x1f) + look(6, 0x7f),
	})
	reportHas(t, md,
		"| bert+lin8192-bf16 | detshare-sloov1.5x | 3.000 | **NOT ATTAINABLE** | 3.400 | 3.200 (1.60) | 0 | 1, off | —, — |",
		"| bert+lin8192-bf16 | detshare-sloov2x | 4.000 | meeting | 3.500 | — | 6 | 7, 2 | 4.0, 5.0 |",
		"bert+lin8192-bf16, slo-p99 1.5x solo: LC service P99 within the SLO | 1.6000 | <= 1.5 | **no**",
	)
}

// Issue 26: a trainer whose losses are NaN is not training (the bf16 trainer under MPS at 67 and 80 % of threads on
// the H100), so its steps per second must not make its point one that DetShare has to dominate. Results that say so
// themselves (losses_finite) and older ones known only by their hash (five canonical NaNs) are both set apart; a
// finite peer point beyond DetShare's frontier is still reported as one.
func TestColocReportSetsNaNTrainersApart(t *testing.T) {
	be := func(cfg, group string, steps int, hash string, finite any) map[string]any {
		var ends []float64
		for i := 0; i < steps; i++ {
			ends = append(ends, 5.0*float64(i)/float64(steps))
		}
		d := map[string]any{"role": "train", "duration": 5.0, "t0": 1000.0, "step_ends": ends,
			"loss_hash_first5": hash, "group": group, "config": cfg, "label": "be"}
		if finite != nil {
			d["losses_finite"] = finite
		}
		return d
	}
	lc := func(cfg, group string, svcMs float64) map[string]any {
		return lcResult(cfg, group, func(int) float64 { return svcMs })
	}
	// sha256 of five float32 0x7fffffff, the first 16 hex digits (worker.py's tensor_hash of five NaN losses)
	h := sha256.Sum256(bytes.Repeat([]byte{0xff, 0xff, 0xff, 0x7f}, 5))
	nanHash := hex.EncodeToString(h[:])[:16]
	p := "coloc:bert+lin8192-bf16"
	results := map[string]map[string]any{
		"a": lc("alone", "coloc:bert", 2), "b": be("alone", "coloc:lin8192-bf16", 100, "l0", true),
		"c": lc("mps-pct67", p, 4), "d": be("mps-pct67", p, 80, "l9", false), // says so itself
		"e": lc("mps-pct80", p, 5), "f": be("mps-pct80", p, 90, nanHash, nil), // an older result: its hash
		"g": lc("mps-pct50", p, 3), "h": be("mps-pct50", p, 65, "l5", true), // finite, beyond DetShare
		"i": lc("detshare-overlap0.2-n10", p, 4.4), "j": be("detshare-overlap0.2-n10", p, 78, "l0", true),
		"k": be("trainer-mps67", "coloc:lin8192-bf16", 85, nanHash, nil),
	}
	md := colocReport(t, results, "")
	reportHas(t, md,
		"| lin8192-bf16 | mps-pct67 | 4.000 / 4.000 | 2.00 |",
		"mps-pct67: 2.00, 0.80: trainer losses NaN, not training",
		"mps-pct80: 2.50, 0.90: trainer losses NaN, not training",
		"mps-pct50: 1.50, 0.64: **NO** (closest detshare-overlap0.2-n10: LC +0.70, trainer +0.13)",
		"bert+lin8192-bf16: mps-pct50 lies beyond DetShare's frontier",
		"| lin8192-bf16 | trainer-mps67 | — | 16.89 | 0.84 | — / — | — / — | **NaN** |",
	)
	for _, row := range strings.Split(md, "\n") {
		if strings.Contains(row, "| lin8192-bf16 | mps-pct") && (strings.Contains(row, "pct67") || strings.Contains(row, "pct80")) &&
			!strings.HasSuffix(row, "/ **NaN** |") {
			t.Errorf("a NaN trainer's row must say NaN, not just NO: %s", row)
		}
	}
	for _, cfg := range []string{"mps-pct67", "mps-pct80"} {
		if strings.Contains(md, "bert+lin8192-bf16: "+cfg+" lies beyond DetShare's frontier") {
			t.Errorf("%s (trainer losses NaN) counted as a peer point beyond the frontier:\n%s", cfg, md)
		}
	}
}

// A HAMi-core point says whether HAMi-core's limit applied: its trainer's log has "Initialized" only once HAMi-core's
// own cuInit ran (which starts its SM-utilisation watcher); loaded without it, the point is named as unlimited and
// still counts as a peer point, because that is what a user of HAMi-core gets.
func TestColocReportSaysWhetherHAMiCoreApplied(t *testing.T) {
	p := "coloc:bert+lin8192-bf16"
	be := func(cfg, group string, steps int) map[string]any {
		var ends []float64
		for i := 0; i < steps; i++ {
			ends = append(ends, 5.0*float64(i)/float64(steps))
		}
		return map[string]any{"role": "train", "duration": 5.0, "t0": 1000.0, "step_ends": ends,
			"loss_hash_first5": "l0", "losses_finite": true, "group": group, "config": cfg, "label": "be"}
	}
	lc := func(cfg, group string, svcMs float64) map[string]any {
		return lcResult(cfg, group, func(int) float64 { return svcMs })
	}
	results := map[string]map[string]any{
		"a": lc("alone", "coloc:bert", 2), "b": be("alone", "coloc:lin8192-bf16", 100),
		"c": lc("hami-sm30", p, 6), "d": be("hami-sm30", p, 73),
		"e": lc("hami-sm50", p, 5), "f": be("hami-sm50", p, 50),
		"g": lc("hami-sm70", p, 5), "h": be("hami-sm70", p, 60),
		"i": lc("detshare-overlap0.05-n0", p, 5), "j": be("detshare-overlap0.05-n0", p, 70),
	}
	logs := map[string]any{
		// loaded, but its cuInit never ran
		"logs/coloc_bert-lin8192-bf16_hami-sm30__be.log": "[HAMI-core Msg(1973:1:libvgpu.c:871)]: Initializing.....\n" +
			"[HAMI-core Msg(1973:1:multiprocess_memory_limit.c:700)]: Cleanup on exit for PID 1973\n",
		// its cuInit ran: the limit applied
		"logs/coloc_bert-lin8192-bf16_hami-sm50__be.log": "[HAMI-core Msg(7:1:libvgpu.c:871)]: Initializing.....\n" +
			"[HAMI-core Msg(7:1:libvgpu.c:912)]: Initialized\n",
		// hami-sm70 has no log: nothing is claimed either way
	}
	md := colocReportWith(t, results, "", logs)
	reportHas(t, md,
		"| lin8192-bf16 | hami-sm30 (limit not applied) | 6.000 / 6.000 | 3.00 |",
		"| lin8192-bf16 | hami-sm50 | 5.000 / 5.000 | 2.50 |",
		"| lin8192-bf16 | hami-sm70 | 5.000 / 5.000 | 2.50 |",
		"hami-sm30 (HAMi-core's limit not applied: its cuInit never ran): 3.00, 0.72: **NO** (closest detshare-overlap0.05-n0: LC -0.50, trainer -0.02)",
		"hami-sm50: 2.50, 0.50: yes (detshare-overlap0.05-n0)",
		"hami-sm70: 2.50, 0.60: yes (detshare-overlap0.05-n0)",
		"bert+lin8192-bf16: hami-sm30 lies beyond DetShare's frontier",
	)
}

// Each trainer alone on part of the GPU reaches the report: throughput against its solo, the SMs the scheduler
// granted (from its status mid-run), and whether its losses stayed bit-identical (MPS's percentage changes kernels).
func TestColocReportShowsTheTrainerAlone(t *testing.T) {
	be := func(cfg string, steps int, hash string, sms any) map[string]any {
		var ends []float64
		for i := 0; i < steps; i++ {
			ends = append(ends, 5.0*float64(i)/float64(steps))
		}
		d := map[string]any{"role": "train", "duration": 5.0, "t0": 1000.0, "step_ends": ends,
			"loss_hash_first5": hash, "group": "coloc:lin8192-bf16", "config": cfg, "label": "be"}
		if sms != nil {
			d["grant_mid_run"] = map[string]any{"sms": sms}
		}
		return d
	}
	results := map[string]map[string]any{
		"a": lcResult("alone", "coloc:bert", func(int) float64 { return 2 }),
		"b": be("alone", 100, "l0", nil), "c": be("trainer-mps67", 80, "l9", nil),
		"d": be("trainer-sm88", 70, "l0", 88), "e": be("trainer-sm104", 85, "l0", 104),
		"f": be("trainer-hami30", 99, "l0", nil), "g": be("trainer-hami70", 70, "l0", nil),
	}
	// HAMi-core at 30 % loaded without its cuInit ever running (its limit did not apply); at 70 % it did
	md := colocReportWith(t, results, "", map[string]any{
		"logs/coloc_lin8192-bf16_trainer-hami30__be.log": "[HAMI-core Msg(5:1:libvgpu.c:871)]: Initializing.....\n",
		"logs/coloc_lin8192-bf16_trainer-hami70__be.log": "[HAMI-core Msg(6:1:libvgpu.c:871)]: Initializing.....\n" +
			"[HAMI-core Msg(6:1:libvgpu.c:912)]: Initialized\n",
	})
	reportHas(t, md,
		"### Each trainer alone on part of the GPU",
		"| lin8192-bf16 | trainer-mps67 | — | 16.00 | 0.80 |",
		"| lin8192-bf16 | trainer-sm88 | 88 | 14.00 | 0.70 |",
		"| lin8192-bf16 | trainer-sm104 | 104 | 16.89 | 0.84 |",
		"| lin8192-bf16 | trainer-hami30 (limit not applied) | — | 19.78 | 0.99 |",
		"| lin8192-bf16 | trainer-hami70 | — | 14.00 | 0.70 |",
	)
	if !strings.Contains(md, "| lin8192-bf16 | trainer-mps67 | — | 16.00 | 0.80 | — / — | — / — | **NO** |") ||
		!strings.Contains(md, "| lin8192-bf16 | trainer-sm88 | 88 | 14.00 | 0.70 | — / — | — / — | yes |") {
		t.Errorf("bit-identity per row wrong:\n%s", md)
	}
	if strings.Index(md, "trainer-mps67") > strings.Index(md, "trainer-sm88") ||
		strings.Index(md, "trainer-sm88") > strings.Index(md, "trainer-sm104") ||
		strings.Index(md, "trainer-sm104") > strings.Index(md, "trainer-hami30") {
		t.Errorf("rows out of order (MPS first, then DetShare by SMs, then HAMi-core):\n%s", md)
	}
}

func jsonNum(f float64) string { b, _ := json.Marshal(f); return string(b) }

// reportHas wants every line of wants in report.py's markdown.
func reportHas(t *testing.T, md string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// lcResult is an LC worker's result as report.py reads it: 100 requests 50 ms apart from t0 = 1000 over a 5 s window,
// request i served in svcMs(i), every output the same ("h0").
func lcResult(cfg, group string, svcMs func(i int) float64) map[string]any {
	var reqs [][3]float64
	for i := 0; i < 100; i++ {
		a := float64(i) * 0.05
		reqs = append(reqs, [3]float64{a, a, a + svcMs(i)/1e3})
	}
	return map[string]any{"role": "infer", "duration": 5.0, "t0": 1000.0, "rate": 20.0, "offered": 100,
		"requests": reqs, "output_hash": "h0", "output_hashes": map[string]int{"h0": 100},
		"calibration": map[string]any{"mean_s": 0.002}, "group": group, "config": cfg, "label": "lc"}
}

// The reclaim probe's waits reach the report: per configuration, how long a request needing every SM waited for an SM
// to come free and for all of them (the dispatch gate's bound on the H100 comes from this table).
func TestColocReportReclaim(t *testing.T) {
	probe := func(cfg, group string, all func(i int) float64) map[string]any {
		d := lcResult(cfg, group, func(i int) float64 { return 1 + all(i)/1e3 })
		var waits [][3]float64
		for i := 0; i < 100; i++ {
			waits = append(waits, [3]float64{1, 10, all(i)})
		}
		d["reclaim"] = map[string]any{"grid": 128, "spin_us": 1000, "waits_us": waits}
		return d
	}
	p := "coloc:reclaim+lin8192-bf16"
	// alone under plain MPS, two output values: the report says MPS itself broke bit-equality
	mpsAlone := probe("alone-mps", "coloc:reclaim", func(int) float64 { return 6 })
	mpsAlone["output_hashes"] = map[string]int{"h0": 60, "h1": 40}
	md := colocReport(t, map[string]map[string]any{
		"a": probe("alone", "coloc:reclaim", func(int) float64 { return 5 }),
		"m": mpsAlone,
		"b": probe("detshare-dynamic-pause", p, func(i int) float64 {
			if i == 99 {
				return 900
			}
			return 300
		}),
	}, "")
	reportHas(t, md,
		"Reclaim probe (128 blocks of 200 KiB shared memory, one per SM, each held 1000 us)",
		"| — | alone | 90 | 1 / 1 | 10 / 10 | 5 / 5 / 5 |",
		"| — | alone-mps | 90 | 1 / 1 | 10 / 10 | 6 / 6 / 6 |",
		"2 distinct outputs in 100 requests (MPS alone already breaks its bit-equality: see integration/gpu/mpsdet.sh).",
		// the first 10% of the window is dropped: requests 10..99, the last one waited 900 us
		"| lin8192-bf16 | detshare-dynamic-pause | 90 | 1 / 1 | 10 / 10 | 300 / 366 / 900 |",
	)
}

// The two measurements of where an LC's time goes are planned only when asked: alone-flush runs each LC alone with
// the flush between requests (and no MPS), at the rate its solo run set; --lc-stamp needs the GPU and says so.
func TestColocPlanWhereTheTimeGoes(t *testing.T) {
	py := python(t)
	ds := filepath.Join(buildDir(t), "bin", "detshare")
	need(t, ds)
	out := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--dry-run", "--configs", "alone,alone-flush",
		"--coloc-lc", "bert,resnet50", "--coloc-be", "lin8192-bf16")
	var flush []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "/alone-flush") {
			flush = append(flush, l)
		}
	}
	if len(flush) != 2 {
		t.Fatalf("want one alone-flush case per LC, got %d:\n%s", len(flush), out)
	}
	for _, l := range flush {
		if !strings.Contains(l, "--l2-flush-mb 256") || strings.Contains(l, "be:") || strings.HasSuffix(l, "[MPS]") {
			t.Errorf("alone-flush: the LC alone, without MPS, flushing 256 MiB between requests: %s", l)
		}
	}
	// never part of the default plan
	def := run(t, nil, py, filepath.Join(here(t), "bench.py"), "--out", t.TempDir(), "--device", "cpu", "--suite",
		"coloc", "--detshare", ds, "--dry-run")
	if strings.Contains(def, "alone-flush") || strings.Contains(def, "--stamp") {
		t.Errorf("the default plan must not flush or stamp:\n%s", def)
	}
	benchRefuses(t, py, "--lc-stamp: the stamps are GPU kernels, it needs --device cuda",
		"--device", "cpu", "--suite", "coloc", "--detshare", ds, "--dry-run", "--lc-stamp")
}

// The stamps and the flushed solo run reach the report: per configuration, the start delay and the GPU span of the
// LC's requests, and what the flush alone cost it.
func TestColocReportWhereTheTimeGoes(t *testing.T) {
	lc := func(cfg, group string, delayUs, spanMs func(i int) float64) map[string]any {
		d := lcResult(cfg, group, func(i int) float64 { return delayUs(i)/1e3 + spanMs(i) })
		var us [][]float64
		for i := 0; i < 100; i++ {
			us = append(us, []float64{delayUs(i), spanMs(i) * 1e3})
		}
		d["stamps"] = map[string]any{"us": us}
		return d
	}
	c := func(v float64) func(int) float64 { return func(int) float64 { return v } }
	flush := lc("alone-flush", "coloc:bert", c(0), c(2.3))
	delete(flush, "stamps")
	flush["l2_flush_mb"] = 256
	md := colocReport(t, map[string]map[string]any{
		"a": lc("alone", "coloc:bert", c(5), c(2.0)),
		"f": flush,
		"t": lc("detshare-temporal", "coloc:bert+lin8192-bf16", func(i int) float64 {
			if i%4 == 3 {
				return 305
			}
			return 5
		}, c(2.2)),
	}, "")
	reportHas(t, md,
		"Alone with 256 MiB read and written between its requests (a trainer's traffic through L2, nothing running "+
			"beside it): service P50 2.300 / P99 2.300 ms (P50 +0.295 ms, P99 1.15 of alone).",
		"| — | alone | 90 | 2.005 / 2.005 | 5 / 5 | 2.000 / 2.000 |",
		// requests 10..99, one in four waited 300 us more before its first kernel
		"| lin8192-bf16 | detshare-temporal | 90 | 2.205 / 2.505 | 5 / 305 | 2.200 / 2.200 |",
	)
}
