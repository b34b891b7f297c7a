package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/view"
)

// captureRun runs `detshare args...` in this process and returns its stdout.
func captureRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old, oldExiter := os.Stdout, cli.OsExiter
	os.Stdout = w
	cli.OsExiter = func(int) {} // cli.Exit errors come back as errors instead of ending the test binary
	defer func() { cli.OsExiter = oldExiter }()
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	runErr := newApp().Run(append([]string{"detshare"}, args...))
	w.Close()
	os.Stdout = old
	return <-done, runErr
}

func viewRunDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	tb, err := table.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	tb.SetGPUs([]table.GPUInfo{{Index: 0, UUID: "SIM-cli", Name: "simulated GPU (test double)", SMCount: 132, MemTotal: 80 << 30}})
	for _, r := range []table.RegisterRequest{
		{ID: "an-extremely-long-container-id-0123456789abcdef0123456789abcdef", Tier: table.TierLatencyCritical, Weight: 1, SMGroups: 4, SMs: 32, MemLimit: 40 << 30},
		{ID: "train", Tier: table.TierBestEffort, Role: table.RolePrefill, Weight: 3},
	} {
		reg, err := tb.Register(r)
		if err != nil {
			t.Fatal(err)
		}
		tb.PublishGrant(reg.Slot, table.Grant{Groups: 0xf, SMs: 32, Mode: table.ModeSpatial})
	}
	return dir
}

