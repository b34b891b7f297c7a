package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/placement"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/integration/hostleft"
	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
)

// registrar registers the tests' own tenants (blockers) in this process, wired like the shim (cmd/internal/wiring).
var registrar = tenant.Registrar{EnsureScheduler: ensure.EnsureScheduler, DiscoverGPUs: simgpu.Discover,
	Placer: &placement.Placer{}}

const (
	imageRef = "docker.io/library/detshare-e2e:test" // the simulated-GPU (test double) workload image
	pauseRef = "docker.io/library/detshare-pause:test"
	ctrNS    = "detshare-e2e"
)

// env is the shared test environment, set up once in TestMain.
type env struct {
	repo, build, dir, bin, runDir string
	imageTar, pauseTar            string
	ctrSock, ctrCfg               string
	ctrdBin, ctrBin               string // the containerd and ctr under test (DETSHARE_CONTAINERD_BIN or PATH)
	ctrdMajor                     int    // containerd's major version: 1 (config version 2) or 2 (config version 3)
	daemonEnv                     []string
	ctrd                          *testenv.Daemon

	createdHostDirs []string // host directories the daemons create outside our temp dir, removed when empty

	dockerOnce sync.Once
	dockerd    *testenv.Daemon
	dockerSock string
	dockerRoot string
	dockerErr  error
}

var (
	E        *env
	setupErr error
)

func TestMain(m *testing.M) {
	if os.Getenv("DETSHARE_SKIP_CONTAINERS") == "1" {
		fmt.Println("DETSHARE_SKIP_CONTAINERS=1: container end-to-end tests skipped")
		os.Exit(m.Run())
	}
	// Nothing of the suite may stay on the host: dead shim sockets, runc roots, podman's lock, temp files (issue 15).
	finish, err := hostleft.Suite("container suite")
	if err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	E, setupErr = setup()
	code := m.Run()
	if E != nil {
		E.teardown()
	}
	code = finish(code)
	os.Exit(code)
}

// need fails (or skips with DETSHARE_SKIP_CONTAINERS=1) when the environment is not there.
func need(t *testing.T) *env {
	t.Helper()
	if os.Getenv("DETSHARE_SKIP_CONTAINERS") == "1" {
		t.Skip("DETSHARE_SKIP_CONTAINERS=1")
	}
	if setupErr != nil {
		t.Fatalf("container test environment not available: %v", setupErr)
	}
	return E
}

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(f), "..", ".."))
}

func setup() (*env, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root (containerd, runc and dockerd run as root)")
	}
	for _, tool := range []string{"runc", "dockerd", "docker", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: install containerd, runc, docker.io and gcc from Debian (.ci/run does)", tool)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return nil, errors.New("/bin/busybox not found: apt-get install busybox-static")
	}
	e := &env{repo: repoRoot()}
	if err := e.pickContainerd(); err != nil {
		return nil, err
	}
	e.build = os.Getenv("DETSHARE_BUILD_DIR")
	if e.build == "" {
		e.build = filepath.Join(e.repo, "build")
	}
	for _, f := range []string{"lib/libdetshare.so", "lib/simgpu/libcuda.so.1", "tests/simgpu-probe"} {
		if _, err := os.Stat(filepath.Join(e.build, f)); err != nil {
			return nil, fmt.Errorf("%s missing: run `make build` first", filepath.Join(e.build, f))
		}
	}
	dir, err := os.MkdirTemp("/tmp", "dse2e-")
	if err != nil {
		return nil, err
	}
	e.dir = dir
	e.bin = filepath.Join(dir, "bin")
	e.runDir = filepath.Join(dir, "run")
	ok := false
	defer func() {
		if !ok {
			e.teardown()
		}
	}()
	// Built as the Makefile builds them (stripped, lazy binding; the shim without cgo).
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -extldflags -Wl,-z,lazy", "-o", e.bin+"/", "./cmd/detshare", "./cmd/detshare-hook", "./cmd/detshare-runtime")
	cmd.Dir = e.repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build binaries: %v\n%s", err, out)
	}
	cmd = exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", e.bin+"/", "./cmd/containerd-shim-detshare-v1", "./cmd/containerd-shim-detshare-v1-serve")
	cmd.Dir, cmd.Env = e.repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the shim: %v\n%s", err, out)
	}
	if e.imageTar, err = testenv.WorkloadImage(e.dir, e.build); err != nil {
		return nil, fmt.Errorf("build workload image: %w", err)
	}
	if e.pauseTar, err = testenv.PauseImage(e.dir); err != nil {
		return nil, fmt.Errorf("build pause image: %w", err)
	}
	path := e.bin + ":" + os.Getenv("PATH")
	if d := os.Getenv("DETSHARE_CONTAINERD_BIN"); d != "" {
		path = e.bin + ":" + d + ":" + os.Getenv("PATH") // its containerd-shim-runc-v2 before Debian's
	}
	e.daemonEnv = append(os.Environ(),
		"PATH="+path,
		"DETSHARE_SIMGPU=1", // the host side describes the simulated GPU (a test double)
		"DETSHARE_RUN_DIR="+e.runDir,
		"DETSHARE_LIB="+filepath.Join(e.build, "lib/libdetshare.so"),
		"DETSHARE_HOOK="+filepath.Join(e.bin, "detshare-hook"),
		"DETSHARE_LOG_LEVEL=warning",
		// The host configuration of these engines ([tenants] fail_open): private, absent unless a test writes it.
		"DETSHARE_CONFIG="+e.hostConfig(),
	)
	if v := os.Getenv("DETSHARE_SHIM_LABELS"); v != "" {
		e.daemonEnv = append(e.daemonEnv, "DETSHARE_SHIM_LABELS="+v)
	}
	if err := e.startContainerd(); err != nil {
		return nil, err
	}
	if out, err := e.ctr("images", "import", e.imageTar); err != nil {
		return nil, fmt.Errorf("import image: %v: %s", err, out)
	}
	if out, err := e.ctrNS("k8s.io", "images", "import", e.imageTar); err != nil {
		return nil, fmt.Errorf("import image (k8s.io): %v: %s", err, out)
	}
	if out, err := e.ctrNS("k8s.io", "images", "import", e.pauseTar); err != nil {
		return nil, fmt.Errorf("import pause image: %v: %s", err, out)
	}
	ok = true
	return e, nil
}

