package daemon

import (
	"math/bits"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// TestTenantTruncatingItsFilesCannotKillTheScheduler is the attack of issue 13 item 1: a tenant truncates the
// doorbell (world-writable, bound into every container) and its own client page, repeatedly, in both directions.
// The scheduler process must survive (before the fix it died of SIGBUS), keep serving the other tenant's demand,
// and keep the attacker on its guarantee; the doorbell is repaired so wake-ups work again.
func TestTenantTruncatingItsFilesCannotKillTheScheduler(t *testing.T) {
	dir, tb := newRunDir(t)
	victim := register(t, tb, "victim", table.TierBestEffort, table.RoleNone, 0, false, 0)
	attacker := register(t, tb, "attacker", table.TierBurstable, table.RoleNone, 2, false, 0)
	env := []string{table.RunDirEnv + "=" + dir, "DETSHARE_SIMGPU=1", "TEST_MPS=1"}
	sched := spawn(t, "sched", env...) // a separate process: a SIGBUS would kill it, not the test
	waitLeader(t, tb, sched.Process.Pid)
	pa := play(t, tb, attacker)
	pa.busy(true)
	waitGrant(t, tb, attacker.Slot, time.Second, "busy attacker takes all 8 groups", groupsIs(8))

	p := table.NewPaths(dir)
	for round := 0; round < 5; round++ {
		for _, f := range []string{p.Doorbell(), attacker.ClientPagePath} {
			for _, size := range []int64{0, 17, 0} {
				if err := os.Truncate(f, size); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond) // several scheduler passes and reaps see each size
			}
		}
		// and grown far past its size, with garbage
		if err := os.WriteFile(attacker.ClientPagePath, make([]byte, 3*table.ClientPageSize), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if err := os.Truncate(attacker.ClientPagePath, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := sched.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("scheduler died: %v", err)
	}
	var ws syscall.WaitStatus
	if pid, _ := syscall.Wait4(sched.Process.Pid, &ws, syscall.WNOHANG, nil); pid != 0 {
		t.Fatalf("scheduler exited: %v", ws)
	}
	if !tb.LeaderAlive(time.Second) || tb.Leader().PID != sched.Process.Pid {
		t.Fatalf("scheduler no longer leads: %+v", tb.Leader())
	}
	// The doorbell was given its size back.
	if st, err := os.Stat(p.Doorbell()); err != nil || st.Size() != table.DoorbellSize {
		t.Fatalf("doorbell not repaired: %v %v", st, err)
	}
	// The scheduler still serves demand: the victim's busy turn is seen and answered (at least the 6 groups nobody is
	// guaranteed; the idle attacker may lend it its 2); the attacker, whose page is gone, has no demand and borrows
	// nothing.
	play(t, tb, victim).busy(true)
	atLeast6 := func(g table.Grant) bool { return g.Mode == table.ModeSpatial && bits.OnesCount64(g.Groups) >= 6 }
	waitGrant(t, tb, victim.Slot, 2*time.Second, "victim gets at least the 6 unguaranteed groups", atLeast6)
	atMost2 := func(g table.Grant) bool { return bits.OnesCount64(g.Groups) <= 2 }
	waitGrant(t, tb, attacker.Slot, 2*time.Second, "attacker borrows nothing beyond its 2 guaranteed groups", atMost2)
}

// TestTableTruncatedSchedulerStepsDown: only root on the host can truncate the table; nothing can be scheduled
// through it then, but the scheduler must step down with an error naming the table, not die of SIGBUS (tenants keep
// their last grant: cgroupgpu/libdetshare TestTruncatedFilesKeepTheLastGrant).
func TestTableTruncatedSchedulerStepsDown(t *testing.T) {
	dir, tb := newRunDir(t)
	register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	env := []string{table.RunDirEnv + "=" + dir, "DETSHARE_SIMGPU=1", "TEST_MPS=1"}
	sched := spawn(t, "sched", env...)
	waitLeader(t, tb, sched.Process.Pid)
	tb.Close() // the test's own mapping must not be touched once the file is truncated
	if err := os.Truncate(table.NewPaths(dir).Table(), 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sched.Wait() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("scheduler exited with %v, want an error exit", err)
		}
		if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() || ws.ExitStatus() == 2 {
			t.Fatalf("scheduler died (%v): a fault, not a step-down", ws)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("scheduler neither stepped down nor died within 5 s of the truncation")
	}
}
