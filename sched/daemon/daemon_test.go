package daemon

import (
	"bufio"
	"context"
	"errors"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

// simGPU is the simulated GPU (a test double) the tests record in their tables: 64 SMs = 8 groups of 8.
var simGPU = table.GPUInfo{Index: 0, UUID: "SIM-daemon-test-0", Name: "simulated GPU (test double)", SMCount: 64, MemTotal: 1 << 34}

func newRunDir(t *testing.T) (string, *table.Table) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	tb, err := table.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.SetGPUs([]table.GPUInfo{simGPU}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return dir, tb
}

func register(t *testing.T, tb *table.Table, id string, tier table.Tier, role table.Role, groups uint32, lend bool, owner int) table.Registration {
	t.Helper()
	r, err := tb.Register(table.RegisterRequest{ID: id, Tier: tier, Role: role, GPU: 0, Weight: 1, SMGroups: groups,
		SMs: groups * 8, Lend: lend, OwnerPID: owner})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// player plays a tenant's process from the test: one process entry of the test process itself.
type player struct {
	t   *testing.T
	tb  *table.Table
	cl  *table.Client
	idx int
	reg table.Registration
}

func play(t *testing.T, tb *table.Table, reg table.Registration) *player {
	t.Helper()
	cl, err := table.OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	id, err := table.SelfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	i, err := cl.AttachProcess(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return &player{t: t, tb: tb, cl: cl, idx: i, reg: reg}
}

func (p *player) busy(b bool) {
	if p.cl.SetBusy(p.idx, b) {
		p.tb.RingDoorbell()
	}
}

func testConfig() config.Config {
	c := config.Default()
	c.MPS.Enable = false
	c.Scheduler.ReapEvery = config.Duration{Duration: 50 * time.Millisecond}
	// issue 12's dynamic expansion, which most tests here are about; the partitions of the default
	// (scheduler.lc_reserve) and of the SLO controller have their own tests in dynamic_test.go
	c.Scheduler.LCReserve = 0
	return c
}

// startSched runs a scheduler in this process (simulated MPS: spatial mode) until the test ends.
func startSched(t *testing.T, dir string, c config.Config, m *mps.Manager, with ...func(*Options)) *Scheduler {
	t.Helper()
	if m == nil {
		m = &mps.Manager{Paths: table.NewPaths(dir), Simulated: true}
		c.MPS.Enable = true
	}
	// Pages registered while this scheduler leads are mounts of their own (tenants.page_mounts): the test's
	// temporary directory can be removed only once they are gone, after the scheduler stopped (cleanups run last
	// first).
	t.Cleanup(func() { testenv.UnmountUnder(dir) })
	ready := make(chan struct{})
	o := Options{RunDir: dir, Config: c, MPS: m, Ready: ready}
	for _, f := range with {
		f(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
		s.Close()
	})
	<-ready
	return s
}

// waitGrant waits until slot's grant satisfies ok, at most d, and returns it.
func waitGrant(t *testing.T, tb *table.Table, slot int, d time.Duration, what string, ok func(table.Grant) bool) table.Grant {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		g, err := tb.ReadGrant(slot)
		if err == nil && ok(g) {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %d: %s not reached within %s; grant %+v err %v", slot, what, d, g, err)
		}
		_, _ = tb.WaitGrantChange(slot, g.Epoch, 10*time.Millisecond)
	}
}

func groupsIs(n int) func(table.Grant) bool {
	return func(g table.Grant) bool { return g.Mode == table.ModeSpatial && bits.OnesCount64(g.Groups) == n }
}

func TestGrantsFollowDemand(t *testing.T) {
	dir, tb := newRunDir(t)
	lc := register(t, tb, "lc", table.TierLatencyCritical, table.RoleNone, 2, true, 0)
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	s := startSched(t, dir, testConfig(), nil)
	if g := tb.GPUs()[0]; g.Mode != table.ModeSpatial || g.MPSState != table.MPSRunning {
		t.Fatalf("simulated MPS must give spatial mode: %+v", g)
	}
	if _, err := os.Stat(filepath.Join(table.NewPaths(dir).MPSPipeDir(0), mps.SimControlFile)); err != nil {
		t.Fatalf("simulated MPS control file: %v", err)
	}
	// Idle and lending: it is offered every group (to start its next request wide), and BE may borrow them all.
	waitGrant(t, tb, lc.Slot, time.Second, "idle LC offered all 8 groups", groupsIs(8))
	pl, pb := play(t, tb, lc), play(t, tb, be)
	pb.busy(true)
	gb := waitGrant(t, tb, be.Slot, 100*time.Millisecond, "busy BE borrows all 8 groups", groupsIs(8))
	gl := table.Grant{Groups: 0x3} // its guarantee: the lowest free groups at registration
	pl.busy(true)
	// Busy LC expands over everything but BE's floor (1 group); BE is gated.
	gb2 := waitGrant(t, tb, be.Slot, 100*time.Millisecond, "BE throttled to its floor", groupsIs(1))
	gl2 := waitGrant(t, tb, lc.Slot, 100*time.Millisecond, "busy LC expands to 7 groups", groupsIs(7))
	if gl2.Groups&gl.Groups != gl.Groups || gb2.Groups&gl2.Groups != 0 || gb2.Groups|gl2.Groups != 0xff {
		t.Fatalf("LC must keep its groups, take the rest but BE's floor: lc %b->%b be %b", gl.Groups, gl2.Groups, gb2.Groups)
	}
	if d, b := tb.Gate(be.Slot); d != 8 || b != 500 {
		t.Fatalf("BE gate while LC busy: depth %d budget %d us, want 8 and 500", d, b)
	}
	if d, _ := tb.Gate(lc.Slot); d != 0 {
		t.Fatalf("LC gated: depth %d", d)
	}
	c := tb.Container(lc.Slot)
	if c.DemandSeenNs == 0 {
		t.Error("demand_seen_ns not recorded")
	}
	pl.busy(false)
	waitGrant(t, tb, be.Slot, 100*time.Millisecond, "BE borrows again", groupsIs(8))
	waitGrant(t, tb, lc.Slot, 100*time.Millisecond, "idle LC offered everything but the BE floor", groupsIs(7))
	if d, _ := tb.Gate(be.Slot); d != 8 {
		t.Fatalf("BE beside an idle LC that may reclaim its groups: gate depth %d, want 8", d)
	}
	pb.busy(false)
	// Idle BE keeps what it had of the non-exclusive groups: no churn when nothing is busy.
	time.Sleep(30 * time.Millisecond)
	if g, _ := tb.ReadGrant(be.Slot); g.Groups != gb.Groups {
		t.Errorf("idle BE reshuffled: %b -> %b", gb.Groups, g.Groups)
	}
	if s.Stats().GrantChanges.Load() == 0 || s.Stats().Passes.Load() == 0 {
		t.Error("stats not counted")
	}
	if tb.Leader().PID != os.Getpid() {
		t.Errorf("leader pid %d", tb.Leader().PID)
	}
}

func TestPolicyReloadTPOTFirst(t *testing.T) {
	dir, tb := newRunDir(t)
	pre := register(t, tb, "prefill", table.TierBestEffort, table.RolePrefill, 0, false, 0)
	dec := register(t, tb, "decode", table.TierBestEffort, table.RoleDecode, 0, false, 0)
	c := testConfig()
	s := startSched(t, dir, c, nil)
	play(t, tb, pre).busy(true)
	play(t, tb, dec).busy(true)
	waitGrant(t, tb, dec.Slot, time.Second, "throughput-oriented: 4 groups each", groupsIs(4))
	waitGrant(t, tb, pre.Slot, time.Second, "throughput-oriented: 4 groups each", groupsIs(4))
	bad := c
	bad.Scheduler.Policy = "fastest"
	if err := s.Reload(bad); err == nil || !strings.Contains(err.Error(), "fastest") {
		t.Fatalf("bad reload must be refused naming the value: %v", err)
	}
	if s.Config().Scheduler.Policy != "throughput-oriented" {
		t.Fatal("refused reload changed the configuration")
	}
	c.Scheduler.Policy = "tpot-first"
	if err := s.Reload(c); err != nil {
		t.Fatal(err)
	}
	waitGrant(t, tb, dec.Slot, time.Second, "TPOT-First: decode first pick (6)", groupsIs(6))
	waitGrant(t, tb, pre.Slot, time.Second, "TPOT-First: prefill the rest (2)", groupsIs(2))
	if tb.Header().Policy != 2 {
		t.Errorf("policy id in header %d", tb.Header().Policy)
	}
}

func TestTemporalWithoutMPS(t *testing.T) {
	dir, tb := newRunDir(t)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	b := register(t, tb, "b", table.TierBestEffort, table.RoleNone, 0, false, 0)
	lc := register(t, tb, "lc", table.TierLatencyCritical, table.RoleNone, 2, false, 0)
	c := testConfig()
	c.MPS.Enable = true
	m := &mps.Manager{Paths: table.NewPaths(dir), Control: filepath.Join(t.TempDir(), "no-such-mps-control")}
	startSched(t, dir, c, m)
	g := tb.GPUs()[0]
	if g.Mode != table.ModeTemporal || g.MPSState != table.MPSAbsent {
		t.Fatalf("without MPS the GPU must be temporal: mode %d mps %d", g.Mode, g.MPSState)
	}
	waitGrant(t, tb, a.Slot, time.Second, "temporal grant", func(g table.Grant) bool { return g.Mode == table.ModeTemporal })
	play(t, tb, a).busy(true)
	play(t, tb, b).busy(true)
	seen := map[int]bool{}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && !(seen[a.Slot] && seen[b.Slot]) {
		tok := tb.ReadToken(0)
		seen[tok.Holder] = true
		_, _ = tb.WaitToken(0, tok.Seq, 20*time.Millisecond)
	}
	if !seen[a.Slot] || !seen[b.Slot] {
		t.Fatalf("token did not rotate between the busy tenants: %v", seen)
	}
	// With a latency-critical tenant present (idle, too) the lower tiers get the tightest dispatch gate:
	// without MPS it runs once what the token holder has queued has drained.
	for _, r := range []table.Registration{a, b} {
		deadline := time.Now().Add(time.Second)
		for d, bu := tb.Gate(r.Slot); d != 1 || bu != 250; d, bu = tb.Gate(r.Slot) {
			if time.Now().After(deadline) {
				t.Fatalf("temporal %s beside a latency-critical tenant: gate %d kernels / %d us, want 1 / 250", r.ID, d, bu)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if d, _ := tb.Gate(lc.Slot); d != 0 {
		t.Fatalf("the latency-critical tenant itself got a gate of depth %d", d)
	}
	pl := play(t, tb, lc)
	start := time.Now()
	pl.busy(true)
	for tb.ReadToken(0).Holder != lc.Slot {
		if time.Since(start) > 100*time.Millisecond {
			t.Fatalf("latency-critical tenant did not take the token at once: holder %d", tb.ReadToken(0).Holder)
		}
		tok := tb.ReadToken(0)
		_, _ = tb.WaitToken(0, tok.Seq, 5*time.Millisecond)
	}
	// While it stays busy it keeps the token for its (longer) quantum and comes first.
	pl.busy(false)
	waitGrant(t, tb, lc.Slot, time.Second, "temporal grant", func(g table.Grant) bool { return g.Mode == table.ModeTemporal })
	// Once it has gone, nothing is left to bound the others' queues for.
	if err := tb.Deregister(lc.ID); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Second)
	for d, _ := tb.Gate(a.Slot); d != 0; d, _ = tb.Gate(a.Slot) {
		if time.Now().After(deadline) {
			t.Fatalf("gate of depth %d left on %s after the latency-critical tenant left", d, a.ID)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Without MPS, share_overlap leaves the tenants to the driver's time-slicing while nobody latency-critical is
// registered: unrestricted grants, no token held, no gate (time-slicing's end of the frontier, issue 26). A
// latency-critical tenant, idle too, brings the token and the gates back at once, and they go again when it leaves.
func TestTemporalShareOverlapLeavesTimeSlicingToTheDriver(t *testing.T) {
	dir, tb := newRunDir(t)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	b := register(t, tb, "b", table.TierBurstable, table.RoleNone, 0, false, 0)
	c := testConfig()
	c.Scheduler.ShareOverlap = true
	startSched(t, dir, c, &mps.Manager{Paths: table.NewPaths(dir), Simulated: true}) // mps.enable = false kept
	if g := tb.GPUs()[0]; g.Mode != table.ModeTemporal {
		t.Fatalf("mps.enable = false: the GPU must be temporal, mode %d", g.Mode)
	}
	unrestricted := func(g table.Grant) bool { return g.Mode == table.ModeUnrestricted }
	temporal := func(g table.Grant) bool { return g.Mode == table.ModeTemporal }
	noToken := func(what string) {
		t.Helper()
		deadline := time.Now().Add(time.Second)
		for tb.ReadToken(0).Holder != -1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: token held by slot %d, want nobody", what, tb.ReadToken(0).Holder)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	ungated := func(what string, rs ...table.Registration) {
		t.Helper()
		for _, r := range rs {
			if d, _ := tb.Gate(r.Slot); d != 0 {
				t.Fatalf("%s: %s gated at depth %d", what, r.ID, d)
			}
		}
	}
	play(t, tb, a).busy(true)
	play(t, tb, b).busy(true)
	for _, r := range []table.Registration{a, b} {
		waitGrant(t, tb, r.Slot, time.Second, "unrestricted grant (time-sliced by the driver)", unrestricted)
	}
	noToken("two busy sharers")
	ungated("two busy sharers", a, b)
	// the tiers do not take turns either: over a while the token stays free and the grants unrestricted
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, r := range []table.Registration{a, b} {
			if g, err := tb.ReadGrant(r.Slot); err != nil || g.Mode != table.ModeUnrestricted {
				t.Fatalf("%s's grant left unrestricted mode: %+v %v", r.ID, g, err)
			}
		}
		if h := tb.ReadToken(0).Holder; h != -1 {
			t.Fatalf("token handed to slot %d between sharers", h)
		}
	}

	lc := register(t, tb, "lc", table.TierLatencyCritical, table.RoleNone, 2, false, 0)
	for _, r := range []table.Registration{a, b, lc} {
		waitGrant(t, tb, r.Slot, time.Second, "temporal grant beside a latency-critical tenant", temporal)
	}
	for _, r := range []table.Registration{a, b} {
		deadline := time.Now().Add(time.Second)
		for d, _ := tb.Gate(r.Slot); d != 1; d, _ = tb.Gate(r.Slot) {
			if time.Now().After(deadline) {
				t.Fatalf("%s beside an idle latency-critical tenant: gate depth %d, want 1", r.ID, d)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		if h := tb.ReadToken(0).Holder; h == a.Slot || h == b.Slot {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("beside a latency-critical tenant the busy sharers take turns by the token: holder %d", h)
		}
	}

	if err := tb.Deregister(lc.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range []table.Registration{a, b} {
		waitGrant(t, tb, r.Slot, time.Second, "unrestricted again once the latency-critical tenant left", unrestricted)
	}
	noToken("after the latency-critical tenant left")
	ungated("after the latency-critical tenant left", a, b)
}

func TestSecondLeaderRefused(t *testing.T) {
	dir, _ := newRunDir(t)
	startSched(t, dir, testConfig(), nil)
	_, err := New(Options{RunDir: dir, Config: testConfig()})
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("second leader: %v", err)
	}
}

func TestCorruptAndVersionMismatchRefused(t *testing.T) {
	dir, tb := newRunDir(t)
	tb.Close()
	p := table.NewPaths(dir).Table()
	orig, _ := os.ReadFile(p)
	// Version mismatch: abi_version at offset 8.
	v := append([]byte{}, orig...)
	v[8] = 99
	os.WriteFile(p, v, 0o644)
	_, err := New(Options{RunDir: dir, Config: testConfig()})
	if !errors.Is(err, table.ErrVersionMismatch) {
		t.Fatalf("version mismatch: %v", err)
	}
	if after, _ := os.ReadFile(p); string(after) != string(v) {
		t.Fatal("a refused table was written to")
	}
	// Corrupt: garbage magic.
	c := append([]byte{}, orig...)
	copy(c, "garbage!")
	os.WriteFile(p, c, 0o644)
	_, err = New(Options{RunDir: dir, Config: testConfig()})
	if !errors.Is(err, table.ErrCorrupt) || !strings.Contains(err.Error(), "scheduler") {
		t.Fatalf("corrupt table: %v", err)
	}
	// Truncated.
	os.WriteFile(p, orig[:100], 0o644)
	if _, err = New(Options{RunDir: dir, Config: testConfig()}); err == nil {
		t.Fatal("truncated table accepted")
	}
	// The lock was released each time: a good table is led again.
	os.WriteFile(p, orig, 0o644)
	s, err := New(Options{RunDir: dir, Config: testConfig()})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestBadConfigRefused(t *testing.T) {
	dir, _ := newRunDir(t)
	c := testConfig()
	c.Scheduler.Policy = "x"
	if _, err := New(Options{RunDir: dir, Config: c}); err == nil || !strings.Contains(err.Error(), "scheduler.policy") {
		t.Fatalf("bad config: %v", err)
	}
	if _, err := os.Stat(table.NewPaths(dir).SchedLock()); err == nil {
		// The lock file may exist from newRunDir's Create; what matters is that it is free.
		if _, err := Acquire(dir); err != nil {
			t.Fatalf("lock left held: %v", err)
		}
	}
}

func TestStepsDownWhenTableRemoved(t *testing.T) {
	dir, _ := newRunDir(t)
	s, err := New(Options{RunDir: dir, Config: testConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	os.Remove(table.NewPaths(dir).Table())
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "removed") {
			t.Fatalf("step down: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("scheduler kept running on a removed table")
	}
}

// spawn starts the test binary in a helper role.
func spawn(t *testing.T, role string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "DETSHARE_DAEMON_TEST_ROLE="+role), env...)
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if role == "client" {
		line, _ := bufio.NewReader(out).ReadString('\n')
		if strings.TrimSpace(line) != "ready" {
			t.Fatalf("client helper: %q", line)
		}
	}
	return cmd
}

func waitLeader(t *testing.T, tb *table.Table, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for tb.Leader().PID != pid || !tb.LeaderAlive(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not become leader (leader %+v)", pid, tb.Leader())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestChaosKillScheduler: kill -9 the scheduler; grants stay (fail-static); a new leader resumes from the table
// without reshuffling, and serves demand again.
func TestChaosKillScheduler(t *testing.T) {
	dir, tb := newRunDir(t)
	// Pinned: an expanding LC's idle grant follows what others hold exclusively (the burstable going idle below);
	// this test is about the takeover keeping a grant exactly.
	lc, err := tb.Register(table.RegisterRequest{ID: "lc", Tier: table.TierLatencyCritical, GPU: 0, Weight: 1,
		SMGroups: 3, SMs: 24, Pinned: true})
	if err != nil {
		t.Fatal(err)
	}
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	bu := register(t, tb, "bu", table.TierBurstable, table.RoleNone, 1, false, 0)
	env := []string{table.RunDirEnv + "=" + dir, "DETSHARE_SIMGPU=1", "TEST_MPS=1"}
	s1 := spawn(t, "sched", env...)
	waitLeader(t, tb, s1.Process.Pid)
	epoch1 := tb.Leader().Epoch
	pb, pu := play(t, tb, be), play(t, tb, bu)
	pb.busy(true)
	pu.busy(true)
	waitGrant(t, tb, be.Slot, time.Second, "BE 2 groups", groupsIs(2))
	waitGrant(t, tb, bu.Slot, time.Second, "BU 1+2 groups", groupsIs(3))
	before := map[int]table.Grant{}
	for _, r := range []table.Registration{lc, be, bu} {
		before[r.Slot], _ = tb.ReadGrant(r.Slot)
	}
	s1.Process.Signal(syscall.SIGKILL)
	s1.Wait()
	// Fail-static: demand changes while no scheduler runs; nothing moves, nothing breaks.
	pu.busy(false)
	time.Sleep(100 * time.Millisecond)
	for slot, g := range before {
		now, err := tb.ReadGrant(slot)
		if err != nil || now.Groups != g.Groups || now.Epoch != g.Epoch {
			t.Fatalf("slot %d grant changed with no scheduler: %+v -> %+v (%v)", slot, g, now, err)
		}
	}
	if tb.LeaderAlive(time.Second) {
		t.Fatal("dead leader reported alive")
	}
	// A new leader resumes: the epoch grows, the registrations are all there, the LC keeps its exact groups.
	s2 := spawn(t, "sched", env...)
	waitLeader(t, tb, s2.Process.Pid)
	if tb.Leader().Epoch != epoch1+1 {
		t.Errorf("epoch %d after takeover, want %d", tb.Leader().Epoch, epoch1+1)
	}
	if n := len(tb.List()); n != 3 {
		t.Fatalf("%d registrations after takeover", n)
	}
	// It serves the demand change that happened while nobody led: idle BU lends, BE takes 5.
	waitGrant(t, tb, be.Slot, time.Second, "BE 5 groups after takeover", groupsIs(5))
	if g, _ := tb.ReadGrant(lc.Slot); g.Groups != before[lc.Slot].Groups || g.Epoch != before[lc.Slot].Epoch {
		t.Errorf("takeover reshuffled the LC: %+v -> %+v", before[lc.Slot], g)
	}
	if g, _ := tb.ReadGrant(be.Slot); g.Groups&before[be.Slot].Groups != before[be.Slot].Groups {
		t.Errorf("BE lost groups it had when it grew: %b -> %b", before[be.Slot].Groups, g.Groups)
	}
}

// TestChaosKillClient: kill -9 a tenant's process; within 1 s its entry is reaped, its memory credited and its
// groups returned to the others.
func TestChaosKillClient(t *testing.T) {
	dir, tb := newRunDir(t)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	b := register(t, tb, "b", table.TierBestEffort, table.RoleNone, 0, false, 0)
	startSched(t, dir, testConfig(), nil)
	play(t, tb, a).busy(true)
	cl := spawn(t, "client", table.RunDirEnv+"="+dir, "PAGE="+b.ClientPagePath, "CHARGE=1048576")
	waitGrant(t, tb, a.Slot, time.Second, "A shares (4)", groupsIs(4))
	waitGrant(t, tb, b.Slot, time.Second, "B shares (4)", groupsIs(4))
	page, err := table.OpenClientPageReadOnly(b.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer page.Close()
	if page.Page().MemUsed != 1<<20 || page.LiveProcesses() != 1 {
		t.Fatalf("client not attached: mem %d procs %d", page.Page().MemUsed, page.LiveProcesses())
	}
	killed := time.Now()
	cl.Process.Signal(syscall.SIGKILL)
	cl.Wait()
	waitGrant(t, tb, a.Slot, time.Second, "A gets B's groups back", groupsIs(8))
	for page.LiveProcesses() != 0 || page.Page().MemUsed != 0 || page.Page().Demand != 0 {
		if time.Since(killed) > time.Second {
			t.Fatalf("not reaped within 1 s: procs %d mem %d demand %d", page.LiveProcesses(), page.Page().MemUsed, page.Page().Demand)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("client reclaimed %s after kill -9", time.Since(killed))
}

// TestChaosKillHostTenant: kill -9 the owner of a whole tenant (`detshare run`); within 1 s the tenant is gone and
// its guarantee is free for the others.
func TestChaosKillHostTenant(t *testing.T) {
	dir, tb := newRunDir(t)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	owner := spawn(t, "owner")
	h := register(t, tb, "host", table.TierLatencyCritical, table.RoleNone, 4, false, owner.Process.Pid)
	startSched(t, dir, testConfig(), nil)
	play(t, tb, a).busy(true)
	waitGrant(t, tb, a.Slot, time.Second, "A gets the 4 unreserved groups", groupsIs(4))
	killed := time.Now()
	owner.Process.Signal(syscall.SIGKILL)
	owner.Wait()
	waitGrant(t, tb, a.Slot, 1500*time.Millisecond, "A gets the dead tenant's guarantee", groupsIs(8))
	if _, ok := tb.Lookup(h.ID); ok {
		t.Fatal("dead host tenant still registered")
	}
	if d := time.Since(killed); d > time.Second {
		t.Errorf("tenant reclaimed after %s, want <= 1 s", d)
	}
}

// TestSLOViolationsAndMetrics: a burstable tenant whose demand is answered later than scheduler.latency_slo counts
// an SLO violation (once per rise); a generous SLO counts none. The metrics source exports both the table's view and
// the scheduler's counters.
func TestSLOViolationsAndMetrics(t *testing.T) {
	for _, tc := range []struct {
		slo  time.Duration
		want bool
	}{{time.Microsecond, true}, {time.Minute, false}} {
		dir, tb := newRunDir(t)
		bu := register(t, tb, "bu", table.TierBurstable, table.RoleNone, 2, false, 0)
		be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
		c := testConfig()
		c.Scheduler.LatencySLO = config.Duration{Duration: tc.slo}
		s := startSched(t, dir, c, nil)
		play(t, tb, be).busy(true)
		waitGrant(t, tb, be.Slot, time.Second, "BE borrows all", groupsIs(8))
		play(t, tb, bu).busy(true)
		waitGrant(t, tb, bu.Slot, time.Second, "BU guarantee + share", groupsIs(4))
		time.Sleep(20 * time.Millisecond)
		v := s.TenantStats()["bu"].SLOViolations
		if (v > 0) != tc.want || v > 1 {
			t.Fatalf("SLO %s: %d violations, want violation=%v (at most one per rise)", tc.slo, v, tc.want)
		}
		if s.TenantStats()["be"].SLOViolations != 0 {
			t.Fatal("best-effort tenants have no SLO")
		}
		snap, ex := s.MetricsSource()()
		if len(snap.Tenants) != 2 || ex.SLOViolations["bu"] != v || ex.GrantChanges == 0 || ex.Passes == 0 || !snap.Scheduler.Alive {
			t.Fatalf("metrics source: %+v %+v", snap, ex)
		}
	}
}

// TestChaosKillWholeContainer: every process of a container tenant is killed at once (the container died without
// its poststop hook); within 1 s all entries are reaped, all memory is credited and its share goes to the others,
// while its registration (and guarantee) stays until the runtime deregisters it.
func TestChaosKillWholeContainer(t *testing.T) {
	dir, tb := newRunDir(t)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	c := register(t, tb, "ctr", table.TierBurstable, table.RoleNone, 2, false, 0)
	startSched(t, dir, testConfig(), nil)
	play(t, tb, a).busy(true)
	env := []string{table.RunDirEnv + "=" + dir, "PAGE=" + c.ClientPagePath, "CHARGE=4096"}
	p1, p2 := spawn(t, "client", env...), spawn(t, "client", env...)
	waitGrant(t, tb, c.Slot, time.Second, "container: guarantee + share (4)", groupsIs(4))
	page, err := table.OpenClientPageReadOnly(c.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer page.Close()
	if page.LiveProcesses() != 2 || page.Page().MemUsed != 8192 || page.Page().Demand != 2 {
		t.Fatalf("before: procs %d mem %d demand %d", page.LiveProcesses(), page.Page().MemUsed, page.Page().Demand)
	}
	killed := time.Now()
	p1.Process.Signal(syscall.SIGKILL)
	p2.Process.Signal(syscall.SIGKILL)
	p1.Wait()
	p2.Wait()
	waitGrant(t, tb, a.Slot, time.Second, "A borrows the idle container's groups (8)", groupsIs(8))
	for page.LiveProcesses() != 0 || page.Page().MemUsed != 0 || page.Page().Demand != 0 {
		if time.Since(killed) > time.Second {
			t.Fatalf("not reclaimed within 1 s: procs %d mem %d demand %d", page.LiveProcesses(), page.Page().MemUsed, page.Page().Demand)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok := tb.Lookup("ctr"); !ok {
		t.Fatal("container registration removed by the scheduler; only its runtime deregisters it")
	}
	waitGrant(t, tb, c.Slot, 100*time.Millisecond, "idle container keeps its guarantee groups as its grant", groupsIs(2))
}
