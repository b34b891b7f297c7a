// Package startup checks that every DetShare binary starts on a host without the NVIDIA driver (CI is one).
// A Go binary that links go-nvml with immediate binding dies before main there (DESIGN.md §2); the Makefile
// links lazily, and this test keeps it that way.
package startup

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildDir is DETSHARE_BUILD_DIR or the repository's build/.
func buildDir(t *testing.T) string {
	if d := os.Getenv("DETSHARE_BUILD_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "build")
}

func TestEveryBinaryStartsWithoutNVIDIADriver(t *testing.T) {
	bins, _ := filepath.Glob(filepath.Join(buildDir(t), "bin", "*"))
	if len(bins) == 0 {
		t.Fatalf("no binaries in %s/bin: run `make build` first", buildDir(t))
	}
	for _, b := range bins {
		out, err := exec.Command(b, "--help").CombinedOutput()
		s := string(out)
		if strings.Contains(s, "symbol lookup error") || strings.Contains(s, "error while loading shared libraries") {
			t.Errorf("%s does not start without the driver:\n%s", filepath.Base(b), s)
			continue
		}
		if err != nil && !strings.Contains(strings.ToLower(s), "usage") {
			t.Errorf("%s --help failed: %v\n%s", filepath.Base(b), err, s)
		}
	}
}

// TestEveryBinaryHasItsOwnVersionAndHelp: each binary answers --version with its own name and the same DetShare
// version (cmd/detshare/version, stamped by the Makefile), and --help with its own text, not that of a library it
// wraps (runc's for detshare-runtime, containerd's shim flags for the shim).
func TestEveryBinaryHasItsOwnVersionAndHelp(t *testing.T) {
	bin := func(n string) string { return filepath.Join(buildDir(t), "bin", n) }
	out, err := exec.Command(bin("detshare"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("detshare --version: %v\n%s", err, out)
	}
	_, ver, ok := strings.Cut(strings.TrimSpace(string(out)), " version ")
	if !ok || ver == "" {
		t.Fatalf("detshare --version: want \"detshare version <v>\", got %q", out)
	}
	for _, c := range []struct{ name, help string }{
		{"detshare", "share one NVIDIA GPU"},
		{"detshare-hook", "OCI hook"},
		{"detshare-runtime", "DetShare's runc wrapper for Docker"},
		{"containerd-shim-detshare-v1", "io.containerd.detshare.v1"},
		{"containerd-shim-detshare-v1-serve", "serving containerd shim"},
		{"detshare-device-plugin", "detshare.io/gpu"},
		{"detshare-dra-plugin", "DRA"},
	} {
		p := bin(c.name)
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s not built: %v", c.name, err)
			continue
		}
		out, err := exec.Command(p, "--version").Output() // stdout only: runc's lines go there too
		if err != nil || !strings.HasPrefix(string(out), c.name+" version "+ver+"\n") {
			t.Errorf("%s --version: want a first line %q, got %v:\n%s", c.name, c.name+" version "+ver, err, out)
		}
		out, err = exec.Command(p, "--help").CombinedOutput()
		s := string(out)
		if err != nil || !strings.Contains(s, c.name) || !strings.Contains(s, c.help) {
			t.Errorf("%s --help: want its own help naming it and %q, got %v:\n%s", c.name, c.help, err, s)
		}
		if strings.Contains(s, "Open Container Initiative runtime") {
			t.Errorf("%s --help prints runc's help:\n%s", c.name, s)
		}
	}
}

func TestDoctorReportsMissingDriverAndExitsNonZero(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA driver; the no-driver path is exercised in CI")
	}
	bin := filepath.Join(buildDir(t), "bin", "detshare")
	out, err := exec.Command(bin, "doctor").CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("doctor without a driver: want exit 1, got %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "no NVIDIA driver") {
		t.Fatalf("doctor output does not name the missing driver:\n%s", out)
	}
}

