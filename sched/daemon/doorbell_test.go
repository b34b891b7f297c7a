package daemon

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
)

// doorbellWhole reports what is wrong with the doorbell file, or "" when its size, mode and magic are right.
func doorbellWhole(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return err.Error()
	}
	if st.Size() != table.DoorbellSize {
		return fmt.Sprintf("size %d", st.Size())
	}
	if st.Mode().Perm() != table.DoorbellMode {
		return "mode " + st.Mode().Perm().String()
	}
	b := make([]byte, 8)
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 0); err != nil {
		return err.Error()
	}
	if binary.LittleEndian.Uint64(b) != table.DoorbellMagic {
		return "magic"
	}
	return ""
}

func waitDoorbellWhole(t *testing.T, path string, d time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		bad := doorbellWhole(path)
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: doorbell %s not repaired within %s (%s)", what, path, d, bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// damageDoorbell is the attack of issue 27: the magic overwritten, the file truncated into its first page (no
// fault for anyone: nothing noticed it before) and its mode changed.
func damageDoorbell(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("garbage!"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(path, 100); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if doorbellWhole(path) == "" {
		t.Fatal("damage did not take")
	}
}

// TestSchedulerRepairsDamagedDoorbell: a damaged doorbell (magic, size in 1..4095, mode) is put right by the running
// scheduler's housekeeping within a bounded time, and by a scheduler that starts on a damaged one; demand changes
// are answered promptly throughout.
func TestSchedulerRepairsDamagedDoorbell(t *testing.T) {
	dir, tb := newRunDir(t)
	lc := register(t, tb, "lc", table.TierLatencyCritical, table.RoleNone, 2, true, 0)
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	env := []string{table.RunDirEnv + "=" + dir, "DETSHARE_SIMGPU=1", "TEST_MPS=1"}
	s1 := spawn(t, "sched", env...)
	waitLeader(t, tb, s1.Process.Pid)
	pl, pb := play(t, tb, lc), play(t, tb, be)
	pb.busy(true)
	waitGrant(t, tb, be.Slot, time.Second, "busy BE borrows the idle LC's groups", groupsIs(8))
	bell := table.NewPaths(dir).Doorbell()

	damageDoorbell(t, bell)
	waitDoorbellWhole(t, bell, 2*time.Second, "running scheduler")
	pl.busy(true)
	waitGrant(t, tb, lc.Slot, time.Second, "LC takes at least its 2 groups back after the repair", atLeast(2))

	// Across a restart: damaged while no scheduler runs, repaired by the next one at start.
	s1.Process.Signal(syscall.SIGKILL)
	s1.Wait()
	damageDoorbell(t, bell)
	s2 := spawn(t, "sched", env...)
	waitLeader(t, tb, s2.Process.Pid)
	waitDoorbellWhole(t, bell, 2*time.Second, "restarted scheduler")
	pl.busy(false)
	waitGrant(t, tb, be.Slot, time.Second, "BE borrows again after the LC idles", atLeast(6))
}

func atLeast(n int) func(table.Grant) bool {
	return func(g table.Grant) bool { return g.Mode == table.ModeSpatial && bits.OnesCount64(g.Groups) >= n }
}

// TestSchedulerStartsOnDamagedDoorbell: a scheduler that starts on a doorbell damaged while none ran repairs it
// before mapping it, so it is woken by rings at once rather than waiting by timeout (the 2.5 -> 79.9 ms burst
// maximum of issue 27): with reaping once a second and a 5 s tick, a demand change is answered well within both.
func TestSchedulerStartsOnDamagedDoorbell(t *testing.T) {
	dir, tb := newRunDir(t)
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	bell := table.NewPaths(dir).Doorbell()
	damageDoorbell(t, bell)
	c := testConfig()
	c.Scheduler.ReapEvery = config.Duration{Duration: time.Second}
	c.Scheduler.Tick = config.Duration{Duration: 5 * time.Second}
	s := startSched(t, dir, c, nil)
	if bad := doorbellWhole(bell); bad != "" {
		t.Fatalf("doorbell not repaired at start: %s", bad)
	}
	if s.t.Doorbell() == nil {
		t.Fatal("scheduler started without a doorbell mapping: it can only wait by timeout")
	}
	time.Sleep(50 * time.Millisecond) // past the first passes
	start := time.Now()
	play(t, tb, be).busy(true)
	waitGrant(t, tb, be.Slot, 900*time.Millisecond, "busy BE answered before the next reap", atLeast(6))
	t.Logf("busy BE answered in %s", time.Since(start))
}
