package demo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/hostleft"
)

func script(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "demo.sh")
}

// need fails loudly when the demo cannot run here, unless DETSHARE_SKIP_DEMO=1.
func need(t *testing.T) {
	if os.Getenv("DETSHARE_SKIP_DEMO") == "1" {
		t.Skip("DETSHARE_SKIP_DEMO=1")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the demo needs root (containerd, runc); set DETSHARE_SKIP_DEMO=1 to skip")
	}
	for _, tool := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: integration/deps.sh demo installs it (or DETSHARE_SKIP_DEMO=1)", tool)
		}
	}
	// The demo's leftover check must not see another engine suite running beside it.
	release, err := hostleft.Exclusive()
	if err != nil {
		t.Fatalf("take the engine-suite lock %s: %v", hostleft.LockPath, err)
	}
	t.Cleanup(release)
}

// demoCmd runs demo.sh as CI does: --yes, no terminal, prebuilt tree (make test builds first).
func demoCmd(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(script(t), append([]string{"--yes"}, args...)...)
	cmd.Env = append(os.Environ(), "DEMO_SKIP_BUILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

var tmpRe = regexp.MustCompile(`private containerd \((/tmp/detshare-demo\.[A-Za-z0-9]+)/containerd\.sock\)`)

// leftovers lists what of the demo's temporary directory survived it: the directory, mounts, processes.
func leftovers(dir string) []string {
	var out []string
	if _, err := os.Stat(dir); err == nil {
		out = append(out, "directory "+dir)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && bytes.Contains(mi, []byte(dir)) {
		out = append(out, "a mount under "+dir)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(dir)) {
			out = append(out, "process "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func waitClean(t *testing.T, dir string) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		l := leftovers(dir)
		if len(l) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo left behind: %v", l)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// row parses "<label>  p50  p99  kernels/s  kept%" from the demo's final table.
func row(t *testing.T, out, label string) (p50, p99, rate float64) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(label) + `\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+\d+%\s*$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q row in the demo's table:\n%s", label, out)
	}
	f := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	return f(m[1]), f(m[2]), f(m[3])
}

// The demo, as `make demo DEMO_ARGS=--yes` runs in CI on the simulated GPU: the table has the three rows, the
// latency-critical p99 under DetShare beats the one shared without it, the best-effort job still runs, the
// simulated GPU is named as such, `detshare top` was shown, and nothing is left behind.
func TestDemoCIMode(t *testing.T) {
	need(t)
	// The comparison is of simulated timings on a 2-core machine that other test packages load at the same time; a
	// phase that coincides with a burst of load can invert it. One more run is allowed, loudly; the isolation must
	// show in it.
	for attempt := 1; ; attempt++ {
		d99, s99, s := runDemoCI(t)
		if d99 < s99 {
			return
		}
		if attempt == 2 {
			t.Fatalf("DetShare's latency-critical p99 %.2f ms is not better than without DetShare (%.2f ms), twice\n%s",
				d99, s99, s)
		}
		t.Logf("ATTENTION: DetShare's latency-critical p99 %.2f ms was not better than without DetShare (%.2f ms) "+
			"on this run; running the demo once more (a loaded machine inverts simulated timings)", d99, s99)
	}
}

// runDemoCI runs the demo once, checks what must hold in every run and returns the latency-critical p99 shared
// with and without DetShare.
func runDemoCI(t *testing.T) (d99, s99 float64, s string) {
	t.Helper()
	before := hostleft.Take()
	cmd := demoCmd(t, "--duration", "3")
	out, err := cmd.CombinedOutput()
	s = string(out)
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, s)
	}
	m := tmpRe.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("demo output does not name its private containerd socket:\n%s", s)
	}
	waitClean(t, m[1])
	if left := hostleft.Left(before); len(left) > 0 {
		t.Errorf("the demo left on the host: %v", left)
	}
	for _, want := range []string{"SIMULATED GPU (a test double", "Results on the SIMULATED GPU (test double)",
		"detshare top", "lc-detshare", "be-detshare"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	a50, a99, ba := row(t, s, "alone")
	_, s99, bs := row(t, s, "shared without DetShare")
	_, d99, bd := row(t, s, "shared with DetShare")
	t.Logf("LC p99 alone %.2f ms, shared without DetShare %.2f ms, with DetShare %.2f ms; BE %.1f / %.1f / %.1f kernels/s",
		a99, s99, d99, ba, bs, bd)
	if a50 <= 0 || ba <= 0 || bs <= 0 || bd <= 0 {
		t.Errorf("a workload did not run: LC alone p50 %.2f, BE %.1f / %.1f / %.1f kernels/s\n%s", a50, ba, bs, bd, s)
	}
	return d99, s99, s
}

// Ctrl-C in the middle of the demo stops it and removes everything it started: containers, containerd, the
// scheduler, mounts and the temporary directory.
func TestDemoCtrlCCleansUp(t *testing.T) {
	need(t)
	before := hostleft.Take()
	cmd := demoCmd(t, "--duration", "20")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(buf.String(), "phase 1/4") {
		if time.Now().After(deadline) {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			t.Fatalf("demo never reached its first phase:\n%s", buf.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2500 * time.Millisecond) // containers are running now
	m := tmpRe.FindStringSubmatch(buf.String())
	if m == nil {
		t.Fatalf("no socket path in the output:\n%s", buf.String())
	}
	// what a terminal's Ctrl-C does: SIGINT to the whole foreground process group
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
			t.Errorf("interrupted demo exited with %v, want a non-zero status", err)
		}
	case <-time.After(60 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("demo did not stop within 60 s of SIGINT:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "interrupted, cleaning up") {
		t.Errorf("demo did not say it was cleaning up:\n%s", buf.String())
	}
	waitClean(t, m[1])
	if left := hostleft.Left(before); len(left) > 0 {
		t.Errorf("the interrupted demo left on the host: %v", left)
	}
}

// A demo that fails half-way (here: containerd exits at once) says what failed, exits non-zero and removes what it
// had made: its temporary directory, its processes, the host directories it created. With --keep it keeps the
// temporary directory and says so.
func TestDemoFailureCleansUp(t *testing.T) {
	need(t)
	fake := t.TempDir()
	bad := "#!/bin/sh\necho 'fake containerd: refusing to start' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(fake, "containerd"), []byte(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		before := hostleft.Take()
		args := []string{"--duration", "2"}
		if keep {
			args = append(args, "--keep")
		}
		cmd := demoCmd(t, args...)
		cmd.Env = append(cmd.Env, "PATH="+fake+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		s := string(out)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
			t.Fatalf("demo with a containerd that cannot start: %v, want a non-zero exit\n%s", err, s)
		}
		for _, want := range []string{"fake containerd: refusing to start", "demo: containerd did not start"} {
			if !strings.Contains(s, want) {
				t.Errorf("the failed demo's output lacks %q:\n%s", want, s)
			}
		}
		m := tmpRe.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("demo output does not name its private containerd socket:\n%s", s)
		}
		if keep {
			if !strings.Contains(s, "demo: --keep: "+m[1]+" kept") {
				t.Errorf("--keep: the demo did not say it kept %s:\n%s", m[1], s)
			}
			if _, err := os.Stat(filepath.Join(m[1], "containerd.log")); err != nil {
				t.Errorf("--keep: %s/containerd.log is gone: %v", m[1], err)
			}
			os.RemoveAll(m[1])
		}
		waitClean(t, m[1])
		if left := hostleft.Left(before); len(left) > 0 {
			t.Errorf("the failed demo (keep=%v) left on the host: %v", keep, left)
		}
	}
}