// TestInstalledDoctorFindsTheSimulatedGPU installs the build (`make install-files`, PREFIX=/usr, into a DESTDIR
// staging) and runs the installed `detshare doctor --simulated-gpu`: its simulated GPU check must pass without
// pointing it at the build tree.
func TestInstalledDoctorFindsTheSimulatedGPU(t *testing.T) {
	build, err := filepath.Abs(buildDir(t))
	if err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dest := t.TempDir()
	install := exec.Command("make", "--no-print-directory", "-C", root, "install-files", "BUILD="+build,
		"DESTDIR="+dest, "PREFIX=/usr", "SYSCONFDIR=/etc")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("make install-files: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(dest, "usr", "bin", "detshare"), "--run-dir", filepath.Join(dest, "run"),
		"doctor", "--json", "--simulated-gpu", "--docker-config", filepath.Join(dest, "none.json"),
		"--containerd-config", filepath.Join(dest, "none.toml"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no DETSHARE_LIB / DETSHARE_LIB_DIR from the caller
	out, _ := cmd.Output()                          // not ready: no engine has the runtime here
	var r struct {
		Checks []struct{ Name, Status, Found, Fix string }
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	want := filepath.Join(dest, "usr", "lib", "detshare", "simgpu", "libcuda.so.1")
	found := false
	for _, c := range r.Checks {
		switch c.Name {
		case "simulated gpu":
			found = true
			if c.Status != "ok" || !strings.Contains(c.Found, want) {
				t.Errorf("installed doctor --simulated-gpu: %+v, want ok at %s", c, want)
			}
		case "libdetshare (run)":
			if c.Status != "ok" {
				t.Errorf("installed library check: %+v", c)
			}
		}
	}
	if !found {
		t.Errorf("no simulated gpu check in\n%s", out)
	}
}

// TestSchedRestartMovesAStaleSchedulerOntoTheNewBinary is the .deb upgrade: a scheduler runs detshare, the package
// replaces the file (rename over it, as dpkg does), and `detshare sched-restart --if-stale` (postinst) replaces the
// scheduler with one running the new file; doctor flags the old one before and not after.
func TestSchedRestartMovesAStaleSchedulerOntoTheNewBinary(t *testing.T) {
	build, _ := filepath.Abs(buildDir(t))
	data, err := os.ReadFile(filepath.Join(build, "bin", "detshare"))
	if err != nil {
		t.Fatalf("detshare not built: %v", err)
	}
	d := t.TempDir()
	bin := filepath.Join(d, "bin", "detshare")
	os.MkdirAll(filepath.Dir(bin), 0o755)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(d, "run")
	env := append(os.Environ(), "DETSHARE_SIMGPU=1", "DETSHARE_SIMGPU_STATE="+filepath.Join(d, "simgpu-state"),
		"DETSHARE_RUN_DIR="+runDir, "DETSHARE_BIN=", "DETSHARE_LIB="+filepath.Join(build, "lib", "libdetshare.so"))
	detshare := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	sched := exec.Command(bin, "--run-dir", runDir, "sched", "--no-mps")
	sched.Env = env
	if err := sched.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sched.Process.Kill(); sched.Wait() }()
	leader := func() int {
		for i := 0; i < 100; i++ {
			out, _ := detshare("status", "--json")
			var s struct {
				Scheduler struct {
					PID   int
					Alive bool
				}
			}
			if json.Unmarshal([]byte(out), &s) == nil && s.Scheduler.Alive && s.Scheduler.PID > 0 {
				return s.Scheduler.PID
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no scheduler leads " + runDir)
		return 0
	}
	old := leader()
	if out, err := detshare("sched-restart", "--if-stale"); err != nil || !strings.Contains(out, "left running") {
		t.Fatalf("sched-restart --if-stale on a current scheduler: %v\n%s", err, out)
	}
	// The upgrade.
	if err := os.WriteFile(bin+".dpkg-new", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".dpkg-new", bin); err != nil {
		t.Fatal(err)
	}
	if out, _ := detshare("doctor", "--simulated-gpu", "--lib-dir", filepath.Join(build, "lib")); !strings.Contains(out, "scheduler runs an old binary") {
		t.Errorf("doctor does not flag the old scheduler:\n%s", out)
	}
	out, err := detshare("sched-restart", "--if-stale")
	if err != nil || !strings.Contains(out, "runs an old binary") || !strings.Contains(out, "scheduler restarted") {
		t.Fatalf("sched-restart --if-stale after the upgrade: %v\n%s", err, out)
	}
	sched.Wait() // the old one exited
	now := leader()
	defer syscall.Kill(now, syscall.SIGTERM)
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", now))
	if now == old || exe != bin {
		t.Errorf("new scheduler pid %d (old %d) runs %q, want %s", now, old, exe, bin)
	}
	if out, _ := detshare("doctor", "--simulated-gpu", "--lib-dir", filepath.Join(build, "lib")); strings.Contains(out, "old binary") {
		t.Errorf("doctor still flags the restarted scheduler:\n%s", out)
	}
}
