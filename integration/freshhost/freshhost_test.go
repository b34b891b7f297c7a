package freshhost

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/table"
)

func here() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Dir(f)
}

func repoRoot() string { return filepath.Clean(filepath.Join(here(), "..", "..")) }

func buildDir() string {
	if b := os.Getenv("DETSHARE_BUILD_DIR"); b != "" {
		return b
	}
	return filepath.Join(repoRoot(), "build")
}

// need fails loudly when this host cannot emulate a fresh one: root (mounts, containerd), unshare, the engines and a
// built tree. It takes the engine-suite lock so that no other engine suite's leftovers are counted as ours.
func need(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the fresh-host tests need root: they mount tmpfs over /run in a private mount namespace and start " +
			"containerd (CI runs as root; run `sudo make test`)")
	}
	for _, tool := range []string{"unshare", "containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: integration/deps.sh test installs what the tests need", tool)
		}
	}
	for _, f := range []string{"bin/detshare", "bin/containerd-shim-detshare-v1", "bin/containerd-shim-detshare-v1-serve", "bin/detshare-hook",
		"lib/libdetshare.so", "lib/simgpu/libcuda.so.1", "tests/simgpu-probe"} {
		if _, err := os.Stat(filepath.Join(buildDir(), f)); err != nil {
			t.Fatalf("%s missing: run `make build` first (make test does)", filepath.Join(buildDir(), f))
		}
	}
	release, err := hostleft.Exclusive()
	if err != nil {
		t.Fatalf("take the engine-suite lock %s: %v", hostleft.LockPath, err)
	}
	t.Cleanup(release)
}

// onFreshHost runs argv under freshhost.sh in a private mount namespace (its own process group, killed whole on
// timeout) and returns the combined output and the error.
func onFreshHost(t *testing.T, timeout time.Duration, env []string, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := append([]string{"--mount", "--propagation", "private", "--", filepath.Join(here(), "freshhost.sh")}, argv...)
	cmd := exec.CommandContext(ctx, "unshare", args...)
	// DETSHARE_RUN_DIR unset: the default, /run/detshare, which the fresh /run lacks.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DETSHARE_RUN_DIR=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Errorf("timed out after %s", timeout)
	}
	out := buf.String()
	if !strings.Contains(out, "freshhost: fresh") {
		t.Fatalf("the fresh host was not set up: %v\n%s", err, out)
	}
	return out, err
}

// demoDirRe finds the demo's temporary directory in its output (as integration/demo's test does).
var demoDirRe = regexp.MustCompile(`private containerd \((/tmp/detshare-demo\.[A-Za-z0-9]+)/containerd\.sock\)`)

// leftInRun lists what the command left in the fresh /run (and the engines' other directories), as freshhost.sh
// reports it.
func leftInRun(out string) []string {
	var left []string
	for _, line := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(line, "freshhost: left "); ok {
			left = append(left, p)
		}
	}
	return left
}

