package containers

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/testenv"
)

// The issue-15 "Done when": from a state with no DetShare files, install DetShare (make install into a private
// DESTDIR, or the .deb with dpkg), register it with `detshare install containerd` and `docker` (private engine
// configs), start containerd and dockerd on those configs with nothing DetShare-specific in their environment but
// the run directory and the simulated GPU (a test double), and run a tenant through each: no manual copy, no
// DETSHARE_LIB. `detshare doctor` passes; removing the library makes doctor fail, a tenant that asks for DetShare
// is refused, and under [tenants] fail_open it runs with a loud line on its stderr.

// installedHost is one installed DetShare with its private engines.
type installedHost struct {
	e                      *env
	dir, bin, lib, conf    string // bin: installed binaries; lib: installed libdetshare.so; conf: host config.toml
	runDir                 string
	ctrCfg, ctrOrig        string
	daemonJSON, dockerOrig string
	ctrSock, dockerSock    string
	engineEnv              []string
	ctrd, dockerd          *testenv.Daemon
}

const instNS = "detshare-installed"

// engineEnv is the test's environment without DetShare overrides, with bin first on PATH (containerd finds shims on
// its PATH), the private run directory, config and the simulated GPU.
func installedEnv(bin, runDir, conf string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "DETSHARE_") || k == "PATH" {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PATH="+bin+":"+os.Getenv("PATH"), "DETSHARE_RUN_DIR="+runDir, "DETSHARE_CONFIG="+conf,
		"DETSHARE_SIMGPU=1", "DETSHARE_LOG_LEVEL=warning")
}

