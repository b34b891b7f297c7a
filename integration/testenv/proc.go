package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// StopScheduler ends the `detshare sched` that registrations started on demand (sched/ensure) for runDir: found by
// its command line, ended by pid.
func StopScheduler(runDir string) {
	if runDir == "" {
		return
	}
	for _, pid := range ProcessesNaming(runDir) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmd), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "detshare" {
			continue
		}
		syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 50; i++ {
			if syscall.Kill(pid, 0) != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// ProcessesNaming lists processes (other than this one) whose command line contains s.
func ProcessesNaming(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == self {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte(s)) {
			out = append(out, pid)
		}
	}
	return out
}
