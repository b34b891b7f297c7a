package table

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newClient(t *testing.T, tb *Table, id string) (*Client, Registration) {
	t.Helper()
	reg, err := tb.Register(RegisterRequest{ID: id, Weight: 1, MemLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl, reg
}

func TestClientAttachChargeDetach(t *testing.T) {
	tb := newTable(t)
	cl, _ := newClient(t, tb, "cl")
	self, err := SelfIdentity()
	if err != nil || self.NSPid == 0 || self.PidNSIno == 0 || self.StartTime == 0 {
		t.Fatalf("SelfIdentity: %+v %v", self, err)
	}
	i, err := cl.AttachProcess(self)
	if err != nil || cl.LiveProcesses() != 1 {
		t.Fatalf("attach: %d %v", i, err)
	}
	if !cl.ChargeMemory(i, 600<<10, 1<<20) {
		t.Fatal("charge within limit refused")
	}
	if cl.ChargeMemory(i, 600<<10, 1<<20) {
		t.Fatal("charge over the limit accepted")
	}
	p := cl.Page()
	if p.MemUsed != 600<<10 || p.OOMRefusals != 1 || p.MemPeak != 600<<10 || p.Procs[i].MemUsed != 600<<10 {
		t.Errorf("accounting: used %d peak %d refusals %d", p.MemUsed, p.MemPeak, p.OOMRefusals)
	}
	if !cl.SetBusy(i, true) || p.Demand != 1 || p.DemandSinceNs == 0 {
		t.Errorf("busy: demand %d", p.Demand)
	}
	if cl.SetBusy(i, true) {
		t.Error("busy twice reported a transition")
	}
	seq := p.DemandSeq
	if err := cl.DetachProcess(i); err != nil {
		t.Fatal(err)
	}
	if p.MemUsed != 0 || p.Demand != 0 || p.DemandSeq == seq || cl.LiveProcesses() != 0 {
		t.Errorf("after detach: used %d demand %d", p.MemUsed, p.Demand)
	}
	if err := cl.DetachProcess(i); err == nil {
		t.Error("double detach accepted")
	}
	for n := 0; n < MaxProcs; n++ {
		if _, err := cl.AttachProcess(self); err != nil {
			t.Fatalf("attach %d: %v", n, err)
		}
	}
	if _, err := cl.AttachProcess(self); err == nil {
		t.Error("attach beyond MaxProcs accepted")
	}
}

func TestClientConcurrentCharge(t *testing.T) {
	tb := newTable(t)
	cl, _ := newClient(t, tb, "cc")
	self, _ := SelfIdentity()
	var wg sync.WaitGroup
	okCount := make([]int, 4)
	for w := 0; w < 4; w++ {
		i, err := cl.AttachProcess(self)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(w, i int) {
			defer wg.Done()
			for n := 0; n < 1000; n++ {
				if cl.ChargeMemory(i, 1024, 1<<20) {
					okCount[w]++
				}
			}
		}(w, i)
	}
	wg.Wait()
	total := 0
	for _, n := range okCount {
		total += n
	}
	if total != 1024 || cl.Page().MemUsed != 1<<20 {
		t.Fatalf("%d charges of 1 KiB fit in a 1 MiB limit (used %d), want exactly 1024", total, cl.Page().MemUsed)
	}
}

// clientChild attaches through detshare_table_client.h, charges memory, prints its entry and waits to be killed.
const clientChild = `
#include "detshare_table_client.h"
#include <stdlib.h>
int main(int argc, char **argv) {
    if (argc != 3) return 10;
    struct ds_client_page *cp;
    int rc = ds_client_map(argv[1], &cp);
    if (rc != 0) { printf("map %d\n", rc); return 11; }
    uint32_t nspid; uint64_t ino, st;
    if (ds_self_identity(&nspid, &ino, &st) != 0) return 12;
    int i = ds_proc_attach(cp, nspid, ino, st, 0);
    if (i < 0) return 13;
    if (ds_mem_charge(cp, i, strtoull(argv[2], NULL, 10), 0) != 0) return 14;
    printf("attached %d nspid %u\n", i, nspid);
    fflush(stdout);
    for (;;) pause();
}
`

// TestReapDeadProcess: a C process attached (in its own PID namespace when we are root, so only the namespace
// identity can find it) and charged memory; while alive the reaper leaves it, after SIGKILL the reaper frees its
// entry and credits the memory.
func TestReapDeadProcess(t *testing.T) {
	tb := newTable(t)
	cl, _ := newClient(t, tb, "reap")
	bin := compileC(t, clientChild)
	cmd := exec.Command(bin, cl.Path(), "4096")
	newNS := haveRoot(t, "start the client in its own PID namespace")
	if newNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "attached ") {
		t.Fatalf("child: %q %v", line, err)
	}
	var idx int
	var nspid uint32
	fmt.Sscanf(line, "attached %d nspid %d", &idx, &nspid)
	if newNS && nspid != 1 {
		t.Fatalf("child in a new PID namespace reports nspid %d, want 1", nspid)
	}
	p := cl.Page()
	if p.MemUsed != 4096 || p.Procs[idx].State != ProcLive {
		t.Fatalf("child accounting: used %d state %d", p.MemUsed, p.Procs[idx].State)
	}
	ps, err := ScanProcesses()
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := cl.ReapDeadProcesses(ps); n != 0 {
		t.Fatalf("reaped %d live processes", n)
	}
	cmd.Process.Kill()
	cmd.Wait()
	time.Sleep(3 * time.Second / userHZ) // a scan judges only processes that started at least a tick before it
	ps, _ = ScanProcesses()
	n, bytes := cl.ReapDeadProcesses(ps)
	if n != 1 || bytes != 4096 || p.MemUsed != 0 || p.Procs[idx].State != ProcFree {
		t.Fatalf("after kill: reaped %d (%d bytes), used %d, state %d", n, bytes, p.MemUsed, p.Procs[idx].State)
	}
}

func TestReapStuckClaim(t *testing.T) {
	tb := newTable(t)
	cl, _ := newClient(t, tb, "stuck")
	p := &cl.Page().Procs[3]
	p.State = ProcClaiming
	p.HeartbeatNs = MonotonicNs()
	ps, _ := ScanProcesses()
	if n, _ := cl.ReapDeadProcesses(ps); n != 0 {
		t.Fatal("fresh claim reaped")
	}
	p.HeartbeatNs = MonotonicNs() - uint64(ClaimTimeout) - uint64(time.Second)
	if n, _ := cl.ReapDeadProcesses(ps); n != 1 || p.State != ProcFree {
		t.Fatalf("stuck claim not reaped: state %d", p.State)
	}
}

func TestProcIdentity(t *testing.T) {
	st, err := parseStatStartTime([]byte("123 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 20 21"))
	if err != nil || st != 777 {
		t.Fatalf("parse with ')' in comm: %d %v", st, err)
	}
	cmd := exec.Command("sleep", "30")
	cmd.Start()
	id, err := PidIdentity(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !IsProcessAlive(id) || !IsProcessAlive(ProcIdentity{NSPid: id.NSPid, PidNSIno: id.PidNSIno, StartTime: id.StartTime}) {
		t.Error("live process reported dead")
	}
	if IsProcessAlive(ProcIdentity{HostPID: id.HostPID, StartTime: id.StartTime + 1}) {
		t.Error("PID reuse (other start time) reported alive")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if IsProcessAlive(id) || HostProcessAlive(int(id.HostPID), id.StartTime) {
		t.Error("dead process reported alive")
	}
}

// TestReapPass: one Table.Reap frees a dead process's entry in a tenant's page and a dead owner's host tenant.
func TestReapPass(t *testing.T) {
	tb := newTable(t)
	cl, _ := newClient(t, tb, "ctr")
	sleeper := exec.Command("sleep", "60")
	sleeper.Start()
	id, _ := PidIdentity(sleeper.Process.Pid)
	id.HostPID = 0 // as a container process records itself
	i, _ := cl.AttachProcess(id)
	cl.ChargeMemory(i, 1<<20, 0)
	owner := exec.Command("sleep", "60")
	owner.Start()
	if _, err := tb.Register(RegisterRequest{ID: "host", Weight: 1, OwnerPID: owner.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	rep, err := tb.Reap()
	if err != nil || rep.Processes != 0 || len(rep.Tenants) != 0 {
		t.Fatalf("reap with everyone alive: %+v %v", rep, err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	owner.Process.Kill()
	owner.Wait()
	time.Sleep(3 * time.Second / userHZ) // a scan judges only processes that started at least a tick before it
	rep, err = tb.Reap()
	if err != nil || rep.Processes != 1 || rep.BytesCredited != 1<<20 || len(rep.Tenants) != 1 || rep.Tenants[0] != "host" {
		t.Fatalf("reap: %+v %v", rep, err)
	}
	if cl.Page().MemUsed != 0 {
		t.Errorf("memory not credited: %d", cl.Page().MemUsed)
	}
}

// A scan applied after it was taken must not take a process that started after it for dead (the scheduler scans
// /proc beside its decision loop and applies the scan later); one that started before and is missing is dead.
func TestScanJudgesOnlyOlderProcesses(t *testing.T) {
	ps, err := ScanProcesses()
	if err != nil {
		t.Fatal(err)
	}
	if ps.startedBefore == 0 {
		t.Fatal("no /proc/uptime reading: the scan cannot tell new processes from dead ones")
	}
	time.Sleep(3 * time.Second / userHZ)
	late := exec.Command("sleep", "60")
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { late.Process.Kill(); late.Wait() }()
	id, err := PidIdentity(late.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Alive(id) || ps.Dead(id) {
		t.Fatalf("a process started after the scan (start %d, scan from %d): alive %v dead %v; want neither",
			id.StartTime, ps.startedBefore, ps.Alive(id), ps.Dead(id))
	}
	gone := ProcIdentity{NSPid: 999999, PidNSIno: id.PidNSIno, StartTime: ps.startedBefore - 1}
	if !ps.Dead(gone) {
		t.Fatal("a process that started before the scan and is missing from it is not judged dead")
	}
}

// /proc/uptime's seconds become ticks exactly: through a float, 80000.01 s gave one tick less (as did 6 % of values),
// so a process that started in the tick before a scan could not be judged dead by it.
func TestUptimeTicksAreExact(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"80000.01", 8000001, true}, {"81166.47", 8116647, true}, {"12.5", 1250, true}, {"7", 700, true},
		{"3.999999999999", 399, true}, {"0.00", 0, false}, {"", 0, false}, {"-1.00", 0, false}, {"1.2x", 0, false},
		{"99999999999999999999.00", 0, false},
	} {
		got, ok := parseUptimeTicks(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("parseUptimeTicks(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	// every value with two decimals over a long uptime range, as /proc/uptime writes them
	for sec := uint64(0); sec < 3_000_000; sec += 997 {
		for cs := uint64(0); cs < 100; cs++ {
			if got, _ := parseUptimeTicks(fmt.Sprintf("%d.%02d", sec, cs)); got != sec*100+cs {
				t.Fatalf("%d.%02d s = %d ticks, want %d", sec, cs, got, sec*100+cs)
			}
		}
	}
}

func BenchmarkScanProcesses(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := ScanProcesses(); err != nil {
			b.Fatal(err)
		}
	}
}

// A process that starts while the scan lists /proc may be missing from the listing; it must not be judged dead
// when the walk takes ticks (a loaded host): the scan's time is taken before the listing, not after.
func TestScanNeverJudgesAProcessStartedDuringTheWalk(t *testing.T) {
	var late *exec.Cmd
	defer func() {
		readProcDir = os.ReadDir
		if late != nil {
			late.Process.Kill()
			late.Wait()
		}
	}()
	readProcDir = func(name string) ([]os.DirEntry, error) {
		ents, err := os.ReadDir(name) // the listing is taken: a process started now is not in it
		late = exec.Command("sleep", "60")
		if serr := late.Start(); serr != nil {
			t.Fatal(serr)
		}
		time.Sleep(3 * time.Second / userHZ) // the rest of the walk takes a few ticks
		return ents, err
	}
	ps, err := ScanProcesses()
	if err != nil {
		t.Fatal(err)
	}
	id, err := PidIdentity(late.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Alive(id) {
		t.Fatal("the test's late process is in the listing taken before it started")
	}
	if ps.Dead(id) {
		t.Fatalf("a process started during the walk (start tick %d, scan from %d) is judged dead", id.StartTime,
			ps.startedBefore)
	}
}

// MonotonicNs is the clock libdetshare reads (CLOCK_MONOTONIC): read between two clock_gettime calls, it lies
// between them.
func TestMonotonicNsIsClockMonotonic(t *testing.T) {
	for i := 0; i < 1000; i++ {
		var a, b unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &a)
		m := MonotonicNs()
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &b)
		lo, hi := uint64(a.Sec)*1e9+uint64(a.Nsec), uint64(b.Sec)*1e9+uint64(b.Nsec)
		if m < lo || m > hi {
			t.Fatalf("MonotonicNs %d outside CLOCK_MONOTONIC [%d, %d]", m, lo, hi)
		}
	}
}

// ScanProcesses identifies a process of its own PID namespace without reading its status file; the identity must
// be the one the process records for itself (which reads it).
func TestScanIdentifiesOwnNamespaceProcesses(t *testing.T) {
	ps, err := ScanProcesses()
	if err != nil {
		t.Fatal(err)
	}
	id, err := SelfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if !ps.Alive(id) || ps.HostDead(os.Getpid(), id.StartTime) {
		t.Fatalf("scan does not see this process as %+v", id)
	}
	if !ps.HostDead(os.Getpid(), id.StartTime+1) {
		t.Fatal("a different start time for this PID was not taken for a dead owner")
	}
}

// The reaper keeps each client page mapped from one pass to the next: once mapped, a pass reads no registration and
// maps nothing, so what it allocates does not grow with the tenants (it used to open, map and unmap every page and
// list every registration four times a second).
func TestReaperPassDoesNotGrowWithTenants(t *testing.T) {
	self, err := SelfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := ScanProcesses()
	if err != nil {
		t.Fatal(err)
	}
	allocs := func(n int) float64 {
		tb := newTable(t)
		for i := 0; i < n; i++ {
			cl, _ := newClient(t, tb, fmt.Sprint("t", i))
			if _, err := cl.AttachProcess(self); err != nil {
				t.Fatal(err)
			}
		}
		r := tb.NewReaper()
		defer r.Close()
		if _, err := r.Pass(ps); err != nil { // maps the pages
			t.Fatal(err)
		}
		if len(r.pages) != n {
			t.Fatalf("reaper keeps %d pages mapped, want %d", len(r.pages), n)
		}
		return testing.AllocsPerRun(20, func() {
			rep, err := r.Pass(ps)
			if err != nil || rep.Processes != 0 {
				t.Fatalf("pass: %+v %v", rep, err)
			}
		})
	}
	if a2, a64 := allocs(2), allocs(64); a64 > a2 {
		t.Fatalf("a reaper pass allocates %.0f times with 64 tenants, %.0f with 2: it reads or maps per tenant", a64, a2)
	}
}
