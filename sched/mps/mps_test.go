package mps

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// fakeControl is a stand-in for nvidia-cuda-mps-control (a test double): `-d` starts a background "daemon" that
// writes its pid file; commands on stdin are logged and answered from files the test writes.
const fakeControl = `#!/bin/sh
if [ "$1" = "-d" ]; then
  [ -n "$FAKE_MPS_FAIL" ] && { echo "fake MPS: cannot start" >&2; exit 3; }
  ( exec sleep 300 ) > /dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  echo "$CUDA_VISIBLE_DEVICES" > "$CUDA_MPS_LOG_DIRECTORY/visible"
  exit 0
fi
read -r line
echo "$line" >> "$CUDA_MPS_LOG_DIRECTORY/commands"
set -- $line
case "$1" in
  get_server_list) cat "$CUDA_MPS_LOG_DIRECTORY/servers" 2>/dev/null ;;
  get_client_list) cat "$CUDA_MPS_LOG_DIRECTORY/clients.$2" 2>/dev/null ;;
  get_server_status) cat "$CUDA_MPS_LOG_DIRECTORY/status.$2" 2>/dev/null ;;
  quit) kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")" ;;
esac
exit 0
`

func setup(t *testing.T) (*Manager, string) {
	t.Helper()
	dir := t.TempDir()
	exe := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(exe, []byte(fakeControl), 0o755); err != nil {
		t.Fatal(err)
	}
	m := &Manager{Paths: table.NewPaths(filepath.Join(dir, "run")), Control: exe, CommandTimeout: 3 * time.Second}
	return m, dir
}

func TestStartAdoptCommandsStop(t *testing.T) {
	m, _ := setup(t)
	d, err := m.Start(0, "GPU-abc")
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(d.PID, syscall.SIGKILL)
	if d.PID == 0 || !m.Alive(d) || d.Adopted {
		t.Fatalf("daemon %+v", d)
	}
	if d.PipeDir != m.Paths.MPSPipeDir(0) || d.LogDir != m.Paths.MPSLogDir(0) {
		t.Fatalf("directories %+v", d)
	}
	if b, _ := os.ReadFile(filepath.Join(d.LogDir, "visible")); strings.TrimSpace(string(b)) != "GPU-abc" {
		t.Fatalf("daemon must see only its GPU, got CUDA_VISIBLE_DEVICES=%q", b)
	}
	// A second Start (a new scheduler leader) adopts the running daemon.
	d2, err := m.Start(0, "GPU-abc")
	if err != nil || !d2.Adopted || d2.PID != d.PID {
		t.Fatalf("adopt: %+v %v", d2, err)
	}
	// terminate_client finds the server of the client.
	os.WriteFile(filepath.Join(d.LogDir, "servers"), []byte("4242\n"), 0o644)
	os.WriteFile(filepath.Join(d.LogDir, "clients.4242"), []byte("100\n200\n"), 0o644)
	if err := m.TerminateClient(d, 200); err != nil {
		t.Fatal(err)
	}
	// A faulted server with no clients is shut down; one with clients is left alone.
	os.WriteFile(filepath.Join(d.LogDir, "servers"), []byte("4242\n5353\n"), 0o644)
	os.WriteFile(filepath.Join(d.LogDir, "status.4242"), []byte("4242 FAULT\n"), 0o644)
	os.WriteFile(filepath.Join(d.LogDir, "status.5353"), []byte("5353 FAULT\n"), 0o644)
	n, err := m.RestartIdleFailedServers(d)
	if err != nil || n != 1 {
		t.Fatalf("restart: %d %v", n, err)
	}
	cmds, _ := os.ReadFile(filepath.Join(d.LogDir, "commands"))
	for _, want := range []string{"terminate_client 4242 200", "shutdown_server 5353 -f"} {
		if !strings.Contains(string(cmds), want+"\n") {
			t.Errorf("command %q not sent; got:\n%s", want, cmds)
		}
	}
	if strings.Contains(string(cmds), "shutdown_server 4242") {
		t.Error("a faulted server with clients must not be shut down")
	}
	if err := m.Stop(d); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for m.Alive(d) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if m.Alive(d) {
		t.Fatal("daemon still alive after quit")
	}
	// Dead daemon: the next Start starts a new one instead of adopting the stale pid file.
	d3, err := m.Start(0, "GPU-abc")
	if err != nil || d3.Adopted || d3.PID == d.PID {
		t.Fatalf("restart after death: %+v %v", d3, err)
	}
	syscall.Kill(d3.PID, syscall.SIGKILL)
}

func TestAbsent(t *testing.T) {
	m, dir := setup(t)
	m.Control = filepath.Join(dir, "missing-control")
	_, err := m.Start(0, "GPU-x")
	if !errors.Is(err, ErrAbsent) || !strings.Contains(err.Error(), "missing-control") {
		t.Fatalf("want ErrAbsent naming the executable, got %v", err)
	}
}

func TestStartFailure(t *testing.T) {
	m, _ := setup(t)
	t.Setenv("FAKE_MPS_FAIL", "1")
	_, err := m.Start(1, "GPU-y")
	if err == nil || errors.Is(err, ErrAbsent) || !strings.Contains(err.Error(), "cannot start") {
		t.Fatalf("want the daemon's own message, got %v", err)
	}
}

func TestSimulated(t *testing.T) {
	m := &Manager{Paths: table.NewPaths(t.TempDir()), Simulated: true}
	d, err := m.Start(0, "SIM-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.PipeDir, SimControlFile)); err != nil {
		t.Fatalf("simulated GPU convention: %v", err)
	}
	if !m.Alive(d) {
		t.Fatal("not alive")
	}
	if err := m.Stop(d); err != nil || m.Alive(d) {
		t.Fatalf("stop: %v", err)
	}
}

func TestPids(t *testing.T) {
	if got := pids("12\n 34 \nfoo\n-1\n"); len(got) != 2 || got[0] != 12 || got[1] != 34 {
		t.Fatal(got)
	}
	if alive(0x7ffffff0) {
		t.Fatal("nonexistent pid alive")
	}
	if !alive(os.Getpid()) || strconv.Itoa(readPid("/nonexistent")) != "0" {
		t.Fatal("self")
	}
}