// hostConfig is the DetShare host configuration file the test engines read (absent: defaults).
func (e *env) hostConfig() string { return filepath.Join(e.dir, "detshare-config.toml") }

func (e *env) startContainerd() error {
	e.ctrSock = filepath.Join(e.dir, "containerd.sock")
	e.ctrCfg = filepath.Join(e.dir, "containerd.toml")
	cfg := e.containerdConfig()
	if err := os.WriteFile(e.ctrCfg, []byte(cfg), 0o644); err != nil {
		return err
	}
	// runc state roots of the runc shim (per namespace, under /run/containerd whatever containerd's state dir).
	e.noteHostDirs("/run/containerd/runc/"+ctrNS, "/run/containerd/runc/k8s.io", "/run/containerd/runc/moby")
	logf, err := os.Create(filepath.Join(e.dir, "containerd.log"))
	if err != nil {
		return err
	}
	args := []string{"--config", e.ctrCfg}
	if lvl := os.Getenv("DETSHARE_E2E_CONTAINERD_LOG_LEVEL"); lvl != "" {
		// debug makes the DetShare shim log each start's phases (BenchmarkStartPaired collects them)
		args = append(args, "--log-level", lvl)
	}
	cmd := exec.Command(e.ctrdBin, args...)
	cmd.Env = e.daemonEnv
	cmd.Stdout, cmd.Stderr = logf, logf
	if e.ctrd, err = testenv.StartDaemon(cmd); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && !e.ctrd.Exited() {
		if _, err := e.ctr("version"); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(e.dir, "containerd.log"))
	return fmt.Errorf("containerd did not come up (exited: %v); log:\n%s", e.ctrd.Exited(), tail(string(log), 3000))
}

// startDocker starts dockerd on our containerd, once.
func (e *env) startDocker() error {
	e.dockerOnce.Do(func() { e.dockerErr = e.doStartDocker() })
	return e.dockerErr
}

func (e *env) doStartDocker() error {
	e.dockerSock = filepath.Join(e.dir, "docker.sock")
	e.dockerRoot = filepath.Join(e.dir, "docker-root")
	daemonJSON := map[string]any{
		// Docker 20.10 writes a trust key to /etc/docker/key.json unless told otherwise.
		"deprecated-key-path": filepath.Join(e.dir, "docker-key.json"),
		"runtimes": map[string]any{"detshare": map[string]any{
			"path": filepath.Join(e.bin, "detshare-runtime"),
			"runtimeArgs": []string{"--detshare-docker-root", e.dockerRoot, "--detshare-run-dir", e.runDir,
				"--detshare-lib", filepath.Join(e.build, "lib/libdetshare.so"),
				"--detshare-hook", filepath.Join(e.bin, "detshare-hook")},
		}},
	}
	data, _ := json.Marshal(daemonJSON)
	cfgPath := filepath.Join(e.dir, "daemon.json")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		return err
	}
	e.noteHostDirs("/run/docker/plugins", "/run/docker") // dockerd makes these whatever its exec-root
	logf, err := os.Create(filepath.Join(e.dir, "dockerd.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("dockerd", "--config-file", cfgPath, "--data-root", e.dockerRoot,
		"--exec-root", filepath.Join(e.dir, "docker-exec"), "--pidfile", filepath.Join(e.dir, "docker.pid"),
		"-H", "unix://"+e.dockerSock, "--containerd", e.ctrSock, "--bridge", "none", "--iptables=false",
		"--ip-masq=false", "--ip-forward=false", "--storage-driver", "overlay2")
	cmd.Env = e.daemonEnv
	cmd.Stdout, cmd.Stderr = logf, logf
	if e.dockerd, err = testenv.StartDaemon(cmd); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) && !e.dockerd.Exited() {
		if _, err := e.docker("version"); err == nil {
			if out, err := e.docker("load", "-i", e.imageTar); err != nil {
				return fmt.Errorf("docker load: %v: %s", err, out)
			}
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(e.dir, "dockerd.log"))
	return fmt.Errorf("dockerd did not come up (exited: %v); log:\n%s", e.dockerd.Exited(), tail(string(log), 3000))
}