func TestStatusJSON(t *testing.T) {
	dir := viewRunDir(t)
	out, err := captureRun(t, "--run-dir", dir, "status", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var s view.Snapshot
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if len(s.GPUs) != 1 || !s.GPUs[0].Simulated || len(s.Tenants) != 2 || s.Scheduler.Alive {
		t.Fatalf("%+v", s)
	}
	if s.Tenants[1].ID != "train" || s.Tenants[1].Tier != "best-effort" || s.Tenants[1].GrantedSMs != 32 || s.Tenants[1].Weight != 3 {
		t.Fatalf("tenant %+v", s.Tenants[1])
	}
	human, err := captureRun(t, "--run-dir", dir, "status")
	if err != nil || !strings.Contains(human, "simulated GPU, test double") || !strings.Contains(human, "tenants keep their last grants") && !strings.Contains(human, "not running") {
		t.Fatalf("status: %v\n%s", err, human)
	}
	for _, cmd := range []string{"status", "top"} {
		_, err = captureRun(t, "--run-dir", filepath.Join(dir, "missing"), cmd)
		msg := fmt.Sprint(err)
		if err == nil || strings.Count(msg, filepath.Join(dir, "missing")) != 1 || !strings.Contains(msg, "detshare sched") ||
			!strings.Contains(msg, "--run-dir") {
			t.Fatalf("%s without a table: %q; want the path once and what to do", cmd, msg)
		}
	}
}

func TestTopFits80ColumnsAndRefreshesInPlace(t *testing.T) {
	dir := viewRunDir(t)
	// Not a terminal (a pipe): plain frames, no escape codes, nothing cut.
	plain, err := captureRun(t, "--run-dir", dir, "top", "--interval", "50ms", "-n", "2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "\x1b") || strings.Count(plain, "DetShare top") != 2 {
		t.Fatalf("top to a pipe must print plain frames without escape codes: %q", plain)
	}
	defer func(f func() (int, bool)) { stdoutTerminal = f }(stdoutTerminal)
	stdoutTerminal = func() (int, bool) { return 80, true }
	out, err := captureRun(t, "--run-dir", dir, "top", "--interval", "50ms", "-n", "2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\x1b[H") != 2 || !strings.HasSuffix(out, "\x1b[J") {
		t.Fatalf("top must redraw in place (cursor home per frame, clear below): %q", out)
	}
	frame := out[strings.LastIndex(out, "\x1b[H")+3:]
	for _, l := range strings.Split(frame, "\n") {
		l = strings.TrimSuffix(strings.TrimSuffix(l, "\x1b[J"), "\x1b[K")
		if len([]rune(l)) > 80 {
			t.Errorf("line wider than 80 columns (%d): %q", len([]rune(l)), l)
		}
	}
	for _, want := range []string{"132 SMs/15 grp  MPS unknown  none", "an-extremely-lo~", "train", "LC", "BE", "GUAR", "NOW", "40.0G", "BUSY%", "LAUNCH/s", "QDLY"} {
		if !strings.Contains(frame, want) {
			t.Errorf("frame lacks %q:\n%s", want, frame)
		}
	}
	if _, err := captureRun(t, "--run-dir", dir, "top", "--interval", "1ms"); err == nil || !strings.Contains(err.Error(), "--interval") {
		t.Fatalf("bad interval: %v", err)
	}
	_ = time.Second
}

func TestRenderTopWidthWithManyTenants(t *testing.T) {
	s := view.Snapshot{Taken: time.Now(), Scheduler: view.Leader{Alive: true, PID: 123456789, Epoch: 1 << 40, Policy: "throughput-oriented"},
		GPUs: []view.GPU{{Index: 15, Name: strings.Repeat("NVIDIA H100 80GB HBM3 ", 3), SMs: 132, Groups: make([]uint32, 15), MPS: "running", Mode: "spatial", TokenHolder: "x"}}}
	for i := 0; i < 5; i++ {
		s.Tenants = append(s.Tenants, view.Tenant{ID: strings.Repeat("x", 40), GPU: 15, Tier: "burstable", Role: "decode",
			GrantedSMs: 132, GuaranteedSMs: 132, BusyPct: 100, LaunchesSec: 12345678, MemUsed: 1 << 50, MemLimit: 1 << 50, QueueDelayMaxNs: 1 << 40})
	}
	var b strings.Builder
	renderTop(&b, nil, s, 80)
	for _, l := range strings.Split(b.String(), "\n") {
		if len(l) > 80 {
			t.Errorf("line wider than 80 columns (%d): %q", len(l), l)
		}
	}
	b.Reset()
	renderTop(&b, nil, s, 0) // not a terminal: the GPU name is never cut
	if !strings.Contains(b.String(), s.GPUs[0].Name) {
		t.Errorf("GPU name cut:\n%s", b.String())
	}
}

// TestSchedCommand runs `detshare sched` as a real process on the simulated GPU (a test double): it leads, a second
// instance exits 0 at once, SIGTERM stops it cleanly, and a bad configuration is refused naming the key.
func TestSchedCommand(t *testing.T) {
	e := newRunEnv(t)
	cfg := filepath.Join(e.dir, "config.toml")
	os.WriteFile(cfg, []byte("[scheduler]\npolicy = \"tpot-first\"\n"), 0o644)
	s := e.detshare("sched", "--config", cfg)
	var stderr strings.Builder
	s.Stderr = &stderr
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Process.Kill()
	var tb *table.Table
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if tb == nil {
			tb, _ = table.OpenReadOnly(e.runDir)
		}
		if tb != nil && tb.LeaderAlive(time.Second) && tb.Leader().PID == s.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("detshare sched did not lead: %v\n%s", err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer tb.Close()
	if g := tb.GPUs(); len(g) != 1 || !strings.HasPrefix(g[0].UUID, "SIM-") || g[0].Mode != table.ModeSpatial {
		t.Fatalf("GPUs after start: %+v", g)
	}
	if tb.Header().Policy != 2 {
		t.Fatalf("policy from --config not applied: %d", tb.Header().Policy)
	}
	second := e.detshare("sched", "--config", cfg)
	start := time.Now()
	if out, err := second.CombinedOutput(); err != nil || time.Since(start) > 3*time.Second {
		t.Fatalf("second instance: %v after %s\n%s", err, time.Since(start), out)
	}
	s.Process.Signal(syscall.SIGTERM)
	if err := s.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
	}
	if tb.Leader().PID != 0 {
		t.Fatalf("leader record left after clean exit: %+v", tb.Leader())
	}
	os.WriteFile(cfg, []byte("[scheduler]\nquantum = \"forever\"\n"), 0o644)
	out, err := e.detshare("sched", "--config", cfg).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "forever") {
		t.Fatalf("bad config: %v\n%s", err, out)
	}
}

func TestUnknownCommandNamesTheAllowedOnes(t *testing.T) {
	_, err := captureRun(t, "frobnicate")
	if err == nil || strings.Contains(err.Error(), "No help topic") || !strings.Contains(err.Error(), `unknown command "frobnicate"`) ||
		!strings.Contains(err.Error(), "sched") {
		t.Fatalf("unknown command: %v", err)
	}
}

