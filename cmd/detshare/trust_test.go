package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// TestRunPrivilegeDropKeepsDetShare is issue 13 item 7 (setpriv) for host tenants: the command of `detshare run`
// drops to nobody with a statically linked tool (busybox su, like gosu or su-exec: libdetshare is not loaded
// into it) before it execs the CUDA program. The program must keep the tenant's quota: before the fix it could
// not open the client page and ran without DetShare (its 1.5 GiB allocation in a 1 GiB tenant succeeded).
func TestRunPrivilegeDropKeepsDetShare(t *testing.T) {
	bd := buildDir()
	lib := filepath.Join(bd, "lib", "libdetshare.so")
	probe := filepath.Join(bd, "tests", "ds_probe_rt")
	sim := filepath.Join(bd, "lib", "simgpu")
	for _, f := range []string{lib, probe, filepath.Join(sim, "libcuda.so.1"), "/bin/busybox"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s missing: run `make build` first (busybox: apt-get install busybox-static)", f)
		}
	}
	e := newRunEnv(t)
	e.lib = lib
	// As on a host, the run directory's public files (table, quota file) are reachable by every user; the test's
	// temporary directories are 0700, and the simulated GPU's state file must be writable by nobody.
	for d := e.dir; strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	cmd := e.detshare("run", "--memory", "1Gi", "--name", "dropper", "--", "/bin/busybox", "su", "-p", "-s", "/bin/sh",
		"nobody", "-c", probe+" init alloc:536870912 alloc:1073741824")
	cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+sim, "DETSHARE_SIMGPU_STATE="+filepath.Join(e.dir, "simgpu.state"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("detshare run: %v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "alloc:536870912 rc=0") {
		t.Errorf("allocation within the limit failed as nobody:\n%s", s)
	}
	if !strings.Contains(s, "alloc:1073741824 rc=2") {
		t.Errorf("as nobody, 1.5 GiB in a 1 GiB tenant was not refused (DetShare lost after the privilege drop):\n%s", s)
	}
	if strings.Contains(s, "running unshared") {
		t.Errorf("the library ran unshared:\n%s", s)
	}
}

// TestDroppedTenantHoldsNoReopenablePageBeforeItsConstructor is issue 27's exec→constructor window: `detshare run`'s
// command drops to nobody (setpriv) and execs a program. Until that program's libdetshare constructor makes it
// non-dumpable, any process of nobody may open /proc/<pid>/fd/<n>; the window is held open here by exec'ing a
// statically linked program (busybox sleep), which never runs the constructor. Before the fix the program had
// inherited the client page itself (descriptor 3, no close-on-exec) and another process of nobody reopened it
// read-write; now what crosses exec is a socket carrying the page, which /proc cannot reopen (ENXIO), and the page
// is taken off it only after PR_SET_DUMPABLE 0.
func TestDroppedTenantHoldsNoReopenablePageBeforeItsConstructor(t *testing.T) {
	bd := buildDir()
	lib := filepath.Join(bd, "lib", "libdetshare.so")
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	for _, f := range []string{lib, "/bin/busybox"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s missing: run `make build` first (busybox: apt-get install busybox-static)", f)
		}
	}
	busybox, err := filepath.EvalSymlinks("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	e := newRunEnv(t)
	e.lib = lib
	cmd := e.detshare("run", "--memory", "1Gi", "--name", "window", "--", setpriv, "--reuid=65534", "--regid=65534",
		"--clear-groups", "--", "/bin/busybox", "sleep", "30")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	// The dropped program: detshare run's child, once it runs as nobody and is busybox.
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for pid == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the dropped program did not start:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
		procs, _ := os.ReadDir("/proc")
		for _, en := range procs {
			k := en.Name()
			stat, _ := os.ReadFile("/proc/" + k + "/stat")
			if i := strings.LastIndexByte(string(stat), ')'); i < 0 ||
				len(strings.Fields(string(stat[i+1:]))) < 2 ||
				strings.Fields(string(stat[i+1:]))[1] != strconv.Itoa(cmd.Process.Pid) {
				continue // not detshare run's child (any thread of it may have started it)
			}
			exe, _ := os.Readlink("/proc/" + k + "/exe")
			st, err := os.Stat("/proc/" + k)
			if err == nil && exe == busybox && st.Sys().(*syscall.Stat_t).Uid == 65534 {
				pid, _ = strconv.Atoi(k)
			}
		}
	}
	page := table.NewPaths(e.runDir).ClientPage("window")
	pst, err := os.Stat(page)
	if err != nil {
		t.Fatalf("tenant not registered: %v", err)
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) <= 3 {
		t.Fatalf("the dropped program inherited %d descriptors, want the three standard streams and what carries "+
			"its page", len(ents))
	}
	// As nobody, try every descriptor of the program: none may give the page read-write.
	script := ""
	for _, en := range ents {
		// A failed redirection of exec ends a shell: each try runs in a subshell of its own.
		script += fmt.Sprintf("(exec 9<>%s/%s && echo REOPENED %s $(stat -L -c %%d:%%i /proc/self/fd/9));",
			fdDir, en.Name(), en.Name())
	}
	out, _ := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/busybox", "sh",
		"-c", script).CombinedOutput()
	t.Logf("as nobody:\n%s", out)
	want := fmt.Sprintf("%d:%d", pst.Sys().(*syscall.Stat_t).Dev, pst.Sys().(*syscall.Stat_t).Ino)
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "REOPENED") && strings.HasSuffix(l, " "+want) {
			t.Fatalf("another process of nobody reopened the tenant's client page read-write before the library's "+
				"constructor ran: %s", l)
		}
	}
}
