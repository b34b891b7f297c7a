package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

// fakeMPSControl stands in for nvidia-cuda-mps-control (a test double), as in sched/mps's tests.
const fakeMPSControl = `#!/bin/sh
if [ "$1" = "-d" ]; then
  ( exec sleep 300 ) > /dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r line
echo "$line" >> "$CUDA_MPS_LOG_DIRECTORY/commands"
set -- $line
case "$1" in
  get_server_list) cat "$CUDA_MPS_LOG_DIRECTORY/servers" 2>/dev/null ;;
  get_client_list) cat "$CUDA_MPS_LOG_DIRECTORY/clients.$2" 2>/dev/null ;;
  get_server_status) echo "$2 ACTIVE" ;;
esac
exit 0
`

// TestMPSRealDaemonLifecycle: with a (fake) control executable the scheduler starts the daemon in its own
// directories, records spatial mode, terminates MPS clients that belong to no live tenant (never a tenant's own
// process) once only, even when the client stays listed (on the H100 a second terminate_client for a client whose
// launches libdetshare holds wedged the control daemon), and restarts the daemon when it dies.
func TestMPSRealDaemonLifecycle(t *testing.T) {
	dir, tb := newRunDir(t)
	exe := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	os.WriteFile(exe, []byte(fakeMPSControl), 0o755)
	a := register(t, tb, "a", table.TierBestEffort, table.RoleNone, 0, false, 0)
	pa := play(t, tb, a) // this test process is a live tenant process
	orphan := exec.Command("sleep", "300")
	orphan.Start()
	defer func() { orphan.Process.Kill(); orphan.Wait() }()
	paths := table.NewPaths(dir)
	os.MkdirAll(paths.MPSLogDir(0), 0o755)
	os.WriteFile(filepath.Join(paths.MPSLogDir(0), "servers"), []byte("777\n"), 0o644)
	os.WriteFile(filepath.Join(paths.MPSLogDir(0), "clients.777"), []byte(fmt.Sprintf("%d\n%d\n", os.Getpid(), orphan.Process.Pid)), 0o644)

	c := testConfig()
	c.MPS.Enable = true
	c.MPS.Control = exe
	m := &mps.Manager{Paths: paths, Control: exe, CommandTimeout: 2 * time.Second}
	ready := make(chan struct{})
	s, err := New(Options{RunDir: dir, Config: c, MPS: m, Ready: ready, MPSCheckEvery: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	// Stop the scheduler (and its MPS watcher) first, then kill whatever daemon it left: otherwise the watcher could
	// restart a daemon the cleanup just killed, and leak it.
	defer func() {
		cancel()
		<-done
		s.Close()
		if p := readPidFile(t, paths.MPSPipeDir(0)); p > 0 {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}()
	<-ready
	g := tb.GPUs()[0]
	if g.Mode != table.ModeSpatial || g.MPSState != table.MPSRunning || g.MPSPipeDir != paths.MPSPipeDir(0) {
		t.Fatalf("GPU after MPS start: %+v", g)
	}
	pid1 := readPidFile(t, paths.MPSPipeDir(0))
	defer syscall.Kill(pid1, syscall.SIGKILL)
	pa.busy(true)
	cmds := filepath.Join(paths.MPSLogDir(0), "commands")
	want := fmt.Sprintf("terminate_client 777 %d", orphan.Process.Pid)
	deadline := time.Now().Add(3 * time.Second)
	for {
		b, _ := os.ReadFile(cmds)
		if strings.Contains(string(b), want) {
			if strings.Contains(string(b), fmt.Sprintf("terminate_client 777 %d\n", os.Getpid())) {
				t.Fatal("a live tenant's own process was terminated")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan MPS client not terminated; commands:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The fake still lists the orphan: 20 more checks (30 ms apart) must not send it terminate_client again.
	time.Sleep(20 * 30 * time.Millisecond)
	if b, _ := os.ReadFile(cmds); strings.Count(string(b), want+"\n") != 1 {
		t.Fatalf("terminate_client sent %d times to a client that stays listed, want 1; commands:\n%s",
			strings.Count(string(b), want+"\n"), b)
	}
	// The control daemon dies: the scheduler starts a new one.
	syscall.Kill(pid1, syscall.SIGKILL)
	deadline = time.Now().Add(3 * time.Second)
	for {
		if p := readPidFile(t, paths.MPSPipeDir(0)); p != pid1 && p != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dead MPS control daemon not restarted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if tb.GPUs()[0].MPSState != table.MPSRunning {
		t.Fatalf("MPS state after restart %d", tb.GPUs()[0].MPSState)
	}
}

func readPidFile(t *testing.T, dir string) int {
	b, _ := os.ReadFile(filepath.Join(dir, mps.PidFile))
	var p int
	fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &p)
	return p
}

// TestStopMPSOnExit: with StopMPSOnExit a clean exit removes the (simulated) MPS daemon of a GPU without tenants;
// without it the daemon stays for the next leader.
func TestStopMPSOnExit(t *testing.T) {
	for _, stop := range []bool{false, true} {
		dir, tb := newRunDir(t)
		env := []string{table.RunDirEnv + "=" + dir, "DETSHARE_SIMGPU=1", "TEST_MPS=1"}
		if stop {
			env = append(env, "TEST_STOP_MPS=1")
		}
		s := spawn(t, "sched", env...)
		waitLeader(t, tb, s.Process.Pid)
		ctl := filepath.Join(table.NewPaths(dir).MPSPipeDir(0), mps.SimControlFile)
		if _, err := os.Stat(ctl); err != nil {
			t.Fatal(err)
		}
		s.Process.Signal(syscall.SIGTERM)
		if err := s.Wait(); err != nil {
			t.Fatal(err)
		}
		_, err := os.Stat(ctl)
		if stop != os.IsNotExist(err) {
			t.Fatalf("stop-mps-on-exit=%v: control file stat %v", stop, err)
		}
	}
}
