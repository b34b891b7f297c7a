package table

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// crashWorker is the body of a child process of TestCrashSafety: it registers, prepares, attaches, charges,
// publishes grants, detaches and deregisters in a loop until it is SIGKILLed.
func crashWorker(dir string, worker int) {
	tb, err := Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	surv, ok := tb.Lookup("survivor")
	if !ok {
		os.Exit(4)
	}
	cl, err := OpenClientPage(surv.ClientPagePath)
	if err != nil {
		os.Exit(5)
	}
	self, _ := SelfIdentity()
	for n := 0; ; n++ {
		id := fmt.Sprintf("w%d-%d-%d", worker, os.Getpid(), n)
		_, err := tb.Register(RegisterRequest{ID: id, Weight: 1, OwnerPID: os.Getpid(), Prepare: func(reg Registration) error {
			if err := os.MkdirAll(reg.TenantDir, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(reg.TenantDir, "quota"), []byte("x"), 0o644)
		}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "register:", err)
			os.Exit(6)
		}
		if i, err := cl.AttachProcess(self); err == nil {
			cl.ChargeMemory(i, 4096, 0)
			cl.SetBusy(i, true)
			if n%3 != 0 {
				cl.DetachProcess(i)
			}
		}
		if worker == 0 { // the "leader" of this test
			tb.PublishGrant(surv.Slot, Grant{Groups: uint64(n), SMs: 8, Mode: ModeSpatial})
		}
		if err := tb.Deregister(id); err != nil {
			fmt.Fprintln(os.Stderr, "deregister:", err)
			os.Exit(7)
		}
	}
}