// overlapSnapshot is the case that showed 200 of 132 SMs granted: a busy latency-critical tenant guaranteed 32 SMs
// expanded onto every group, while an idle best-effort tenant still holds 9 of those groups.
func overlapSnapshot() view.Snapshot {
	groups := make([]uint32, 16)
	for i := range groups {
		groups[i] = 8 // 128 SMs in groups, 4 left over
	}
	s := view.Snapshot{Taken: time.Now(), Scheduler: view.Leader{Alive: true, PID: 42, Policy: "throughput-oriented"},
		GPUs: []view.GPU{{Index: 0, Name: "H100", SMs: 132, Groups: groups, MPS: "running", Mode: "spatial"}},
		Tenants: []view.Tenant{
			{ID: "train", GPU: 0, Tier: "best-effort", Role: "none", GrantedSMs: 72, GrantGroups: 0x1ff0, GrantMode: "spatial"},
			{ID: "web", GPU: 0, Tier: "latency-critical", Role: "none", GuaranteedSMs: 32, GrantedSMs: 128, GrantGroups: 0xffff,
				GrantMode: "spatial", Demand: 1},
		}}
	view.AccountAll(&s)
	return s
}

// Granted SMs that add up to more than the GPU are explained, not summed: each tenant's guarantee and grant, the
// borrowed SMs, and which groups are granted to both tenants (the idle one named), in status and in top.
func TestStatusAndTopExplainOverlappingGrants(t *testing.T) {
	s := overlapSnapshot()
	var st strings.Builder
	printStatus(&st, s)
	var top strings.Builder
	renderTop(&top, nil, s, 80)
	footer := []string{
		"132 SMs: 32 guaranteed, 168 borrowed, 128 granted (each SM once), 4 free",
		"72 SMs granted to 2+ tenants (overlap: tenants idle, lending or sharing):",
		"groups 4-12 (72 SMs): train (idle), web",
	}
	for name, out := range map[string]string{"status": st.String(), "top": top.String()} {
		for _, want := range footer {
			if !strings.Contains(out, want) {
				t.Errorf("%s lacks %q:\n%s", name, want, out)
			}
		}
	}
	for _, want := range []string{"SMs  32 guaranteed, 128 now", "96 SMs borrowed beyond its guarantee", "72 SMs of its grant also granted to train",
		"SMs   0 guaranteed,  72 now", "72 SMs of its grant also granted to web"} {
		if !strings.Contains(st.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, st.String())
		}
	}
	rows := map[string]string{}
	for _, l := range strings.Split(top.String(), "\n") {
		if f := strings.Fields(l); len(f) > 5 && (f[0] == "web" || f[0] == "train") {
			rows[f[0]] = f[3] + " " + f[4]
		}
		if len(l) > 80 {
			t.Errorf("top line wider than 80 columns: %q", l)
		}
	}
	if rows["web"] != "32 128*" || rows["train"] != "0 72*" {
		t.Errorf("top GUAR NOW columns: %v, want web 32 128*, train 0 72*:\n%s", rows, top.String())
	}
	// Disjoint grants: no star, no overlap lines.
	s.Tenants[0].GrantGroups, s.Tenants[0].GrantedSMs = 0xf000, 32
	s.Tenants[1].GrantGroups, s.Tenants[1].GrantedSMs = 0x0fff, 96
	view.AccountAll(&s)
	top.Reset()
	renderTop(&top, nil, s, 80)
	if strings.Contains(top.String(), "*") || strings.Contains(top.String(), "2+ tenants") ||
		!strings.Contains(top.String(), "132 SMs: 32 guaranteed, 96 borrowed, 128 granted (each SM once), 4 free") {
		t.Errorf("disjoint grants:\n%s", top.String())
	}
}

// A lower tier whose memory-bound kernels run on a narrow part of its grant (scheduler.narrow_groups, issue 26) is
// named with that part in status and in top; a tenant without one is not.
func TestStatusAndTopShowNarrowGroups(t *testing.T) {
	s := overlapSnapshot()
	s.Tenants[0].NarrowGroups = 2
	var st, top strings.Builder
	printStatus(&st, s)
	renderTop(&top, nil, s, 0)
	if !strings.Contains(st.String(), "memory-bound kernels on 2 groups of its grant") {
		t.Errorf("status does not say where train's memory-bound kernels run:\n%s", st.String())
	}
	if !strings.Contains(top.String(), "train: memory-bound kernels on 2 groups of its grant") {
		t.Errorf("top does not say where train's memory-bound kernels run:\n%s", top.String())
	}
	if strings.Contains(top.String(), "web: memory-bound") {
		t.Errorf("top names a narrow part for web, which has none:\n%s", top.String())
	}
}