// noteHostDirs remembers which of dirs do not exist yet, to remove them at teardown.
func (e *env) noteHostDirs(dirs ...string) {
	for _, d := range dirs {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			e.createdHostDirs = append(e.createdHostDirs, d)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (e *env) teardown() {
	if e.dockerd != nil {
		// Containers Docker left (a failed test) go first, so their shims exit.
		if out, err := e.docker("ps", "-aq"); err == nil {
			for _, id := range strings.Fields(out) {
				e.docker("rm", "-f", id)
			}
		}
		testenv.StopDaemon(e.dockerd)
	}
	if e.ctrd != nil {
		for _, ns := range []string{ctrNS, "k8s.io", "moby"} {
			if out, err := e.ctrNS(ns, "tasks", "ls", "-q"); err == nil {
				for _, id := range strings.Fields(out) {
					e.ctrNS(ns, "tasks", "kill", "-s", "SIGKILL", id)
					time.Sleep(100 * time.Millisecond)
					e.ctrNS(ns, "tasks", "rm", "-f", id)
				}
			}
			if out, err := e.ctrNS(ns, "containers", "ls", "-q"); err == nil {
				for _, id := range strings.Fields(out) {
					e.ctrNS(ns, "containers", "rm", id)
				}
			}
		}
		testenv.StopDaemon(e.ctrd)
	}
	testenv.StopScheduler(e.runDir)
	for _, d := range e.createdHostDirs {
		os.Remove(d) // only when empty: another engine on the host may use the same directory
	}
	if e.dir != "" && os.Getenv("DETSHARE_E2E_KEEP") == "1" {
		fmt.Println("DETSHARE_E2E_KEEP=1: test directory kept:", e.dir)
		return
	}
	if e.dir != "" {
		testenv.UnmountUnder(e.dir)
		os.RemoveAll(e.dir)
	}
}

func run(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = env
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: timed out after %v", name, strings.Join(args, " "), timeout)
	}
	return buf.String(), err
}

func (e *env) ctr(args ...string) (string, error) { return e.ctrNS(ctrNS, args...) }

func (e *env) ctrNS(ns string, args ...string) (string, error) {
	return run(60*time.Second, nil, e.ctrBin, append([]string{"--address", e.ctrSock, "--namespace", ns}, args...)...)
}

func (e *env) docker(args ...string) (string, error) {
	return run(60*time.Second, nil, "docker", append([]string{"-H", "unix://" + e.dockerSock}, args...)...)
}

// ---- images ------------------------------------------------------------------------------------------------------

// ---- assertions on DetShare state -----------------------------------------------------------------------------------

// registered returns the tenant IDs in the table.
func (e *env) registered(t *testing.T) []string {
	t.Helper()
	tb, err := table.OpenReadOnly(e.runDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatalf("open table: %v", err)
	}
	defer tb.Close()
	var ids []string
	for _, r := range tb.List() {
		ids = append(ids, r.ID)
	}
	return ids
}

func (e *env) lookup(t *testing.T, id string) (table.Registration, bool) {
	t.Helper()
	tb, err := table.OpenReadOnly(e.runDir)
	if errors.Is(err, os.ErrNotExist) {
		return table.Registration{}, false
	}
	if err != nil {
		t.Fatalf("open table: %v", err)
	}
	defer tb.Close()
	return tb.Lookup(id)
}

// assertNoLeak checks that nothing of container id is left: no slot, no client page, no tenant directory, no
// mount naming it, no process (shim or container) naming it.
func (e *env) assertNoLeak(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var problems []string
	for {
		problems = problems[:0]
		if _, ok := e.lookup(t, id); ok {
			problems = append(problems, "table slot still registered")
		}
		if _, err := os.Stat(filepath.Join(e.runDir, "clients", id+".page")); err == nil {
			problems = append(problems, "client page left")
		}
		if _, err := os.Stat(filepath.Join(e.runDir, "tenants", id)); err == nil {
			problems = append(problems, "tenant directory left")
		}
		if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(data), id) {
			problems = append(problems, "mount naming the container left")
		}
		if pids := testenv.ProcessesNaming(id); len(pids) > 0 {
			problems = append(problems, fmt.Sprintf("processes naming the container left: %v", pids))
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(problems) > 0 {
		t.Errorf("container %s leaked: %s", id, strings.Join(problems, "; "))
	}
}

// meminfoTotal extracts "total" from a simgpu-probe meminfo line in out.
func meminfoTotal(t *testing.T, out string) uint64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, `"cmd":"meminfo"`) {
			continue
		}
		var m struct {
			Total uint64 `json:"total"`
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &m); err == nil {
			return m.Total
		}
	}
	t.Fatalf("no meminfo line in output:\n%s", out)
	return 0
}

const simTotal = 80 << 30 // the simulated GPU's default memory
