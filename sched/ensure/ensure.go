// Package ensure starts the host scheduler on demand: the shim, the runc wrapper and `detshare run` register tenants
// through a cgroupgpu/tenant.Registrar whose EnsureScheduler their main sets to this package's, so a host needs no
// extra service. It is kept free of NVML (go-nvml) so that the wrapper and the shim stay small and start on hosts
// without a driver.
package ensure

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
)

// BinEnv names the detshare executable to start (tests, unusual installs).
const BinEnv = "DETSHARE_BIN"

// LogFile is the scheduler's log when it was started on demand (in the run directory).
const LogFile = "sched.log"

// StartWait bounds how long EnsureScheduler waits for the new scheduler to take the lock.
var StartWait = 2 * time.Second

// LeaderRunning tells whether some process holds runDir's scheduler lock (sched.lock).
func LeaderRunning(runDir string) bool {
	f, err := os.OpenFile(table.NewPaths(runDir).SchedLock(), os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// Binary finds the detshare executable: $DETSHARE_BIN, this executable if it is detshare, a detshare next to it,
// else detshare in PATH.
func Binary() (string, error) {
	if b := os.Getenv(BinEnv); b != "" {
		return b, nil
	}
	self, err := os.Executable()
	if err == nil {
		if filepath.Base(self) == "detshare" {
			return self, nil
		}
		sib := filepath.Join(filepath.Dir(self), "detshare")
		if st, err := os.Stat(sib); err == nil && st.Mode()&0o111 != 0 {
			return sib, nil
		}
	}
	p, err := exec.LookPath("detshare")
	if err != nil {
		return "", fmt.Errorf("cannot find the detshare executable to start the scheduler (set %s): %w", BinEnv, err)
	}
	return p, nil
}

// SchedulerEnv is the environment of a scheduler started on demand: the caller's (a hook, a shim, `detshare run`)
// minus what belongs to a tenant rather than to the host: the interposer, the tenant's quota file, its GPU and MPS
// settings. The scheduler must never run under libdetshare or see only one tenant's GPU.
func SchedulerEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "LD_PRELOAD", k == "DETSHARE_QUOTA_FILE", k == "CUDA_VISIBLE_DEVICES", k == "NVIDIA_VISIBLE_DEVICES",
			strings.HasPrefix(k, "CUDA_MPS_"):
			continue
		}
		out = append(out, kv)
	}
	return out
}

// EnsureScheduler starts `detshare sched` for runDir, detached in its own session, when no leader holds the lock,
// and waits briefly for it to lead. Two callers racing start two schedulers; the flock lets one lead and the other
// exits at once.
func EnsureScheduler(runDir string) error {
	if LeaderRunning(runDir) {
		return nil
	}
	bin, err := Binary()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(runDir, table.RunDirMode); err != nil {
		return fmt.Errorf("start scheduler: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(runDir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start scheduler: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--run-dir", runDir, "sched")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = SchedulerEnv(os.Environ())
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start scheduler %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reap it if we outlive it
	deadline := time.Now().Add(StartWait)
	for time.Now().Before(deadline) {
		if LeaderRunning(runDir) {
			logrus.WithFields(logrus.Fields{"run_dir": runDir, "pid": cmd.Process.Pid}).Info("scheduler started")
			return nil
		}
		select {
		case err := <-exited:
			if LeaderRunning(runDir) { // lost the race to another starter: fine
				return nil
			}
			return fmt.Errorf("scheduler %s exited at start (%v); see %s", bin, err, filepath.Join(runDir, LogFile))
		case <-time.After(5 * time.Millisecond):
		}
	}
	return fmt.Errorf("scheduler %s did not take %s within %s; see %s", bin, table.NewPaths(runDir).SchedLock(),
		StartWait, filepath.Join(runDir, LogFile))
}
