package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
)

// SchedulerExe is what the running scheduler executes, compared with the installed detshare binary. After a package
// upgrade the old scheduler keeps running the replaced (deleted) file: it still serves its tenants, but with the old
// code, until it is restarted (`detshare sched-restart`, which the .deb's postinst runs).
type SchedulerExe struct {
	PID       int
	Exe       string // the link target of /proc/<pid>/exe, " (deleted)" included when the file is gone
	Installed string // the detshare binary it is compared with
	Stale     bool   // deleted, or the same path as Installed but another file
	Why       string // when Stale
}

// InspectSchedulerExe reads procRoot/<pid>/exe (procRoot is /proc; tests use a directory of fake entries).
func InspectSchedulerExe(procRoot string, pid int, installed string) (SchedulerExe, error) {
	s := SchedulerExe{PID: pid, Installed: installed}
	link := filepath.Join(procRoot, strconv.Itoa(pid), "exe")
	exe, err := os.Readlink(link)
	if err != nil {
		return s, fmt.Errorf("scheduler pid %d: %w", pid, err)
	}
	s.Exe = exe
	path, deleted := strings.CutSuffix(exe, " (deleted)")
	switch {
	case deleted:
		s.Stale, s.Why = true, fmt.Sprintf("its binary %s was replaced or removed (an upgrade?)", path)
	case installed != "" && path == installed:
		// The same path: the same file? os.Stat of the link follows it to the file the process runs.
		a, err1 := os.Stat(link)
		b, err2 := os.Stat(installed)
		if err1 == nil && err2 == nil && !os.SameFile(a, b) {
			s.Stale, s.Why = true, fmt.Sprintf("it runs another file than the installed %s", installed)
		}
	}
	return s, nil
}

// LeaderPID is the PID of the scheduler leading runDir (it holds sched.lock and is recorded in the table), 0 when
// none runs.
func LeaderPID(runDir string) int {
	if !ensure.LeaderRunning(runDir) {
		return 0
	}
	t, err := table.OpenReadOnly(runDir)
	if err != nil {
		return 0
	}
	defer t.Close()
	return t.Leader().PID
}

// checkSchedulerExe flags a scheduler that runs an old binary.
func checkSchedulerExe(env Env) (Check, bool) {
	if env.SchedulerPID == nil {
		return Check{}, false
	}
	pid := env.SchedulerPID(env.RunDir)
	if pid <= 0 {
		return Check{}, false
	}
	c := Check{Name: "scheduler binary", Need: "the scheduler runs the installed detshare"}
	s, err := InspectSchedulerExe(env.ProcRoot, pid, filepath.Join(env.BinDir, "detshare"))
	switch {
	case err != nil:
		c.Status, c.Found = Warn, err.Error()
	case s.Stale:
		c.Status = Warn
		c.Found = fmt.Sprintf("scheduler runs an old binary: pid %d, %s; %s", pid, s.Exe, s.Why)
		c.Fix = "detshare sched-restart (tenants keep their grants meanwhile; under systemd it restarts detshare-sched)"
	default:
		c.Status, c.Found = OK, fmt.Sprintf("pid %d runs %s", pid, s.Exe)
	}
	return c, true
}