// newInstalledHost writes the private engine configs (as a host has them before DetShare) and calls register,
// which must put DetShare into them.
func newInstalledHost(t *testing.T, e *env, dir, bin, lib, conf string, register func(h *installedHost)) *installedHost {
	h := &installedHost{e: e, dir: dir, bin: bin, lib: lib, conf: conf, runDir: filepath.Join(dir, "run")}
	h.ctrSock = filepath.Join(dir, "containerd.sock")
	h.ctrCfg = filepath.Join(dir, "containerd.toml")
	// The CRI plugin is off (ctr and Docker do not need it; TestInstallContainerdThenDaemonLoadsCRI covers CRI).
	h.ctrOrig = fmt.Sprintf("version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\n[grpc]\n  address = %q\n",
		filepath.Join(dir, "ctrd-root"), filepath.Join(dir, "ctrd-state"), h.ctrSock)
	h.daemonJSON = filepath.Join(dir, "daemon.json")
	orig, _ := json.Marshal(map[string]any{"deprecated-key-path": filepath.Join(dir, "docker-key.json"),
		"data-root": filepath.Join(dir, "docker-root")})
	h.dockerOrig = string(orig)
	if err := os.WriteFile(h.ctrCfg, []byte(h.ctrOrig), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.daemonJSON, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	h.engineEnv = installedEnv(bin, h.runDir, conf)
	register(h)
	return h
}

func (h *installedHost) ctr(args ...string) (string, error) {
	return run(2*time.Minute, nil, "ctr", append([]string{"--address", h.ctrSock, "--namespace", instNS}, args...)...)
}

func (h *installedHost) docker(args ...string) (string, error) {
	return run(2*time.Minute, nil, "docker", append([]string{"-H", "unix://" + h.dockerSock}, args...)...)
}

func (h *installedHost) start(t *testing.T) {
	t.Helper()
	h.e.noteHostDirs("/run/containerd/runc/"+instNS, "/run/containerd/runc/moby")
	logf, err := os.Create(filepath.Join(h.dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", h.ctrCfg)
	cmd.Env, cmd.Stdout, cmd.Stderr = h.engineEnv, logf, logf
	if h.ctrd, err = testenv.StartDaemon(cmd); err != nil {
		t.Fatal(err)
	}
	if !waitUp(h.ctrd, 20*time.Second, func() error { _, err := h.ctr("version"); return err }) {
		log, _ := os.ReadFile(filepath.Join(h.dir, "containerd.log"))
		t.Fatalf("containerd on the installed config did not start:\n%s", tail(string(log), 3000))
	}
	if out, err := h.ctr("images", "import", h.e.imageTar); err != nil {
		t.Fatalf("import: %v: %s", err, out)
	}
	h.dockerSock = filepath.Join(h.dir, "docker.sock")
	dlog, err := os.Create(filepath.Join(h.dir, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	h.e.noteHostDirs("/run/docker/plugins", "/run/docker")
	cmd = exec.Command("dockerd", "--config-file", h.daemonJSON, "--exec-root", filepath.Join(h.dir, "docker-exec"),
		"--pidfile", filepath.Join(h.dir, "docker.pid"), "-H", "unix://"+h.dockerSock, "--containerd", h.ctrSock,
		"--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false", "--storage-driver", "overlay2")
	cmd.Env, cmd.Stdout, cmd.Stderr = h.engineEnv, dlog, dlog
	if h.dockerd, err = testenv.StartDaemon(cmd); err != nil {
		t.Fatal(err)
	}
	if !waitUp(h.dockerd, 40*time.Second, func() error { _, err := h.docker("version"); return err }) {
		log, _ := os.ReadFile(filepath.Join(h.dir, "dockerd.log"))
		t.Fatalf("dockerd on the installed daemon.json did not start:\n%s", tail(string(log), 3000))
	}
	if out, err := h.docker("load", "-i", h.e.imageTar); err != nil {
		t.Fatalf("docker load: %v: %s", err, out)
	}
}

// waitUp polls ping until it succeeds (true), d exits or the time is up (false).
func waitUp(d *testenv.Daemon, limit time.Duration, ping func() error) bool {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline) && !d.Exited(); {
		if ping() == nil {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// stop ends the engines and the scheduler the tenants started on demand, and unmounts what they left.
func (h *installedHost) stop() {
	if h.dockerd != nil {
		if out, err := h.docker("ps", "-aq"); err == nil {
			for _, id := range strings.Fields(out) {
				h.docker("rm", "-f", id)
			}
		}
		testenv.StopDaemon(h.dockerd)
	}
	if h.ctrd != nil {
		for _, ns := range []string{instNS, "moby"} {
			out, _ := run(time.Minute, nil, "ctr", "--address", h.ctrSock, "--namespace", ns, "tasks", "ls", "-q")
			for _, id := range strings.Fields(out) {
				run(time.Minute, nil, "ctr", "--address", h.ctrSock, "--namespace", ns, "tasks", "rm", "-f", id)
			}
			out, _ = run(time.Minute, nil, "ctr", "--address", h.ctrSock, "--namespace", ns, "containers", "ls", "-q")
			for _, id := range strings.Fields(out) {
				run(time.Minute, nil, "ctr", "--address", h.ctrSock, "--namespace", ns, "containers", "rm", id)
			}
		}
		testenv.StopDaemon(h.ctrd)
	}
	for _, pid := range testenv.ProcessesNaming(h.runDir) {
		syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
	testenv.UnmountUnder(h.dir)
}

// doctor runs the installed `detshare doctor` on the private configs; the simulated GPU (a test double) comes from
// the build tree, as it is not installed.
func (h *installedHost) doctor(t *testing.T) (bool, string) {
	t.Helper()
	out, err := run(time.Minute, h.engineEnv, filepath.Join(h.bin, "detshare"), "--run-dir", h.runDir, "doctor",
		"--json", "--simulated-gpu", "--lib-dir", filepath.Join(h.e.build, "lib"),
		"--containerd-config", h.ctrCfg, "--docker-config", h.daemonJSON)
	var r struct {
		Ready  bool `json:"ready"`
		Checks []struct{ Name, Status string }
	}
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil {
		t.Fatalf("doctor --json: %v (%v)\n%s", jerr, err, out)
	}
	if r.Ready != (err == nil) {
		t.Errorf("doctor exit status (%v) disagrees with ready=%v", err, r.Ready)
	}
	return r.Ready, out
}

// exercise is the part shared by both installs: tenants through both engines, doctor, then the library removed.
func (h *installedHost) exercise(t *testing.T) {
	probe := "simgpu-probe meminfo; cat /etc/ld.so.preload 2>/dev/null; echo END"
	out, err := h.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=burstable",
		"--env", "DETSHARE_MEMORY=512MiB", imageRef, "inst-ctr", "sh", "-c", probe)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(h.dir, "containerd.log"))
		t.Fatalf("ctr tenant through the installed shim: %v: %s\n%s", err, out, tail(string(log), 2000))
	}
	if got := meminfoTotal(t, out); got != 512<<20 || !strings.Contains(out, "libdetshare.so") {
		t.Errorf("ctr tenant sees %d bytes (want its 512 MiB quota) and preload %q", got, out)
	}
	out, err = h.docker("run", "--rm", "--runtime", "detshare", "--network", "none", "-e", "DETSHARE_TIER=burstable",
		"-e", "DETSHARE_MEMORY=256MiB", dockerImage, "sh", "-c", probe)
	if err != nil {
		t.Fatalf("docker tenant through the installed runtime: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != 256<<20 {
		t.Errorf("docker tenant sees %d bytes, want its 256 MiB quota", got)
	}
	if ready, rep := h.doctor(t); !ready {
		t.Errorf("doctor on a working install is not ready:\n%s", rep)
	}

	// The library goes missing: doctor fails, a tenant asking for DetShare is refused and leaves nothing behind.
	if err := os.Rename(h.lib, h.lib+".moved"); err != nil {
		t.Fatal(err)
	}
	defer os.Rename(h.lib+".moved", h.lib)
	if ready, rep := h.doctor(t); ready || !strings.Contains(rep, `"containerd library"`) {
		t.Errorf("doctor without the library:\n%s", rep)
	}
	out, err = h.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=latency-critical",
		"--env", "DETSHARE_SMS=32", imageRef, "inst-refused", "sh", "-c", "echo RAN")
	if err == nil || strings.Contains(out, "RAN") || !strings.Contains(out, "libdetshare.so not readable") || !strings.Contains(out, "fail_open") {
		t.Errorf("tenant without the library (default policy): %v: %s; want a create error naming the library and fail_open", err, out)
	}
	h.ctr("containers", "rm", "inst-refused")
	if ids, _ := h.ctr("tasks", "ls", "-q"); strings.TrimSpace(ids) != "" {
		t.Errorf("tasks left after the refusal: %s", ids)
	}
	out, err = h.docker("run", "--rm", "--runtime", "detshare", "--network", "none", "-e", "DETSHARE_TIER=latency-critical",
		dockerImage, "echo", "RAN")
	if err == nil || strings.Contains(out, "RAN") || !strings.Contains(out, "libdetshare.so not readable") {
		t.Errorf("docker tenant without the library (default policy): %v: %s", err, out)
	}

	// The host chose fail-open: the tenants run unshared and say so on their stderr; the event is counted.
	conf, _ := os.ReadFile(h.conf)
	if err := os.WriteFile(h.conf, []byte(strings.Replace(string(conf), "fail_open = false", "fail_open = true", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(h.conf, conf, 0o644)
	out, err = h.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=latency-critical",
		"--env", "DETSHARE_SMS=32", imageRef, "inst-open", "sh", "-c", "simgpu-probe meminfo")
	if err != nil || !strings.Contains(out, "detshare: WARNING: this tenant asked for DetShare but runs WITHOUT it") {
		t.Errorf("ctr tenant under fail_open: %v: %q; want it to run with the WARNING line", err, out)
	} else if got := meminfoTotal(t, out); got != simTotal {
		t.Errorf("fail-open tenant sees %d bytes, want the whole simulated GPU", got)
	}
	out, err = h.docker("run", "--rm", "--runtime", "detshare", "--network", "none", "-e", "DETSHARE_TIER=latency-critical",
		dockerImage, "sh", "-c", "echo RAN")
	if err != nil || !strings.Contains(out, "RAN") || !strings.Contains(out, "detshare: WARNING") {
		t.Errorf("docker tenant under fail_open: %v: %q; want it to run with the WARNING line", err, out)
	}
	if data, _ := os.ReadFile(filepath.Join(h.runDir, "fail-open.log")); strings.Count(string(data), "\n") != 2 {
		t.Errorf("fail-open events recorded:\n%s", data)
	}
}

// unregister runs `detshare uninstall` and checks the engine configs are as they were.
func (h *installedHost) unregister(t *testing.T, env []string) {
	out, err := run(time.Minute, env, filepath.Join(h.bin, "detshare"), "uninstall", "all",
		"--docker-config", h.daemonJSON, "--containerd-config", h.ctrCfg)
	if err != nil {
		t.Errorf("detshare uninstall: %v: %s", err, out)
	}
	h.checkUnregistered(t)
}

func (h *installedHost) checkUnregistered(t *testing.T) {
	if got, _ := os.ReadFile(h.ctrCfg); strings.TrimSpace(string(got)) != strings.TrimSpace(h.ctrOrig) {
		t.Errorf("containerd config after uninstall:\n%s", got)
	}
	var a, b any
	got, _ := os.ReadFile(h.daemonJSON)
	json.Unmarshal(got, &a)
	json.Unmarshal([]byte(h.dockerOrig), &b)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("daemon.json after uninstall: %s", got)
	}
	for _, f := range []string{h.ctrCfg, h.daemonJSON} {
		if _, err := os.Stat(f + ".detshare-backup"); err == nil {
			t.Errorf("%s.detshare-backup left", f)
		}
	}
}

// noDetShareFiles asserts the fresh state: no DetShare file under root's FHS locations.
func noDetShareFiles(t *testing.T, root string) {
	t.Helper()
	for _, p := range []string{"usr/bin/detshare", "usr/bin/containerd-shim-detshare-v1", "usr/bin/containerd-shim-detshare-v1-serve",
		"usr/bin/detshare-runtime", "usr/bin/detshare-hook", "usr/lib/detshare", "usr/local/bin/detshare",
		"usr/local/bin/containerd-shim-detshare-v1", "usr/local/bin/containerd-shim-detshare-v1-serve",
		"usr/local/bin/detshare-runtime", "usr/local/bin/detshare-hook", "usr/local/lib/detshare", "etc/detshare",
		"usr/lib/systemd/system/detshare-sched.service", "etc/systemd/system/detshare-sched.service"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Fatalf("%s exists: this test starts from a host without DetShare files", filepath.Join(root, p))
		}
	}
}

func TestMakeInstallThenEnginesRunTenantsAndDoctor(t *testing.T) {
	e := need(t)
	dir, err := os.MkdirTemp("/tmp", "dsinst-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dest := filepath.Join(dir, "dest")
	noDetShareFiles(t, dest)
	if out, err := run(10*time.Minute, nil, "make", "-C", e.repo, "install", "DESTDIR="+dest); err != nil {
		t.Fatalf("make install: %v\n%s", err, tail(out, 3000))
	}
	bin := filepath.Join(dest, "usr/local/bin")
	h := newInstalledHost(t, e, dir, bin, filepath.Join(dest, "usr/local/lib/detshare/libdetshare.so"),
		filepath.Join(dest, "etc/detshare/config.toml"), func(h *installedHost) {
			for _, eng := range [][]string{{"containerd", "--config", h.ctrCfg}, {"docker", "--config", h.daemonJSON}} {
				out, err := run(time.Minute, h.engineEnv, filepath.Join(bin, "detshare"), append([]string{"install"}, eng...)...)
				if err != nil {
					t.Fatalf("detshare install %s: %v: %s", eng[0], err, out)
				}
				if !strings.Contains(out, "+ ") || !strings.Contains(out, bin) {
					t.Errorf("detshare install %s does not say what it added (%s):\n%s", eng[0], bin, out)
				}
			}
		})
	defer h.stop()
	h.start(t)
	h.exercise(t)
	h.stop()
	h.ctrd, h.dockerd = nil, nil
	h.unregister(t, h.engineEnv)
	if out, err := run(time.Minute, nil, "make", "-C", e.repo, "uninstall", "DESTDIR="+dest); err != nil {
		t.Errorf("make uninstall: %v\n%s", err, out)
	}
	var left []string
	filepath.Walk(dest, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("files left after make uninstall: %v", left)
	}
}

// The .deb installs into / for real (dpkg -i), registers with the private engine configs named by
// DETSHARE_CONTAINERD_CONFIG / DETSHARE_DOCKER_CONFIG in its postinst, and dpkg --purge unregisters and removes
// everything.
func TestDebPackageInstallsRegistersAndPurges(t *testing.T) {
	e := need(t)
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Fatal("dpkg-deb not found: the .deb test needs Debian's dpkg")
	}
	if out, _ := run(time.Minute, nil, "dpkg-query", "-W", "-f", "${Status}", "detshare"); strings.Contains(out, "installed") {
		t.Fatalf("the detshare package is already installed on this host (%s): this test starts without it", out)
	}
	noDetShareFiles(t, "/")
	if out, err := run(10*time.Minute, nil, "make", "-C", e.repo, "deb"); err != nil {
		t.Fatalf("make deb: %v\n%s", err, tail(out, 3000))
	}
	debs, _ := filepath.Glob(filepath.Join(e.build, "deb", "detshare_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb built %v", debs)
	}
	dir, err := os.MkdirTemp("/tmp", "dsdeb-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var dpkgEnv []string
	purge := func() {
		out, err := run(5*time.Minute, dpkgEnv, "dpkg", "--purge", "detshare")
		if err != nil {
			t.Errorf("dpkg --purge: %v: %s", err, out)
		}
	}
	h := newInstalledHost(t, e, dir, "/usr/bin", "/usr/lib/detshare/libdetshare.so", "/etc/detshare/config.toml",
		func(h *installedHost) {
			dpkgEnv = append(installedEnv("/usr/bin", h.runDir, "/etc/detshare/config.toml"),
				"DETSHARE_CONTAINERD_CONFIG="+h.ctrCfg, "DETSHARE_DOCKER_CONFIG="+h.daemonJSON)
			out, err := run(5*time.Minute, dpkgEnv, "dpkg", "-i", debs[0])
			if err != nil {
				purge()
				t.Fatalf("dpkg -i: %v: %s", err, out)
			}
			if !strings.Contains(out, "runtime_path = \"/usr/bin/containerd-shim-detshare-v1\"") || !strings.Contains(out, "/usr/bin/detshare-runtime") {
				t.Errorf("postinst did not register both engines:\n%s", out)
			}
		})
	purged := false
	defer func() {
		h.stop()
		if !purged {
			purge()
		}
	}()
	h.start(t)
	h.exercise(t)
	h.stop()
	h.ctrd, h.dockerd = nil, nil
	purge()
	purged = true
	h.checkUnregistered(t)
	noDetShareFiles(t, "/")
}
