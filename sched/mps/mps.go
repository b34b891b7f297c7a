// Package mps manages one NVIDIA MPS control daemon per GPU for the scheduler, with DetShare's own pipe and log
// directories (<run dir>/mps/gpu<N>/{pipe,log}), so it never meets an MPS daemon someone else runs. It never changes
// compute mode, clocks or any other card setting. When the control executable is missing, Start reports MPS as
// absent and the scheduler falls back to temporal quanta.
//
// A daemon outlives the scheduler on purpose: tenants keep running when the scheduler dies (fail-static), and the
// next leader adopts the daemon through the pid file the daemon writes in its pipe directory.
//
// The simulated GPU (a test double) has its own MPS convention (docs/internals.md): simulated MPS is on for a client
// whose CUDA_MPS_PIPE_DIRECTORY contains a file named "control". In Simulated mode the manager is that simulated
// daemon: it creates and removes that file and runs no executable.
package mps

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
)

// PidFile is the file the control daemon writes in its pipe directory.
const PidFile = "nvidia-cuda-mps-control.pid"

// SimControlFile marks a simulated MPS pipe directory (the simulated GPU's convention).
const SimControlFile = "control"

// ErrAbsent is returned by Start when MPS cannot be used on this host (no control executable).
var ErrAbsent = errors.New("MPS is not available")

// Manager runs the control daemons of one run directory.
type Manager struct {
	Paths     table.Paths
	Control   string // executable name or path (config mps.control)
	Simulated bool   // act as the simulated GPU's MPS daemon (a test double)
	// CommandTimeout bounds one control command; a hung daemon must not hang the scheduler.
	CommandTimeout time.Duration
}

// Daemon is one GPU's control daemon.
type Daemon struct {
	GPU     int
	UUID    string
	PipeDir string
	LogDir  string
	PID     int // 0 in simulated mode
	Adopted bool
}

func (m *Manager) timeout() time.Duration {
	if m.CommandTimeout > 0 {
		return m.CommandTimeout
	}
	return 5 * time.Second
}

func (m *Manager) dirs(gpu int) (string, string, error) {
	pipe, logd := m.Paths.MPSPipeDir(gpu), m.Paths.MPSLogDir(gpu)
	for _, d := range []string{pipe, logd} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", fmt.Errorf("MPS directory for GPU %d: %w", gpu, err)
		}
	}
	return pipe, logd, nil
}

