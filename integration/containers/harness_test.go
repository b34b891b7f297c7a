package containers

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/integration/hostleft"
	"github.com/detshare/detshare/sched/table"
)

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
	daemonEnv                     []string
	ctrd                          *daemon

	createdHostDirs []string // host directories the daemons create outside our temp dir, removed when empty

	dockerOnce sync.Once
	dockerd    *daemon
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
	release, err := hostleft.Exclusive()
	if err != nil {
		fmt.Printf("FAIL: take the engine-suite lock %s: %v\n", hostleft.LockPath, err)
		os.Exit(1)
	}
	before := hostleft.Take()
	E, setupErr = setup()
	code := m.Run()
	if E != nil {
		E.teardown()
	}
	// Nothing of the suite may stay on the host: dead shim sockets, runc roots, podman's lock, temp files (issue 15).
	if os.Getenv("DETSHARE_E2E_KEEP") != "1" {
		if removed := hostleft.Clean(before); len(removed) > 0 {
			fmt.Printf("removed what the engines left on the host: %v\n", removed)
		}
		if left := hostleft.Left(before); len(left) > 0 {
			fmt.Printf("FAIL: the container suite left on the host: %v\n", left)
			code = 1
		}
	}
	release()
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
	for _, tool := range []string{"containerd", "ctr", "runc", "dockerd", "docker", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: install containerd, runc, docker.io and gcc from Debian (.ci/run does)", tool)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return nil, errors.New("/bin/busybox not found: apt-get install busybox-static")
	}
	e := &env{repo: repoRoot()}
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
	// Built as the Makefile builds them (stripped, lazy binding).
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -extldflags -Wl,-z,lazy", "-o", e.bin+"/", "./cmd/detshare", "./cmd/detshare-hook", "./cmd/detshare-runtime",
		"./cmd/containerd-shim-detshare-v1")
	cmd.Dir = e.repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build binaries: %v\n%s", err, out)
	}
	if e.imageTar, err = e.buildWorkloadImage(); err != nil {
		return nil, fmt.Errorf("build workload image: %w", err)
	}
	if e.pauseTar, err = e.buildPauseImage(); err != nil {
		return nil, fmt.Errorf("build pause image: %w", err)
	}
	e.daemonEnv = append(os.Environ(),
		"PATH="+e.bin+":"+os.Getenv("PATH"),
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
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # The CI sandbox forbids lowering oom_score_adj (CRI gives pause containers -998): keep it at containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare]
      runtime_type = "io.containerd.detshare.v1"
      pod_annotations = ["detshare.io/*"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(e.dir, "ctrd-root"), filepath.Join(e.dir, "ctrd-state"), e.ctrSock, pauseRef,
		filepath.Join(e.dir, "cni-bin"), filepath.Join(e.dir, "cni-conf"))
	if err := os.WriteFile(e.ctrCfg, []byte(cfg), 0o644); err != nil {
		return err
	}
	// runc state roots of the runc shim (per namespace, under /run/containerd whatever containerd's state dir).
	e.noteHostDirs("/run/containerd/runc/"+ctrNS, "/run/containerd/runc/k8s.io", "/run/containerd/runc/moby")
	logf, err := os.Create(filepath.Join(e.dir, "containerd.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("containerd", "--config", e.ctrCfg)
	cmd.Env = e.daemonEnv
	cmd.Stdout, cmd.Stderr = logf, logf
	if e.ctrd, err = startDaemon(cmd); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && !e.ctrd.exited() {
		if _, err := e.ctr("version"); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(e.dir, "containerd.log"))
	return fmt.Errorf("containerd did not come up (exited: %v); log:\n%s", e.ctrd.exited(), tail(string(log), 3000))
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
	if e.dockerd, err = startDaemon(cmd); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) && !e.dockerd.exited() {
		if _, err := e.docker("version"); err == nil {
			if out, err := e.docker("load", "-i", e.imageTar); err != nil {
				return fmt.Errorf("docker load: %v: %s", err, out)
			}
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(e.dir, "dockerd.log"))
	return fmt.Errorf("dockerd did not come up (exited: %v); log:\n%s", e.dockerd.exited(), tail(string(log), 3000))
}

// stopScheduler ends the `detshare sched` that registrations started on demand (sched/ensure) for our run
// directory: found by its command line, ended by pid.
func (e *env) stopScheduler() {
	if e.runDir == "" {
		return
	}
	for _, pid := range processesNaming(e.runDir) {
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

// daemon is a started containerd or dockerd.
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startDaemon(cmd *exec.Cmd) (*daemon, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(d.done) }()
	return d, nil
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func stopDaemon(d *daemon) {
	if d == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

func (e *env) teardown() {
	if e.dockerd != nil {
		// Containers Docker left (a failed test) go first, so their shims exit.
		if out, err := e.docker("ps", "-aq"); err == nil {
			for _, id := range strings.Fields(out) {
				e.docker("rm", "-f", id)
			}
		}
		stopDaemon(e.dockerd)
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
		stopDaemon(e.ctrd)
	}
	e.stopScheduler()
	for _, d := range e.createdHostDirs {
		os.Remove(d) // only when empty: another engine on the host may use the same directory
	}
	if e.dir != "" && os.Getenv("DETSHARE_E2E_KEEP") == "1" {
		fmt.Println("DETSHARE_E2E_KEEP=1: test directory kept:", e.dir)
		return
	}
	if e.dir != "" {
		unmountUnder(e.dir)
		os.RemoveAll(e.dir)
	}
}

// unmountUnder detaches every mount below dir (overlay rootfs, shm of stopped daemons), deepest first.
func unmountUnder(dir string) {
	for _, m := range mountsUnder(dir) {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
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
	return run(60*time.Second, nil, "ctr", append([]string{"--address", e.ctrSock, "--namespace", ns}, args...)...)
}

func (e *env) docker(args ...string) (string, error) {
	return run(60*time.Second, nil, "docker", append([]string{"-H", "unix://" + e.dockerSock}, args...)...)
}

// ---- images ------------------------------------------------------------------------------------------------------

// rootfsFile is one entry of an image layer.
type rootfsFile struct {
	path    string // in the image
	src     string // host file to copy ("" for a directory or symlink)
	link    string // symlink target
	mode    int64
	content []byte
}

func (e *env) buildWorkloadImage() (string, error) {
	files := []rootfsFile{
		{path: "bin/busybox", src: "/bin/busybox", mode: 0o755},
		{path: "usr/local/bin/simgpu-probe", src: filepath.Join(e.build, "tests/simgpu-probe"), mode: 0o755},
		{path: "usr/lib/simgpu/libcuda.so.1", src: filepath.Join(e.build, "lib/simgpu/libcuda.so.1"), mode: 0o755},
	}
	for _, tool := range []string{"sh", "cat", "sleep", "echo", "grep", "ls", "true", "test", "stat", "touch"} {
		files = append(files, rootfsFile{path: "bin/" + tool, link: "busybox"})
	}
	libs, err := sharedLibs(filepath.Join(e.build, "tests/simgpu-probe"), filepath.Join(e.build, "lib/simgpu/libcuda.so.1"),
		filepath.Join(e.build, "lib/libdetshare.so"))
	if err != nil {
		return "", err
	}
	for _, l := range libs {
		files = append(files, rootfsFile{path: strings.TrimPrefix(l, "/"), src: l, mode: 0o755})
	}
	cfg := map[string]any{"Env": []string{"PATH=/usr/local/bin:/bin", "LD_LIBRARY_PATH=/usr/lib/simgpu",
		"DETSHARE_SIMGPU_SMS=132"}, "Cmd": []string{"/bin/sh"}}
	return e.writeImage("workload.tar", "detshare-e2e:test", files, cfg)
}

func (e *env) buildPauseImage() (string, error) {
	src := filepath.Join(e.dir, "pause.c")
	bin := filepath.Join(e.dir, "pause")
	code := `#include <signal.h>
#include <unistd.h>
static void done(int s) { (void)s; _exit(0); }
int main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }
`
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		return "", err
	}
	if out, err := run(60*time.Second, nil, "gcc", "-static", "-O2", "-o", bin, src); err != nil {
		return "", fmt.Errorf("gcc -static pause: %v: %s", err, out)
	}
	return e.writeImage("pause.tar", "detshare-pause:test", []rootfsFile{{path: "pause", src: bin, mode: 0o755}},
		map[string]any{"Cmd": []string{"/pause"}})
}

// sharedLibs lists the shared libraries (and the loader) the given ELF files need, as ldd resolves them.
func sharedLibs(files ...string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		o, err := run(30*time.Second, nil, "ldd", f)
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %v: %s", f, err, o)
		}
		for _, line := range strings.Split(o, "\n") {
			for _, w := range strings.Fields(line) {
				if strings.HasPrefix(w, "/") && !seen[w] {
					seen[w] = true
					out = append(out, w)
				}
			}
		}
	}
	return out, nil
}

// writeImage writes a one-layer image in the `docker save` format, which both `docker load` and
// `ctr images import` read.
func (e *env) writeImage(name, tag string, files []rootfsFile, cfg map[string]any) (string, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	mkdir := func(d string) error {
		if d == "." || d == "" || dirs[d] {
			return nil
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "run", "usr", "usr/lib", "usr/local", "usr/local/bin"} {
		if err := mkdir(d); err != nil {
			return "", err
		}
	}
	for _, f := range files {
		parts := strings.Split(filepath.Dir(f.path), "/")
		for i := range parts {
			if err := mkdir(strings.Join(parts[:i+1], "/")); err != nil {
				return "", err
			}
		}
		switch {
		case f.link != "":
			if err := tw.WriteHeader(&tar.Header{Name: f.path, Typeflag: tar.TypeSymlink, Linkname: f.link, Mode: 0o777}); err != nil {
				return "", err
			}
		default:
			data := f.content
			if f.src != "" {
				var err error
				if data, err = os.ReadFile(f.src); err != nil {
					return "", err
				}
			}
			if err := tw.WriteHeader(&tar.Header{Name: f.path, Typeflag: tar.TypeReg, Mode: f.mode, Size: int64(len(data))}); err != nil {
				return "", err
			}
			if _, err := tw.Write(data); err != nil {
				return "", err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	sum := sha256.Sum256(layer.Bytes())
	diffID := "sha256:" + hex.EncodeToString(sum[:])
	config := map[string]any{"architecture": "amd64", "os": "linux", "config": cfg,
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"created": "2026-01-01T00:00:00Z"}
	cfgData, _ := json.Marshal(config)
	csum := sha256.Sum256(cfgData)
	cfgName := hex.EncodeToString(csum[:]) + ".json"
	manifest, _ := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{tag},
		"Layers": []string{"layer/layer.tar"}}})
	path := filepath.Join(e.dir, name)
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	ow := tar.NewWriter(f)
	add := func(n string, data []byte) error {
		if err := ow.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := io.Copy(ow, bytes.NewReader(data))
		return err
	}
	if err := ow.WriteHeader(&tar.Header{Name: "layer/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		return "", err
	}
	for _, it := range []struct {
		n string
		d []byte
	}{{"layer/layer.tar", layer.Bytes()}, {cfgName, cfgData}, {"manifest.json", manifest}} {
		if err := add(it.n, it.d); err != nil {
			return "", err
		}
	}
	return path, ow.Close()
}

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
		if pids := processesNaming(id); len(pids) > 0 {
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

// processesNaming lists processes whose command line contains s.
func processesNaming(s string) []int {
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
