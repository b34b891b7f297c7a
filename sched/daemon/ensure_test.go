package daemon

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
)

// TestEnsureSchedulerOnRegistration: registering a tenant through cgroupgpu/tenant (as the hook, the shim and
// `detshare run` do) starts the scheduler when none leads, exactly once, and the scheduler then grants the tenant.
func TestEnsureSchedulerOnRegistration(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	bin := filepath.Join(t.TempDir(), "detshare")
	script := "#!/bin/sh\nDETSHARE_DAEMON_TEST_ROLE=sched TEST_MPS=1 exec " + os.Args[0] + " -test.run=^$ \"$@\"\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ensure.BinEnv, bin)
	t.Setenv("DETSHARE_SIMGPU", "1")
	t.Setenv("DETSHARE_SIMGPU_SMS", "64")
	// Wired as the shim and the runc wrapper are (cmd/internal/wiring).
	reg := tenant.Registrar{EnsureScheduler: ensure.EnsureScheduler, DiscoverGPUs: simgpu.Discover}
	if ensure.LeaderRunning(dir) {
		t.Fatal("leader before start")
	}
	res, err := reg.Register(context.Background(), dir, tenant.Request{ID: "first",
		Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=best-effort"}}.Resolve()})
	if err != nil {
		t.Fatal(err)
	}
	if !ensure.LeaderRunning(dir) {
		b, _ := os.ReadFile(filepath.Join(dir, ensure.LogFile))
		t.Fatalf("registration did not start the scheduler; log:\n%s", b)
	}
	tb, err := table.OpenReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	waitLeaderRO(t, tb)
	pid := tb.Leader().PID
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGTERM) })
	// Already running: a second registration starts nothing new.
	if _, err := reg.Register(context.Background(), dir, tenant.Request{ID: "second",
		Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=best-effort"}}.Resolve()}); err != nil {
		t.Fatal(err)
	}
	if err := ensure.EnsureScheduler(dir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if tb.Leader().PID != pid || tb.Leader().Epoch != 1 {
		t.Fatalf("leader changed: %+v, want pid %d epoch 1", tb.Leader(), pid)
	}
	g := waitGrant(t, tb, res.Registration.Slot, 2*time.Second, "a spatial grant", func(g table.Grant) bool { return g.Mode == table.ModeSpatial })
	if g.SMs == 0 {
		t.Fatalf("no SMs offered: %+v", g)
	}
	// SIGTERM: the scheduler leaves, releasing the lock and the leader record; the grant stays (fail-static).
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for ensure.LeaderRunning(dir) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ensure.LeaderRunning(dir) || tb.Leader().PID != 0 {
		t.Fatalf("scheduler did not stop cleanly: %+v", tb.Leader())
	}
	if g2, _ := tb.ReadGrant(res.Registration.Slot); g2.Groups != g.Groups || g2.Epoch != g.Epoch {
		t.Fatalf("grant changed at clean exit: %+v -> %+v", g, g2)
	}
}

func TestEnsureSchedulerReportsStartFailure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	bin := filepath.Join(t.TempDir(), "detshare")
	os.WriteFile(bin, []byte("#!/bin/sh\necho cannot lead >&2\nexit 7\n"), 0o755)
	t.Setenv(ensure.BinEnv, bin)
	err := ensure.EnsureScheduler(dir)
	if err == nil || !contains(err.Error(), ensure.LogFile) {
		t.Fatalf("want an error pointing at the log, got %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ensure.LogFile)); !contains(string(b), "cannot lead") {
		t.Fatalf("log: %q", b)
	}
}

func contains(s, sub string) bool { return len(sub) == 0 || indexOf(s, sub) >= 0 }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func waitLeaderRO(t *testing.T, tb *table.Table) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !tb.LeaderAlive(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("no live leader: %+v", tb.Leader())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSIGHUPReload: a scheduler process reloads its configuration file on SIGHUP; a broken file is refused and the
// policy in force stays.
func TestSIGHUPReload(t *testing.T) {
	dir, tb := newRunDir(t)
	pre := register(t, tb, "prefill", table.TierBestEffort, table.RolePrefill, 0, false, 0)
	dec := register(t, tb, "decode", table.TierBestEffort, table.RoleDecode, 0, false, 0)
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("[scheduler]\npolicy = \"throughput-oriented\"\n"), 0o644)
	s := spawn(t, "sched", table.RunDirEnv+"="+dir, "DETSHARE_SIMGPU=1", "TEST_MPS=1", "TEST_CONFIG="+cfg)
	waitLeader(t, tb, s.Process.Pid)
	play(t, tb, pre).busy(true)
	play(t, tb, dec).busy(true)
	waitGrant(t, tb, dec.Slot, time.Second, "4 groups", groupsIs(4))
	os.WriteFile(cfg, []byte("[scheduler]\npolicy = \"no-such-policy\"\n"), 0o644)
	s.Process.Signal(syscall.SIGHUP)
	time.Sleep(200 * time.Millisecond)
	if g, _ := tb.ReadGrant(dec.Slot); !groupsIs(4)(g) || !tb.LeaderAlive(time.Second) {
		t.Fatalf("a broken config changed grants or killed the scheduler: %+v", g)
	}
	os.WriteFile(cfg, []byte("[scheduler]\npolicy = \"tpot-first\"\n"), 0o644)
	s.Process.Signal(syscall.SIGHUP)
	waitGrant(t, tb, dec.Slot, 2*time.Second, "TPOT-First after SIGHUP: decode 6", groupsIs(6))
	waitGrant(t, tb, pre.Slot, time.Second, "prefill 2", groupsIs(2))
	if tb.Leader().PID != s.Process.Pid || tb.Leader().Epoch != 1 {
		t.Fatal("reload must not restart the scheduler")
	}
}