// Start makes sure GPU gpu (uuid) has a running control daemon: it adopts a live one found through the pid file,
// else starts one. It returns an error wrapping ErrAbsent when MPS cannot be used at all.
func (m *Manager) Start(gpu int, uuid string) (*Daemon, error) {
	pipe, logd, err := m.dirs(gpu)
	if err != nil {
		return nil, err
	}
	d := &Daemon{GPU: gpu, UUID: uuid, PipeDir: pipe, LogDir: logd}
	if m.Simulated {
		f := filepath.Join(pipe, SimControlFile)
		if err := os.WriteFile(f, []byte("simulated MPS control daemon (test double) managed by detshare sched\n"), 0o644); err != nil {
			return nil, fmt.Errorf("simulated MPS for GPU %d: %w", gpu, err)
		}
		return d, nil
	}
	exe, err := exec.LookPath(m.Control)
	if err != nil {
		return nil, fmt.Errorf("%w: control executable %q: %v", ErrAbsent, m.Control, err)
	}
	if pid := readPid(pipe); pid > 0 && alive(pid) {
		d.PID, d.Adopted = pid, true
		return d, nil
	}
	cmd := exec.Command(exe, "-d")
	cmd.Env = m.env(d)
	// A file, not a pipe: the forked daemon inherits it, and a pipe would keep Wait waiting for its EOF.
	startLog := filepath.Join(logd, "detshare-start.log")
	lf, err := os.OpenFile(startLog, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start MPS control daemon for GPU %d: %w", gpu, err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	err = runTimeout(cmd, m.timeout())
	lf.Close()
	if err != nil {
		out, _ := os.ReadFile(startLog)
		return nil, fmt.Errorf("start MPS control daemon for GPU %d (%s): %w: %s", gpu, exe, err, strings.TrimSpace(string(out)))
	}
	// -d forks the daemon, which writes its pid file shortly after.
	deadline := time.Now().Add(m.timeout())
	for time.Now().Before(deadline) {
		if pid := readPid(pipe); pid > 0 && alive(pid) {
			d.PID = pid
			return d, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Errorf("MPS control daemon for GPU %d did not write %s in %s", gpu, filepath.Join(pipe, PidFile), m.timeout())
}

// Alive tells whether d still runs.
func (m *Manager) Alive(d *Daemon) bool {
	if m.Simulated {
		_, err := os.Stat(filepath.Join(d.PipeDir, SimControlFile))
		return err == nil
	}
	return d.PID > 0 && alive(d.PID)
}

// Stop shuts d down ("quit"). The scheduler calls it only when asked to; a scheduler exit leaves daemons running.
func (m *Manager) Stop(d *Daemon) error {
	if m.Simulated {
		err := os.Remove(filepath.Join(d.PipeDir, SimControlFile))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	_, err := m.Command(d, "quit")
	return err
}

func (m *Manager) env(d *Daemon) []string {
	env := append([]string{}, os.Environ()...)
	return append(env, "CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir, "CUDA_MPS_LOG_DIRECTORY="+d.LogDir,
		"CUDA_VISIBLE_DEVICES="+d.UUID)
}

// Command sends one control command and returns its output.
func (m *Manager) Command(d *Daemon, line string) (string, error) {
	if m.Simulated {
		logrus.WithFields(logrus.Fields{"gpu": d.GPU, "command": line}).Debug("simulated MPS (test double): command ignored")
		return "", nil
	}
	exe, err := exec.LookPath(m.Control)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrAbsent, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = m.env(d)
	cmd.Stdin = strings.NewReader(line + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := runTimeout(cmd, m.timeout()); err != nil {
		return out.String(), fmt.Errorf("MPS command %q on GPU %d: %w: %s", line, d.GPU, err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// SimMemLimitFile holds, in a simulated MPS pipe directory, the server-side per-client device-memory limit in bytes
// (the simulated GPU enforces it per process, as the MPS server does).
const SimMemLimitFile = "pinned_mem_limit"

// SetClientMemLimit sets, server-side, the device memory each future client of d may hold: for servers not yet
// started (set_default_device_pinned_mem_limit) and for running ones (set_device_pinned_mem_limit). Unlike
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in a client's environment, a client cannot raise it. bytes 0 removes the limit
// (the simulated daemon) or sets it to total (a real one: MPS has no command to clear it). Clients already
// connected keep the limit they started with.
func (m *Manager) SetClientMemLimit(d *Daemon, bytes, total uint64) error {
	if m.Simulated {
		f := filepath.Join(d.PipeDir, SimMemLimitFile)
		if bytes == 0 {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("simulated MPS memory limit for GPU %d: %w", d.GPU, err)
			}
			return nil
		}
		if err := os.WriteFile(f, []byte(strconv.FormatUint(bytes, 10)+"\n"), 0o644); err != nil {
			return fmt.Errorf("simulated MPS memory limit for GPU %d: %w", d.GPU, err)
		}
		return nil
	}
	if bytes == 0 {
		bytes = total
	}
	if bytes == 0 {
		return nil
	}
	v := strconv.FormatUint((bytes+(1<<20)-1)>>20, 10) + "M"
	// the daemon sees its GPU only (CUDA_VISIBLE_DEVICES=<uuid>): device 0
	if _, err := m.Command(d, "set_default_device_pinned_mem_limit 0 "+v); err != nil {
		return err
	}
	servers, err := m.Servers(d)
	if err != nil {
		return err
	}
	for _, srv := range servers {
		if _, err := m.Command(d, fmt.Sprintf("set_device_pinned_mem_limit %d 0 %s", srv, v)); err != nil {
			return err
		}
	}
	return nil
}

// Servers lists the MPS server PIDs of d.
func (m *Manager) Servers(d *Daemon) ([]int, error) {
	out, err := m.Command(d, "get_server_list")
	if err != nil {
		return nil, err
	}
	return pids(out), nil
}

// Clients lists the client PIDs (host PIDs) of server.
func (m *Manager) Clients(d *Daemon, server int) ([]int, error) {
	out, err := m.Command(d, "get_client_list "+strconv.Itoa(server))
	if err != nil {
		return nil, err
	}
	return pids(out), nil
}

// TerminateClient asks the server serving client (a host PID) to terminate it safely, so that a dead container's
// leftover processes cannot wedge the server for everyone else.
func (m *Manager) TerminateClient(d *Daemon, client int) error {
	servers, err := m.Servers(d)
	if err != nil {
		return err
	}
	for _, s := range servers {
		cl, err := m.Clients(d, s)
		if err != nil {
			continue
		}
		for _, c := range cl {
			if c == client {
				_, err := m.Command(d, fmt.Sprintf("terminate_client %d %d", s, client))
				return err
			}
		}
	}
	return nil
}

// RestartIdleFailedServers shuts down servers that report a fault once they have no clients left, so that the next
// client gets a fresh server. Servers with clients are left alone: they recover when their clients exit.
func (m *Manager) RestartIdleFailedServers(d *Daemon) (int, error) {
	servers, err := m.Servers(d)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range servers {
		st, err := m.Command(d, "get_server_status "+strconv.Itoa(s))
		if err != nil || !strings.Contains(strings.ToUpper(st), "FAULT") {
			continue
		}
		cl, err := m.Clients(d, s)
		if err != nil || len(cl) > 0 {
			continue
		}
		if _, err := m.Command(d, fmt.Sprintf("shutdown_server %d -f", s)); err != nil {
			return n, err
		}
		logrus.WithFields(logrus.Fields{"gpu": d.GPU, "server": s}).Warn("MPS server in fault with no clients shut down; the next client starts a fresh one")
		n++
	}
	return n, nil
}

func pids(out string) []int {
	var r []int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if p, err := strconv.Atoi(f); err == nil && p > 0 {
				r = append(r, p)
			}
		}
	}
	return r
}

func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, PidFile))
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return p
}

func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Zombies run nothing.
	if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
		return false
	}
	return true
}

func runTimeout(cmd *exec.Cmd, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("timed out after %s", d)
	}
}
