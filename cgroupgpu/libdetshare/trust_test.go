package libdetshare_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// TestTruncatedFilesKeepTheLastGrant is issue 13 item 1 on the tenant side: the table (host root), the client page
// and the doorbell (any tenant) are truncated to nothing while a tenant process runs. The process must not die of
// SIGBUS: it keeps running on its last grant, its memory limit still holds, and it says why.
func TestTruncatedFilesKeepTheLastGrant(t *testing.T) {
	e := newEnv(t, true).withTenant(1<<30, "")
	// The test plays a scheduler without a heartbeat: its own mapping of the table must not be touched once the
	// file is truncated (it would fault in the test process).
	if _, err := e.tbl.PublishSplit(0, h100Split()); err != nil {
		t.Fatal(err)
	}
	if err := e.tbl.SetMPS(0, table.MPSRunning, table.ModeSpatial, ""); err != nil {
		t.Fatal(err)
	}
	e.grant(table.ModeSpatial, 0b110)
	// The program installs its own SIGBUS handler (as Python's faulthandler does): the library's stays in front.
	p := e.start("ds_probe_rt", "init", "sigbus-handler", "smid:64", "pause", "smid:64", "alloc:536870912",
		"alloc:1073741824", "launch:3")
	before := p.until()
	if g := groupsOf(t, before, "smid"); !within(g, 0b110) {
		t.Fatalf("before: ran on groups %v, granted {1,2}", g)
	}
	for _, f := range []string{e.tbl.Paths().Table(), e.reg.ClientPagePath, e.tbl.Paths().Doorbell()} {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	p.resume()
	r := p.finish() // fails the test if the probe died
	if g := groupsOf(t, r, "smid"); !within(g, 0b110) || len(g) != 2 {
		t.Errorf("after truncation: ran on groups %v, want its last grant {1,2}", g)
	}
	if rc := r.get(t, "alloc:536870912", "rc"); rc != "0" {
		t.Errorf("allocation within the limit refused after truncation: rc %s", rc)
	}
	if rc := r.get(t, "alloc:1073741824", "rc"); rc != "2" { // CUDA_ERROR_OUT_OF_MEMORY: 1.5 GiB > 1 GiB limit
		t.Errorf("allocation over the limit after truncation: rc %s, want 2 (the limit must survive)", rc)
	}
	if r.get(t, "launch", "ok") != "1" {
		t.Errorf("launches after truncation: %v", r.lines)
	}
	out := strings.Join(p.lines, "\n")
	if strings.Contains(out, "app-sigbus") {
		t.Errorf("the program's handler got a fault of a DetShare mapping:\n%s", out)
	}
	for _, what := range []string{"table", "client page"} {
		if !strings.Contains(out, "the "+what+" was truncated under this process") {
			t.Errorf("no message about the truncated %s in:\n%s", what, out)
		}
	}
}

// TestOrphanDoesNotRunOnTheNewcomersGrant is issue 13 item 5 on the tenant side: a process keeps running after its
// tenant was deregistered, and the slot is reused by a newcomer whose grant is published in it. The orphan must not
// launch on the newcomer's SMs (before the fix it ran on them): its work is held, and it says why.
func TestOrphanDoesNotRunOnTheNewcomersGrant(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)
	p := e.start("ds_probe_rt", "init", "smid:64", "pause", "smid:64")
	if g := groupsOf(t, p.until(), "smid"); !within(g, 0b11) {
		t.Fatalf("before: ran on groups %v, granted {0,1}", g)
	}
	if err := e.tbl.Deregister(e.reg.ID); err != nil {
		t.Fatal(err)
	}
	nc, err := e.tbl.Register(table.RegisterRequest{ID: "newcomer", Tier: table.TierBestEffort, Weight: 1, GPU: 0})
	if err != nil {
		t.Fatal(err)
	}
	if nc.Slot != e.reg.Slot || nc.Gen == e.reg.Gen {
		t.Fatalf("newcomer did not reuse the slot: %+v (orphan's %d gen %d)", nc, e.reg.Slot, e.reg.Gen)
	}
	if err := e.tbl.PublishGrant(nc.Slot, table.Grant{Groups: 0b111100, SMs: 32, Mode: table.ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	p.resume()
	got := make(chan result, 1)
	go func() { got <- p.until() }()
	select {
	case r := <-got:
		t.Fatalf("the orphan launched after its slot was reused: %v", r.lines)
	case <-time.After(700 * time.Millisecond):
	}
	_ = p.cmd.Process.Kill()
	<-got
	if out := strings.Join(p.lines, "\n"); !strings.Contains(out, "belongs to no tenant any more") {
		t.Errorf("the orphan did not say why it is held:\n%s", out)
	}
}

// TestPrivilegeDropKeepsDetShare is issue 13 item 7 (setpriv): a root process that execs its program as nobody
// (setpriv, as a container entrypoint would) must keep DetShare. The client page is writable by root only, so
// before the fix the program ran unshared, without its memory limit.
func TestPrivilegeDropKeepsDetShare(t *testing.T) {
	e := newEnv(t, true).withTenant(1<<30, "")
	setpriv, nobody := asNobody(t, e)
	// nobody cannot open the page by its path (clients/ is root's): what a root process kept open must carry it.
	if st, err := os.Stat(filepath.Dir(e.reg.ClientPagePath)); err != nil || st.Mode().Perm() != table.ClientsDirMode {
		t.Fatalf("clients directory mode %v (%v), want %v", st.Mode(), err, table.ClientsDirMode)
	}
	cmd := exec.Command(setpriv, append(nobody, need(t, "tests/ds_probe_rt"), "init", "alloc:536870912",
		"alloc:1073741824")...)
	cmd.Env = e.vars
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe as nobody: %v\n%s", err, out)
	}
	r := parse(string(out))
	if rc := r.get(t, "alloc:536870912", "rc"); rc != "0" {
		t.Errorf("allocation within the limit as nobody: rc %s\n%s", rc, out)
	}
	if rc := r.get(t, "alloc:1073741824", "rc"); rc != "2" {
		t.Errorf("as nobody, 1.5 GiB in a 1 GiB tenant: rc %s, want 2 (DetShare lost after the privilege drop)\n%s", rc, out)
	}
	if strings.Contains(string(out), "running unshared") || strings.Contains(string(out), "refuses this process") {
		t.Errorf("the library did not find the page kept across the privilege drop:\n%s", out)
	}
	if n := e.client.Page().OOMRefusals; n != 1 {
		t.Errorf("refusals counted in the tenant's page: %d, want 1", n)
	}
}

// TestDoorbellRingsAgainAfterRepair: one tenant truncating the doorbell must not cost another tenant its wake-ups for
// good. The victim's ring faults on the truncated doorbell (it survives, see above); once the scheduler has repaired
// the doorbell, the victim's next demand transition maps it again and rings it.
func TestDoorbellRingsAgainAfterRepair(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	if _, err := e.tbl.PublishSplit(0, h100Split()); err != nil {
		t.Fatal(err)
	}
	if err := e.tbl.SetMPS(0, table.MPSRunning, table.ModeSpatial, ""); err != nil {
		t.Fatal(err)
	}
	e.grant(table.ModeSpatial, 0b11)
	p := e.start("ds_probe_rt", "init", "smid:64", "pause", "smid:64", "pause", "smid:64")
	p.until()
	time.Sleep(100 * time.Millisecond) // idle again (DETSHARE_IDLE_MS 20): the next kernel is a busy transition
	if err := os.Truncate(e.tbl.Paths().Doorbell(), 0); err != nil {
		t.Fatal(err)
	}
	p.resume()
	p.until() // rang into the truncated doorbell: faulted, survived, doorbell lost
	time.Sleep(100 * time.Millisecond)
	if ok, err := e.tbl.RepairDoorbell(); !ok || err != nil {
		t.Fatalf("repair: %v %v", ok, err)
	}
	seq := e.tbl.DoorbellSeq()
	time.Sleep(100 * time.Millisecond)
	p.resume()
	p.finish()
	if got := e.tbl.DoorbellSeq(); got == seq {
		t.Errorf("the doorbell was not rung after its repair (seq %d): the tenant lost its wake-ups for good\n%s", got,
			strings.Join(p.lines, "\n"))
	}
	if out := strings.Join(p.lines, "\n"); !strings.Contains(out, "the doorbell was truncated under this process") {
		t.Errorf("the truncation was not hit (the test must exercise it):\n%s", out)
	}
}

// TestProgramSIGBUSHandlerStillRuns: the library keeps its SIGBUS handler in front of the program's, but a SIGBUS
// that is not a fault of a DetShare mapping still reaches the program's own handler.
func TestProgramSIGBUSHandlerStillRuns(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	cmd := exec.Command(need(t, "tests/ds_probe_rt"), "init", "sigbus-handler", "raise-sigbus")
	cmd.Env = e.vars
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 || !strings.Contains(string(out), "app-sigbus") {
		t.Fatalf("the program's SIGBUS handler did not run (err %v):\n%s", err, out)
	}
}

// TestSameUserCannotReopenDroppedTenantsPage is issue 27's "a same-uid local user writes a privilege-dropped host
// tenant's page through /proc/<pid>/fd/3": a tenant process runs as nobody on the page descriptor a root process kept
// for it, and another process of nobody tries to reopen that descriptor read-write through /proc. Before the fix it
// could (and wrote "1 TiB used" so the victim could not allocate); now the victim is not dumpable, so /proc/<pid>/fd
// is root's.
func TestSameUserCannotReopenDroppedTenantsPage(t *testing.T) {
	e := newEnv(t, true).withTenant(1<<30, "")
	setpriv, nobody := asNobody(t, e)
	victim := e.startCmd(exec.Command(setpriv, append(nobody, need(t, "tests/ds_probe_rt"), "init", "alloc:1048576",
		"pause", "alloc:1048576")...))
	cmd := victim.cmd
	if r := victim.until(); r.get(t, "alloc:1048576", "rc") != "0" {
		t.Fatalf("victim as nobody did not run under DetShare: %v", r.lines)
	}
	// Which descriptor of the victim is its page (root can look).
	fdDir := fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	pageFD := ""
	for _, en := range ents {
		if l, err := os.Readlink(filepath.Join(fdDir, en.Name())); err == nil && l == e.reg.ClientPagePath {
			pageFD = en.Name()
		}
	}
	if pageFD == "" {
		t.Fatalf("the victim holds no descriptor of its page %s", e.reg.ClientPagePath)
	}
	attack := exec.Command(setpriv, append(nobody, "sh", "-c",
		fmt.Sprintf("exec 4<>%s/%s && echo REOPENED", fdDir, pageFD))...)
	got, _ := attack.CombinedOutput()
	if strings.Contains(string(got), "REOPENED") {
		t.Fatalf("another process of the same user reopened the victim's page read-write through %s/%s", fdDir, pageFD)
	}
	victim.resume()
	if r := victim.finish(); r.get(t, "alloc:1048576", "rc") != "0" {
		t.Errorf("victim after the attempt: %v", r.lines)
	}
}

// asNobody returns setpriv and the arguments that run a command as nobody, after making the test's run directory
// reachable by every user as it is in a container (the test's temporary directories are 0700; the simulated GPU's
// state file must be writable by nobody).
func asNobody(t *testing.T, e *env) (string, []string) {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	for d := filepath.Dir(e.runDir); strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return setpriv, []string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}
}