// TestCrashSafety SIGKILLs processes that register/deregister/attach/publish in a loop at random points, then
// checks that a new process can open the table, recover, reap and register, and that the table is consistent:
// no slot stuck RESERVED/DRAINING, no host tenant of a dead owner, no stray client page or tenant directory, the
// survivor's memory accounting back to zero, and its grant readable.
func TestCrashSafety(t *testing.T) {
	if v := os.Getenv("DETSHARE_TEST_CRASH"); v != "" {
		w, _ := strconv.Atoi(os.Getenv("DETSHARE_TEST_CRASH_WORKER"))
		crashWorker(v, w)
		return
	}
	tb := newTable(t)
	dir := tb.Paths().Dir
	surv, err := tb.Register(RegisterRequest{ID: "survivor", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	start := func(w int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashSafety$")
		cmd.Env = append(os.Environ(), "DETSHARE_TEST_CRASH="+dir, fmt.Sprintf("DETSHARE_TEST_CRASH_WORKER=%d", w))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	const workers, kills = 3, 45
	procs := make([]*exec.Cmd, workers)
	for w := range procs {
		procs[w] = start(w)
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	seed := rng.Int63()
	t.Logf("seed %d", seed)
	rng.Seed(seed)
	for k := 0; k < kills; k++ {
		time.Sleep(time.Duration(5+rng.Intn(40)) * time.Millisecond)
		w := rng.Intn(workers)
		procs[w].Process.Signal(syscall.SIGKILL)
		if err := procs[w].Wait(); err != nil {
			if ws := procs[w].ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() {
				t.Fatalf("worker %d failed by itself: %v", w, err)
			}
		}
		procs[w] = start(w)
	}
	for _, p := range procs {
		p.Process.Signal(syscall.SIGKILL)
		p.Wait()
	}

	// A new process: open, reap, register.
	t2, err := Open(dir)
	if err != nil {
		t.Fatalf("open after crashes: %v", err)
	}
	defer t2.Close()
	if _, err := t2.Recover(); err != nil {
		t.Fatal(err)
	}
	if _, err := t2.ReapDeadTenants(); err != nil {
		t.Fatal(err)
	}
	for slot := 0; slot < MaxContainers; slot++ {
		if st := atomic.LoadUint32(&t2.Container(slot).State); st == SlotReserved || st == SlotDraining {
			t.Errorf("slot %d stuck in state %d", slot, st)
		}
	}
	list := t2.List()
	if len(list) != 1 || list[0].ID != "survivor" || list[0].Slot != surv.Slot {
		t.Errorf("active after reaping: %+v", list)
	}
	pages, _ := filepath.Glob(filepath.Join(t2.Paths().ClientsDir(), "*"))
	hidden, _ := filepath.Glob(filepath.Join(t2.Paths().ClientsDir(), ".*"))
	if len(pages) != 1 || pages[0] != surv.ClientPagePath || len(hidden) != 0 {
		t.Errorf("client pages left: %v %v", pages, hidden)
	}
	tenants, _ := os.ReadDir(t2.Paths().TenantsDir())
	if len(tenants) != 0 {
		t.Errorf("%d tenant directories left", len(tenants))
	}
	cl, err := OpenClientPage(surv.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ps, _ := ScanProcesses()
	cl.ReapDeadProcesses(ps)
	if n := cl.LiveProcesses(); n != 0 {
		t.Errorf("survivor page after reaping: %d live process entries", n)
	}
	// A worker killed mid-claim or mid-detach leaves its entry CLAIMING or REAPING; the reaper cannot tell it from
	// one in progress until ClaimTimeout has passed. Age those entries past it, as the scheduler's next sweeps would
	// see them, and reap again: then every entry must be free and every byte and demand credited back.
	stuck := 0
	for i := range cl.Page().Procs {
		p := &cl.Page().Procs[i]
		switch st := atomic.LoadUint32(&p.State); st {
		case ProcFree:
		case ProcClaiming, ProcReaping:
			stuck++
			atomic.StoreUint64(&p.HeartbeatNs, MonotonicNs()-uint64(ClaimTimeout)-1)
		default:
			t.Errorf("proc entry %d in state %d after reaping", i, st)
		}
	}
	t.Logf("%d entries left mid-claim or mid-detach by a kill", stuck)
	cl.ReapDeadProcesses(ps)
	for i := range cl.Page().Procs {
		if st := atomic.LoadUint32(&cl.Page().Procs[i].State); st != ProcFree {
			t.Errorf("proc entry %d in state %d once ClaimTimeout passed", i, st)
		}
	}
	if p := cl.Page(); p.MemUsed != 0 || p.Demand != 0 {
		t.Errorf("survivor page after reaping: mem %d demand %d", p.MemUsed, p.Demand)
	}
	if err := t2.PublishGrant(surv.Slot, Grant{Groups: 3, SMs: 16, Mode: ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	if g, err := t2.ReadGrant(surv.Slot); err != nil || g.Groups != 3 {
		t.Errorf("grant after crashes: %+v %v", g, err)
	}
	if _, err := t2.Register(RegisterRequest{ID: "after", Weight: 1}); err != nil {
		t.Fatalf("register after crashes: %v", err)
	}
}

// TestLeaderDiesClientsKeepGrant: a scheduler leader (child process) publishes grants and heartbeats until it is
// SIGKILLed; the grant stays readable (fail-static), the dead leader is detected, and a new leader takes over
// with a new epoch and publishes again.
func TestLeaderDiesClientsKeepGrant(t *testing.T) {
	if dir := os.Getenv("DETSHARE_TEST_LEADER"); dir != "" {
		tb, err := Open(dir)
		if err != nil {
			os.Exit(3)
		}
		reg, _ := tb.Lookup("client")
		if _, err := tb.SetLeader(os.Getpid()); err != nil {
			os.Exit(4)
		}
		for n := uint64(1); ; n++ {
			tb.PublishGrant(reg.Slot, Grant{Groups: n, SMs: 8, Mode: ModeSpatial})
			tb.Heartbeat()
			time.Sleep(time.Millisecond)
		}
	}
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "client", Weight: 1})
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaderDiesClientsKeepGrant$")
	cmd.Env = append(os.Environ(), "DETSHARE_TEST_LEADER="+tb.Paths().Dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for tb.Leader().PID != cmd.Process.Pid || tb.GrantEpoch(reg.Slot) < 5 {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("child never led")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !tb.LeaderAlive(5 * time.Second) {
		t.Error("live leader not alive")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if tb.LeaderAlive(time.Hour) {
		t.Error("dead leader reported alive")
	}
	g, err := tb.ReadGrant(reg.Slot)
	if err != nil && !errors.Is(err, ErrGrantBusy) {
		t.Fatal(err)
	}
	if err == nil && (g.Groups == 0 || g.Mode != ModeSpatial) {
		t.Errorf("last grant lost: %+v", g)
	}
	epoch := tb.Leader().Epoch
	l, err := tb.SetLeader(os.Getpid())
	if err != nil || l.Epoch != epoch+1 {
		t.Fatalf("takeover: %+v %v (previous epoch %d)", l, err, epoch)
	}
	if err := tb.PublishGrant(reg.Slot, Grant{Groups: 1 << 40, SMs: 8, Mode: ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	if g, err := tb.ReadGrant(reg.Slot); err != nil || g.Groups != 1<<40 {
		t.Fatalf("new leader's grant: %+v %v", g, err)
	}
}