// noProcessesNaming fails the test for, and kills, processes that still name dir.
func noProcessesNaming(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := testenv.ProcessesNaming(dir)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, pid := range pids {
				cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
				t.Errorf("left running: pid %d %s", pid, strings.ReplaceAll(string(cmd), "\x00", " "))
				syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// `make demo` on a host where containerd never ran (issue 25): no /run/containerd, /run/containerd/s or
// /run/containerd/fifo, no /run/detshare. The demo must run to its table in CI mode and leave the fresh /run as it
// found it (no /run/containerd), nothing in /tmp and no process behind.
func TestFreshHostDemo(t *testing.T) {
	need(t)
	before := hostleft.Take()
	out, err := onFreshHost(t, 150*time.Second, []string{"DEMO_SKIP_BUILD=1", "DETSHARE_DEPS_YES=1"},
		filepath.Join(repoRoot(), "integration", "demo", "demo.sh"), "--yes", "--duration", "2")
	// What it left is checked whether it failed or not: a failing demo must clean up too.
	if left := leftInRun(out); len(left) > 0 {
		t.Errorf("the demo left on the fresh host: %v", left)
	}
	if m := demoDirRe.FindStringSubmatch(out); m != nil {
		t.Logf("the demo's directory: %s", m[1])
		noProcessesNaming(t, m[1]+"/")
	}
	if left := hostleft.Left(before); len(left) > 0 {
		t.Errorf("the demo left on the host: %v", left)
		for _, p := range left { // reported; not left for the next run as well
			if strings.HasPrefix(p, "/tmp/detshare-demo.") {
				testenv.UnmountUnder(p)
				os.RemoveAll(p)
			}
		}
	}
	if err != nil {
		t.Fatalf("the demo failed on a fresh host: %v\n%s", err, out)
	}
	for _, want := range []string{"Results on the SIMULATED GPU (test double)", "shared without DetShare",
		"shared with DetShare", "detshare top"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q\n%s", want, out)
		}
	}
}

// A container through DetShare's shim (io.containerd.detshare.v1) on a containerd whose root and state do not
// exist yet, with containerd's default socket and state under the fresh /run and DetShare's default run directory
// /run/detshare absent: containerd creates its directories, the shim starts the scheduler on demand in a new
// /run/detshare, the hook mounts the quota, and the simulated-GPU (test double) workload sees its memory limit.
func TestFreshHostShimContainer(t *testing.T) {
	need(t)
	dir, err := os.MkdirTemp("/tmp", "dsfresh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testenv.UnmountUnder(dir)
		os.RemoveAll(dir)
	})
	build := buildDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// Started from dir/bin, so that every process of the test names dir and can be found and ended.
	for _, b := range []string{"containerd-shim-detshare-v1", "containerd-shim-detshare-v1-serve", "detshare", "detshare-hook"} {
		if err := os.Symlink(filepath.Join(build, "bin", b), filepath.Join(bin, b)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := testenv.WorkloadImage(dir, build); err != nil {
		t.Fatalf("build the workload image: %v", err)
	}
	version, err := exec.Command("containerd", "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd --version: %v: %s", err, version)
	}
	major, err := testenv.ContainerdMajor(string(version))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.ContainerdConfig{Major: major, Root: filepath.Join(dir, "ctrd", "root"), State: "/run/containerd",
		Socket: "/run/containerd/containerd.sock", SandboxImage: "docker.io/library/detshare-pause:test",
		CNIBin: filepath.Join(dir, "cni-bin"), CNIConf: filepath.Join(dir, "cni-conf")}.Render()
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"FRESH_DIR=" + dir, "DETSHARE_SIMGPU=1", "DETSHARE_LIB=" + filepath.Join(build, "lib/libdetshare.so"),
		"DETSHARE_HOOK=" + filepath.Join(bin, "detshare-hook"), "DETSHARE_BIN=" + filepath.Join(bin, "detshare"),
		"DETSHARE_CONFIG=" + filepath.Join(dir, "absent-config.toml"), "DETSHARE_LOG_LEVEL=warning",
		"OWN_TIER=" + testenv.OwnTierScript()}
	out, err := onFreshHost(t, 90*time.Second, env, filepath.Join(here(), "shimrun.sh"))
	if log, rerr := os.ReadFile(filepath.Join(dir, "containerd.log")); err != nil && rerr == nil {
		t.Logf("containerd.log:\n%s", log)
	}
	if err != nil {
		t.Fatalf("a container through DetShare's shim failed on a fresh host: %v\n%s", err, out)
	}
	start, end := strings.Index(out, "shimrun: out\n"), strings.Index(out, "shimrun: end")
	if start < 0 || end < start {
		t.Fatalf("no container output:\n%s", out)
	}
	cout := out[start:end]
	if !strings.Contains(cout, testenv.TierLine(table.TierLatencyCritical)) {
		t.Errorf("the container's table slot (named by its /run/detshare/quota) is not latency-critical:\n%s", cout)
	}
	var total uint64
	for _, line := range strings.Split(cout, "\n") {
		var m struct {
			Cmd   string `json:"cmd"`
			Total uint64 `json:"total"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(line)), &m) == nil && m.Cmd == "meminfo" {
			total = m.Total
		}
	}
	if total != 256<<20 {
		t.Errorf("the workload sees %d bytes of GPU memory, want its 256 MiB limit:\n%s", total, cout)
	}
	if !strings.Contains(out, "shimrun: /run/detshare created") {
		t.Errorf("the shim did not create DetShare's default run directory:\n%s", out)
	}
	noProcessesNaming(t, dir)
}

// integration/deps.sh (what `make test` and `make demo` run first) on a host that lacks a package and apt-get: it
// must name the package, say that apt-get is missing and fail, installing nothing; with everything present it
// passes. podman and apt-get are hidden in a private mount namespace by mounting a non-executable file over them.
func TestDepsNamesWhatIsMissing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it hides podman and apt-get behind bind mounts in a private mount namespace")
	}
	deps := filepath.Join(repoRoot(), "integration", "deps.sh")
	if out, err := exec.Command(deps, "test", "--check").CombinedOutput(); err != nil {
		t.Fatalf("deps.sh test --check on this host (make test installed everything): %v\n%s", err, out)
	}
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Fatalf("podman not found, though deps.sh --check passed: %v", err)
	}
	aptGet, err := exec.LookPath("apt-get")
	if err != nil {
		t.Fatalf("apt-get not found: %v", err)
	}
	blank := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(blank, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `mount --bind "$BLANK" "$PODMAN" && mount --bind "$BLANK" "$APTGET" && exec "$DEPS" test`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script)
	cmd.Env = append(os.Environ(), "BLANK="+blank, "PODMAN="+podman, "APTGET="+aptGet, "DEPS="+deps)
	cmd.Stdin = nil // not a terminal: deps.sh would install without asking, had it apt-get
	out, err := cmd.CombinedOutput()
	s := string(out)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("deps.sh without podman and apt-get: %v, want exit status 1\n%s", err, s)
	}
	for _, want := range []string{"  podman: podman (", "no apt-get here: install podman"} {
		if !strings.Contains(s, want) {
			t.Errorf("deps.sh output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "docker.io") || strings.Contains(s, "containerd:") {
		t.Errorf("deps.sh named packages that are installed:\n%s", s)
	}
}
