package testenv

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Daemon is a started engine (containerd, dockerd, kubelet, ...) in its own process group.
type Daemon struct {
	Cmd  *exec.Cmd
	done chan struct{}
}

// StartDaemon starts cmd in its own process group and reaps it when it exits.
func StartDaemon(cmd *exec.Cmd) (*Daemon, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &Daemon{Cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(d.done) }()
	return d, nil
}

// Exited reports whether the daemon has exited.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// StopDaemon sends SIGTERM, then SIGKILL after 15 s; nil is a no-op.
func StopDaemon(d *Daemon) {
	if d == nil {
		return
	}
	d.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		d.Cmd.Process.Kill()
		<-d.done
	}
}

// UnmountUnder detaches every mount below dir (overlay rootfs, shm of stopped daemons), deepest first.
func UnmountUnder(dir string) {
	for _, m := range MountsUnder(dir) {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// MountsUnder lists mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
