package ensure

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// The end-to-end start-on-registration test is sched/daemon's TestEnsureSchedulerOnRegistration (its test binary
// can act as the scheduler); these check the pieces.

// The wiring into the binaries' registrars is checked in cmd/internal/wiring.

func TestMissingBinaryReported(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	t.Setenv(BinEnv, "/nonexistent/detshare")
	if err := EnsureScheduler(dir); err == nil {
		t.Fatal("a missing binary must be reported")
	}
}

func TestLeaderRunningFollowsTheLock(t *testing.T) {
	dir := t.TempDir()
	if LeaderRunning(dir) {
		t.Fatal("no lock file: no leader")
	}
	f, err := os.OpenFile(table.NewPaths(dir).SchedLock(), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if LeaderRunning(dir) {
		t.Fatal("unlocked file: no leader")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !LeaderRunning(dir) {
		t.Fatal("lock held: leader running")
	}
	// Running: EnsureScheduler starts nothing (a missing binary would otherwise be an error).
	t.Setenv(BinEnv, "/nonexistent/detshare")
	if err := EnsureScheduler(dir); err != nil {
		t.Fatal(err)
	}
}

func TestBinary(t *testing.T) {
	t.Setenv(BinEnv, "/opt/x/detshare")
	if b, err := Binary(); err != nil || b != "/opt/x/detshare" {
		t.Fatal(b, err)
	}
	t.Setenv(BinEnv, "")
	t.Setenv("PATH", t.TempDir())
	if _, err := Binary(); err == nil {
		t.Fatal("no detshare anywhere must be an error naming " + BinEnv)
	}
}

func TestSchedulerEnv(t *testing.T) {
	got := SchedulerEnv([]string{"PATH=/bin", "LD_PRELOAD=/usr/lib/detshare/libdetshare.so", "DETSHARE_QUOTA_FILE=/q",
		"CUDA_VISIBLE_DEVICES=1", "CUDA_MPS_PIPE_DIRECTORY=/p", "DETSHARE_SIMGPU=1", "DETSHARE_RUN_DIR=/r"})
	want := []string{"PATH=/bin", "DETSHARE_SIMGPU=1", "DETSHARE_RUN_DIR=/r"}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}
