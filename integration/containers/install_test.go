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
func TestInstallContainerdThenDaemonLoadsCRI(t *testing.T) {
	e := need(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	orig := "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"" + pauseRef + "\"\n"
	os.WriteFile(cfg, []byte(orig), 0o644)
	detshare := filepath.Join(e.bin, "detshare")
	if out, err := run(30*time.Second, nil, detshare, "install", "containerd", "--config", cfg); err != nil { // version asked from the real containerd
		t.Fatalf("install: %v: %s", err, out)
	}
	sock := filepath.Join(dir, "c.sock")
	logf, _ := os.Create(filepath.Join(dir, "log"))
	defer logf.Close()
	cmd := exec.Command("containerd", "--config", cfg, "--root", filepath.Join(dir, "root"), "--state", filepath.Join(dir, "state"),
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
		if plugins, err = run(10*time.Second, nil, "ctr", "--address", sock, "plugins", "ls"); err == nil {
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
	dump, _ := run(10*time.Second, nil, "containerd", "--config", cfg, "config", "dump")
	if !strings.Contains(dump, `runtime_type = "io.containerd.detshare.v1"`) || !strings.Contains(dump, `"detshare.io/*"`) {
		t.Errorf("config dump lacks the detshare handler:\n%s", dump)
	}
	if out, err := run(30*time.Second, nil, detshare, "uninstall", "containerd", "--containerd-config", cfg); err != nil {
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
