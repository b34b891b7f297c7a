package doctor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A real process whose binary was replaced (as dpkg does on upgrade) is flagged; one that runs the installed file
// is not.
func TestInspectSchedulerExeFlagsADeletedBinary(t *testing.T) {
	d := t.TempDir()
	bin := filepath.Join(d, "detshare")
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()

	s, err := InspectSchedulerExe("/proc", cmd.Process.Pid, bin)
	if err != nil || s.Stale {
		t.Fatalf("running the installed file: %+v, %v", s, err)
	}
	// The upgrade: a new file renamed over the old one.
	if err := os.WriteFile(bin+".new", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	s, err = InspectSchedulerExe("/proc", cmd.Process.Pid, bin)
	if err != nil || !s.Stale || !strings.HasSuffix(s.Exe, "(deleted)") || !strings.Contains(s.Why, bin) {
		t.Fatalf("after the binary was replaced: %+v, %v", s, err)
	}
}

// doctor's check on a fake /proc: a deleted exe and another file at the installed path are flagged, the installed
// file is not, and no scheduler means no check.
func TestDoctorFlagsASchedulerRunningAnOldBinary(t *testing.T) {
	proc, binDir := t.TempDir(), t.TempDir()
	installed := filepath.Join(binDir, "detshare")
	os.WriteFile(installed, []byte("new"), 0o755)
	other := filepath.Join(t.TempDir(), "detshare")
	os.WriteFile(other, []byte("old"), 0o755)
	link := func(pid int, target string) {
		os.MkdirAll(filepath.Join(proc, strconv.Itoa(pid)), 0o755)
		if err := os.Symlink(target, filepath.Join(proc, strconv.Itoa(pid), "exe")); err != nil {
			t.Fatal(err)
		}
	}
	link(10, installed+" (deleted)")
	link(11, installed)
	for _, c := range []struct {
		pid    int
		status Status
		want   string
	}{
		{10, Warn, "scheduler runs an old binary"},
		{11, OK, "runs " + installed},
	} {
		env := Env{RunDir: "/nonexistent", BinDir: binDir, ProcRoot: proc, SchedulerPID: func(string) int { return c.pid }}
		chk, ok := checkSchedulerExe(env)
		if !ok || chk.Status != c.status || !strings.Contains(chk.Found, c.want) {
			t.Errorf("pid %d: %+v, want %s %q", c.pid, chk, c.status, c.want)
		}
		if c.status == Warn && !strings.Contains(chk.Fix, "detshare sched-restart") {
			t.Errorf("pid %d: fix %q does not say how", c.pid, chk.Fix)
		}
	}
	// The same path, another file: the process runs what was there before (exe resolves to it, not to installed).
	s, err := InspectSchedulerExe(proc, 11, installed)
	if err != nil || s.Stale {
		t.Errorf("same file: %+v %v", s, err)
	}
	os.Remove(filepath.Join(proc, "11", "exe"))
	link(11, other)
	if s, _ := InspectSchedulerExe(proc, 11, other); s.Stale {
		t.Errorf("a scheduler running its own path's file flagged: %+v", s)
	}
	if _, ok := checkSchedulerExe(Env{ProcRoot: proc, SchedulerPID: func(string) int { return 0 }}); ok {
		t.Error("a check without a running scheduler")
	}
}
