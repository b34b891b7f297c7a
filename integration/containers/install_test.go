package containers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/testenv"
)

// `detshare install containerd` on a config like Debian's stock one (no runtimes of its own) must leave a containerd
// whose CRI plugin loads and knows the detshare handler; uninstall restores the file.
// Under containerd 2.x (DETSHARE_CONTAINERD_BIN) it runs on a version 2 file (migrated by containerd) and on a version 3
// one.
func TestInstallContainerdThenDaemonLoadsCRI(t *testing.T) {
	e := need(t)
	seeds := map[string]string{"version2": "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"" + pauseRef + "\"\n"}
	if e.ctrdMajor >= 2 {
		seeds["version3"] = "version = 3\n\n[plugins]\n  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = \"" + pauseRef + "\"\n"
	}
	for name, orig := range seeds {
		t.Run(name, func(t *testing.T) { installContainerdThenLoadCRI(t, e, orig) })
	}
}

func installContainerdThenLoadCRI(t *testing.T, e *env, orig string) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(orig), 0o644)
	detshare := filepath.Join(e.bin, "detshare")
	// The version is asked from the containerd under test (DETSHARE_CONTAINERD_BIN's first on the daemons' PATH).
	dropIn := filepath.Join(dir, "conf.d", "detshare.toml") // version 3: never the host's /etc/containerd/conf.d
	if out, err := run(30*time.Second, e.daemonEnv, detshare, "install", "containerd", "--config", cfg, "--drop-in", dropIn); err != nil {
		t.Fatalf("install: %v: %s", err, out)
	}
	sock := filepath.Join(dir, "c.sock")
	logf, _ := os.Create(filepath.Join(dir, "log"))
	defer logf.Close()
	cmd := exec.Command(e.ctrdBin, "--config", cfg, "--root", filepath.Join(dir, "root"), "--state", filepath.Join(dir, "state"),
		"--address", sock)
	cmd.Stdout, cmd.Stderr = logf, logf
	d, err := testenv.StartDaemon(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		testenv.StopDaemon(d)
		testenv.UnmountUnder(dir)
	}()
	var plugins string
	for i := 0; i < 100 && !d.Exited(); i++ {
		if plugins, err = run(10*time.Second, nil, e.ctrBin, "--address", sock, "plugins", "ls"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	criOK := false
	for _, line := range strings.Split(plugins, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri" && f[len(f)-1] == "ok" {
			criOK = true
		}
	}
	if !criOK {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		t.Fatalf("CRI plugin not loaded after detshare install:\n%s\n%s", plugins, tail(string(log), 2000))
	}
	dump, _ := run(10*time.Second, nil, e.ctrdBin, "--config", cfg, "config", "dump")
	dump = strings.ReplaceAll(dump, "'", `"`) // containerd 2.x dumps TOML strings single-quoted
	// The handler passes the device plugin's allocation (the container's ceiling) and, by default, no pod
	// annotations: a pod cannot pick its own quota (issue 29; --pod-annotations opts in).
	if !strings.Contains(dump, `runtime_type = "io.containerd.detshare.v1"`) || !strings.Contains(dump, `"alloc.detshare.io/*"`) {
		t.Errorf("config dump lacks the detshare handler:\n%s", dump)
	}
	if strings.Contains(dump, `pod_annotations = ["detshare.io/*"]`) {
		t.Errorf("pod annotations passed by default:\n%s", dump)
	}
	if out, err := run(30*time.Second, nil, detshare, "uninstall", "containerd", "--containerd-config", cfg, "--drop-in", dropIn); err != nil {
		t.Fatalf("uninstall: %v: %s", err, out)
	}
	if got, _ := os.ReadFile(cfg); string(got) != orig {
		t.Errorf("uninstall did not restore the file:\n%s", got)
	}
}

// `detshare install docker` gives a dockerd that offers the detshare runtime.
func TestInstallDockerThenDaemonOffersRuntime(t *testing.T) {
	e := needDocker(t) // our containerd and image are up; this starts a second dockerd on a fresh config
	dir := t.TempDir()
	cfg := filepath.Join(dir, "daemon.json")
	os.WriteFile(cfg, []byte(`{"deprecated-key-path": "`+filepath.Join(dir, "key.json")+`"}`), 0o644)
	if out, err := run(30*time.Second, nil, filepath.Join(e.bin, "detshare"), "install", "docker", "--config", cfg,
		"--runtime", filepath.Join(e.bin, "detshare-runtime")); err != nil {
		t.Fatalf("install: %v: %s", err, out)
	}
	sock := filepath.Join(dir, "d.sock")
	logf, _ := os.Create(filepath.Join(dir, "log"))
	defer logf.Close()
	cmd := exec.Command("dockerd", "--config-file", cfg, "--data-root", filepath.Join(dir, "root"),
		"--exec-root", filepath.Join(dir, "exec"), "--pidfile", filepath.Join(dir, "pid"), "-H", "unix://"+sock,
		"--containerd", e.ctrSock, "--containerd-namespace", "detshare-install-test",
		"--containerd-plugins-namespace", "detshare-install-test-plugins",
		"--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false")
	cmd.Stdout, cmd.Stderr = logf, logf
	d, err := testenv.StartDaemon(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		testenv.StopDaemon(d)
		testenv.UnmountUnder(dir)
	}()
	var info string
	for i := 0; i < 200 && !d.Exited(); i++ {
		if info, err = run(10*time.Second, nil, "docker", "-H", "unix://"+sock, "info", "--format", "{{json .Runtimes}}"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(info, `"detshare"`) || !strings.Contains(info, filepath.Join(e.bin, "detshare-runtime")) {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		t.Fatalf("dockerd does not offer the detshare runtime: %s\n%s", info, tail(string(log), 2000))
	}
}
