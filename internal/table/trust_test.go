package table

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"
)

// TestGuardTurnsTruncationIntoError: a client page truncated under its mapping faults (SIGBUS) on the next read;
// Guard turns that into ErrFault instead of killing the reader, and a later Open refuses the short file.
func TestGuardTurnsTruncationIntoError(t *testing.T) {
	tb := newTable(t)
	reg, err := tb.Register(RegisterRequest{ID: "trunc", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := OpenClientPageReadOnly(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := Guard("read", func() { _ = atomic.LoadUint32(&cl.Page().Demand) }); err != nil {
		t.Fatalf("intact page: %v", err)
	}
	if err := os.Truncate(reg.ClientPagePath, 0); err != nil {
		t.Fatal(err)
	}
	err = Guard("read", func() { _ = atomic.LoadUint32(&cl.Page().Demand) })
	if !errors.Is(err, ErrFault) {
		t.Fatalf("read of a truncated page: %v, want ErrFault", err)
	}
	if _, err := OpenClientPage(reg.ClientPagePath); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open of a truncated page: %v, want ErrCorrupt", err)
	}
	// A panic that is not a fault is not swallowed.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Guard swallowed an ordinary panic")
			}
		}()
		_ = Guard("panic", func() { panic("boom") })
	}()
	// The doorbell: truncated, the table's own ring and read survive and RepairDoorbell gives it back.
	if err := os.Truncate(tb.Paths().Doorbell(), 0); err != nil {
		t.Fatal(err)
	}
	tb.RingDoorbell()
	if seq := tb.DoorbellSeq(); seq != 0 {
		t.Errorf("truncated doorbell read %d", seq)
	}
	if ok, err := tb.RepairDoorbell(); !ok || err != nil {
		t.Fatalf("repair: %v %v", ok, err)
	}
	if st, _ := os.Stat(tb.Paths().Doorbell()); st.Size() != DoorbellSize || tb.Doorbell().Magic != DoorbellMagic {
		t.Fatalf("doorbell after repair: %d bytes magic %#x", st.Size(), tb.Doorbell().Magic)
	}
	before := tb.DoorbellSeq()
	tb.RingDoorbell()
	if tb.DoorbellSeq() != before+1 {
		t.Error("repaired doorbell does not ring")
	}
}

// TestReaperKeepsSlotWhileOrphanLives is the reaper half of issue 13 item 5: `detshare run` (the owner) is killed
// with SIGKILL while the command it started keeps running on the GPU. The slot must not be freed (and so not be
// handed to a newcomer) while that process lives; once it exits, the tenant is reaped as before.
func TestReaperKeepsSlotWhileOrphanLives(t *testing.T) {
	tb := newTable(t)
	owner := exec.Command("sleep", "300")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Process.Kill(); _ = owner.Wait() })
	reg, err := tb.Register(RegisterRequest{ID: "host", Weight: 1, OwnerPID: owner.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	orphan := mapPageProcess(t, reg.ClientPagePath) // a process of the tenant maps its page, as the library does
	cl, err := OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id, err := PidIdentity(orphan.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.AttachProcess(id); err != nil {
		t.Fatal(err)
	}
	_ = owner.Process.Kill()
	_ = owner.Wait()
	rep, err := tb.Reap()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Tenants) != 0 {
		t.Fatalf("host tenant reaped while its command still runs: %+v", rep)
	}
	if r, ok := tb.Lookup("host"); !ok || r.Slot != reg.Slot || r.Gen != reg.Gen {
		t.Fatalf("slot of the orphan's tenant not kept: %+v %v", r, ok)
	}
	// A newcomer (whose registration also reaps) gets another slot.
	nc, err := tb.Register(RegisterRequest{ID: "newcomer", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if nc.Slot == reg.Slot {
		t.Fatalf("newcomer got the orphan's slot %d", nc.Slot)
	}
	_ = orphan.Process.Kill()
	_ = orphan.Wait()
	time.Sleep(3 * time.Second / userHZ) // a scan judges only processes that started at least a tick before it
	// Its last process gone, the next pass reaps the tenant.
	if rep, err = tb.Reap(); err != nil {
		t.Fatal(err)
	}
	if len(rep.Tenants) != 1 || rep.Tenants[0] != "host" {
		t.Errorf("tenant not reaped once its last process exited: %+v", rep)
	}
	if _, ok := tb.Lookup("host"); ok {
		t.Fatal("host tenant still registered after its last process exited")
	}
}

// mapPageProcess starts a process (this test binary, see TestMain) that maps the client page at path and waits.
func mapPageProcess(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), "DETSHARE_TEST_MAP_PAGE="+path)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "mapped\n" {
		t.Fatalf("page mapper: %q %v", line, err)
	}
	return c
}

// TestForgedProcessEntriesKeepNoSlot is issue 27's "the reaper trusts process identities the tenant writes": the
// tenant fills its page with 64 entries naming host PID 2 (kthreadd, which never dies) or a live host process that
// is not its own, then its owner dies. Before the fix the slot and its guarantee were kept forever and newcomers were
// refused; now an entry counts only for a live process that maps this very page, so the tenant is reaped.
func TestForgedProcessEntriesKeepNoSlot(t *testing.T) {
	tb := newTable(t)
	owner := exec.Command("sleep", "300")
	stranger := exec.Command("sleep", "300") // a live process of the host that has nothing to do with the tenant
	for _, c := range []*exec.Cmd{owner, stranger} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		c := c
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	reg, err := tb.Register(RegisterRequest{ID: "forger", Weight: 1, OwnerPID: owner.Process.Pid, SMGroups: 4,
		SMs: 32, Tier: TierLatencyCritical})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	kthreadd, err := PidIdentity(2)
	if err != nil {
		t.Fatalf("host PID 2: %v", err)
	}
	other, err := PidIdentity(stranger.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	pg := cl.Page()
	for i := range pg.Procs {
		id := kthreadd
		if i%2 == 1 { // half name the stranger by its namespace identity only, as a container's entry would
			id = other
			id.HostPID = 0
		}
		p := &pg.Procs[i]
		p.NSPid, p.PidNSIno, p.StartTime, p.HostPID = id.NSPid, id.PidNSIno, id.StartTime, id.HostPID
		atomic.StoreUint32(&p.State, ProcLive)
	}
	if n := tb.liveProcessesLocked(reg.Slot, reg.ID, nil); n != 0 {
		t.Fatalf("%d forged entries counted as the tenant's live processes", n)
	}
	_ = owner.Process.Kill()
	_ = owner.Wait()
	time.Sleep(3 * time.Second / userHZ) // a scan judges only processes that started at least a tick before it
	rep, err := tb.Reap()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Tenants) != 1 || rep.Tenants[0] != "forger" {
		t.Fatalf("tenant with forged entries and a dead owner not reaped: %+v", rep)
	}
	if _, ok := tb.Lookup("forger"); ok {
		t.Fatal("its slot is still held")
	}
}
