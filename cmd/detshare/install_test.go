package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

var fakeBins = map[string]string{}

// fakeBin is an executable file named name in a directory shared by the tests of this binary (removed by TestMain).
func fakeBin(t *testing.T, name string) string {
	t.Helper()
	if p, ok := fakeBins[name]; ok {
		return p
	}
	if fakeBinDir == "" {
		d, err := os.MkdirTemp("", "detshare-fakebin-")
		if err != nil {
			t.Fatal(err)
		}
		fakeBinDir = d
	}
	p := filepath.Join(fakeBinDir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	fakeBins[name] = p
	return p
}

var fakeBinDir string

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(append([]string{"detshare"}, args...))
	return out.String(), err
}

func readJSON(t *testing.T, p string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v\n%s", p, err, data)
	}
	return m
}

func TestInstallDocker2010IdempotentWithBackupAndUninstall(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "daemon.json")
	orig := `{"log-driver":"json-file","runtimes":{"nvidia":{"path":"nvidia-container-runtime"}},"data-root":"/data/docker","x-future":{"a":1}}`
	os.WriteFile(p, []byte(orig), 0o600)
	out, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", p, "--docker-version", "20.10.24")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(out, "systemctl restart docker") {
		t.Errorf("no restart advice: %s", out)
	}
	m := readJSON(t, p)
	rt := m["runtimes"].(map[string]any)
	ds := rt["detshare"].(map[string]any)
	if ds["path"] != fakeBin(t, "detshare-runtime") || rt["nvidia"] == nil || m["log-driver"] != "json-file" || m["x-future"] == nil {
		t.Errorf("daemon.json after install: %v", m)
	}
	if args, _ := ds["runtimeArgs"].([]any); len(args) != 2 || args[1] != "/data/docker" {
		t.Errorf("runtimeArgs %v: the wrapper must learn Docker's data-root", ds["runtimeArgs"])
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("mode changed to %v", st.Mode().Perm())
	}
	if b, _ := os.ReadFile(p + backupSuffix); string(b) != orig {
		t.Errorf("backup %q, want the original", b)
	}
	after, _ := os.ReadFile(p)
	out, err = runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", p, "--docker-version", "20.10")
	if again, _ := os.ReadFile(p); err != nil || !bytes.Equal(again, after) || !strings.Contains(out, "already up to date") {
		t.Errorf("second install changed the file or did not say so: %v %s", err, out)
	}
	if out, err := runCLI(t, "uninstall", "docker", "--docker-config", p); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	m = readJSON(t, p)
	if _, ok := m["runtimes"].(map[string]any)["detshare"]; ok || m["runtimes"].(map[string]any)["nvidia"] == nil {
		t.Errorf("after uninstall: %v", m)
	}
}

func TestInstallDocker24UsesShimAndDryRunChangesNothing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "daemon.json")
	out, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", p, "--docker-version", "Docker version 24.0.7, build afdd53b", "--dry-run")
	if err != nil || !strings.Contains(out, `"runtimeType": "`+fakeBin(t, "containerd-shim-detshare-v1")+`"`) {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if _, err := os.Stat(p); err == nil {
		t.Fatal("dry run wrote the file")
	}
	if out, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", p, "--docker-version", "24.0"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rt := readJSON(t, p)["runtimes"].(map[string]any)["detshare"].(map[string]any); rt["runtimeType"] != fakeBin(t, "containerd-shim-detshare-v1") || rt["path"] != nil {
		t.Errorf("Docker 24 entry %v", rt)
	}
}

func TestInstallBadInputNamesItAndChangesNothing(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "daemon.json")
	os.WriteFile(p, []byte(`{"runtimes": [}`), 0o644)
	if _, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", p, "--docker-version", "20.10"); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("broken daemon.json: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != `{"runtimes": [}` {
		t.Error("broken file was rewritten")
	}
	if _, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", p, "--docker-version", "latest"); err == nil || !strings.Contains(err.Error(), `--docker-version "latest"`) {
		t.Errorf("bad version: %v", err)
	}
	if _, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", filepath.Join(d, "x.json"), "--docker-version", "20.10", "--runtime", "rel/path"); err == nil || !strings.Contains(err.Error(), `--runtime "rel/path"`) {
		t.Errorf("relative runtime path: %v", err)
	}
	if _, err := runCLI(t, "uninstall", "podman"); err == nil || !strings.Contains(err.Error(), "docker, containerd, all") {
		t.Errorf("unknown engine: %v", err)
	}
	c := filepath.Join(d, "config.toml")
	os.WriteFile(c, []byte("[plugins.cri]\n  x = 1\n"), 0o644)
	if _, err := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", c, "--containerd-version", "1.6.20"); err == nil || !strings.Contains(err.Error(), "config version 1") {
		t.Errorf("version-1 config: %v", err)
	}
	os.WriteFile(c, []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.detshare]\n  runtime_type = \"x\"\n"), 0o644)
	if _, err := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", c, "--containerd-version", "1.6.20"); err == nil || !strings.Contains(err.Error(), "not written by detshare install") {
		t.Errorf("foreign detshare section: %v", err)
	}
}

const ctrdConfig16 = `# my containerd config
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9" # pinned
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true`

func TestInstallContainerd16KeepsTheFileAndUninstallRestoresIt(t *testing.T) {
	d := t.TempDir()
	c := filepath.Join(d, "config.toml")
	os.WriteFile(c, []byte(ctrdConfig16), 0o644)
	out, err := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", c, "--containerd-version", "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	data, _ := os.ReadFile(c)
	if !strings.HasPrefix(string(data), ctrdConfig16) {
		t.Errorf("original content not kept verbatim:\n%s", data)
	}
	var m map[string]any
	if _, err := toml.Decode(string(data), &m); err != nil {
		t.Fatalf("result does not parse: %v\n%s", err, data)
	}
	rt, _ := lookupPath(m, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "detshare")
	rtm, _ := rt.(map[string]any)
	// Container annotations carry the device plugin's allocation (k8s/deviceplugin); pods' annotations pass only
	// with --pod-annotations (TestInstallContainerdPodAnnotationsOptIn).
	if a, _ := rtm["container_annotations"].([]any); rtm["runtime_type"] != installShimType || len(a) != 1 || a[0] != "alloc.detshare.io/*" {
		t.Errorf("runtime section %v: want container_annotations = [\"alloc.detshare.io/*\"]", rt)
	}
	if _, ok := rtm["pod_annotations"]; ok {
		t.Errorf("runtime section %v passes pod annotations by default", rt)
	}
	if sc, _ := lookupPath(m, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "options", "SystemdCgroup"); sc != true {
		t.Error("existing runc options lost")
	}
	if out, _ := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", c, "--containerd-version", "1.6"); !strings.Contains(out, "already up to date") {
		t.Errorf("second install: %s", out)
	}
	if again, _ := os.ReadFile(c); !bytes.Equal(again, data) {
		t.Error("second install changed the file")
	}
	if ctrd, err := exec.LookPath("containerd"); err == nil { // the real daemon accepts the result
		dump, err := exec.Command(ctrd, "--config", c, "config", "dump").CombinedOutput()
		if err != nil || !strings.Contains(string(dump), `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare]`) ||
			!strings.Contains(string(dump), `runtime_type = "io.containerd.detshare.v1"`) {
			t.Errorf("containerd config dump: %v\n%s", err, dump)
		}
	}
	if out, err := runCLI(t, "uninstall", "containerd", "--containerd-config", c, "--drop-in", filepath.Join(d, "none.toml")); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if restored, _ := os.ReadFile(c); string(restored) != ctrdConfig16+"\n" && string(restored) != ctrdConfig16 {
		t.Errorf("uninstall did not restore the original:\n%q", restored)
	}
}

func TestInstallContainerd2DropInAndImports(t *testing.T) {
	d := t.TempDir()
	c := filepath.Join(d, "config.toml")
	drop := filepath.Join(d, "conf.d", "detshare.toml")
	os.WriteFile(c, []byte("version = 3\nroot = \"/var/lib/containerd\"\n\n[plugins.\"io.containerd.cri.v1.images\"]\n  snapshotter = \"overlayfs\"\n"), 0o644)
	for i := 0; i < 2; i++ {
		if out, err := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", c, "--drop-in", drop, "--containerd-version", "2.1.4"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	data, _ := os.ReadFile(c)
	if strings.Count(string(data), drop) != 1 || !strings.Contains(string(data), "snapshotter") {
		t.Errorf("main config:\n%s", data)
	}
	var m map[string]any
	dd, _ := os.ReadFile(drop)
	if _, err := toml.Decode(string(dd), &m); err != nil {
		t.Fatalf("drop-in: %v", err)
	}
	if rt, _ := lookupPath(m, "plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "detshare", "runtime_type"); rt != installShimType || m["version"] != int64(3) {
		t.Errorf("drop-in:\n%s", dd)
	}
	if out, err := runCLI(t, "uninstall", "containerd", "--containerd-config", c, "--drop-in", drop); err != nil || !strings.Contains(out, "removed") {
		t.Errorf("uninstall: %v %s", err, out)
	}
	if _, err := os.Stat(drop); err == nil {
		t.Error("drop-in left after uninstall")
	}
	if after, _ := os.ReadFile(c); strings.Contains(string(after), drop) {
		t.Errorf("imports still names the removed drop-in (containerd 2 would not start):\n%s", after)
	}
}

// configs/ ships the same snippets the installer writes.
func TestConfigsMatchTheInstaller(t *testing.T) {
	root := filepath.Join("..", "..", "configs")
	for file, ver := range map[string][2]int{"docker/daemon.json": {20, 10}, "docker/daemon-24.json": {24, 0}} {
		want, err := dockerInstall(nil, ver, defaultRuntimeBin, defaultShimBin)
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		json.Unmarshal(data, &a)
		json.Unmarshal(want, &b)
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if !bytes.Equal(ja, jb) {
			t.Errorf("configs/%s = %s, installer writes %s", file, ja, jb)
		}
	}
	for file, ver := range map[string]int{"containerd/config-v2-detshare.toml": 2, "containerd/conf.d-detshare.toml": 3} {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), runtimeBlock(ver)) {
			t.Errorf("configs/%s does not hold the installer's section:\n%s", file, runtimeBlock(ver))
		}
		var m map[string]any
		if _, err := toml.Decode(string(data), &m); err != nil {
			t.Errorf("configs/%s: %v", file, err)
		}
	}
	for file, stage := range map[string]string{"hooks.d/detshare-createcontainer.json": "createContainer", "hooks.d/detshare-poststop.json": "poststop"} {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		var h struct {
			Version string `json:"version"`
			Hook    struct {
				Path    string   `json:"path"`
				Args    []string `json:"args"`
				Timeout int      `json:"timeout"` // seconds; without it a hook blocked on the container's files hangs the create
			} `json:"hook"`
			When   map[string]any `json:"when"`
			Stages []string       `json:"stages"`
		}
		if err := json.Unmarshal(data, &h); err != nil {
			t.Fatalf("configs/%s: %v", file, err)
		}
		if h.Version != "1.0.0" || h.Hook.Path != "/usr/bin/detshare-hook" || len(h.Hook.Args) != 2 || h.Hook.Args[1] != stage ||
			len(h.Stages) != 1 || h.Stages[0] != stage || h.When["always"] != true || h.Hook.Timeout <= 0 || h.Hook.Timeout > 60 {
			t.Errorf("configs/%s: %+v", file, h)
		}
	}
	for _, file := range []string{"kubernetes/runtimeclass.yaml", "kubernetes/daemonset.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "\t") {
			t.Errorf("configs/%s has tabs (invalid YAML indentation)", file)
		}
	}
	rc, _ := os.ReadFile(filepath.Join(root, "kubernetes/runtimeclass.yaml"))
	if !strings.Contains(string(rc), "handler: "+installRuntimeName) {
		t.Error("RuntimeClass handler does not match the containerd runtime name")
	}
}

// A config that defines no runtimes (Debian's stock one) would lose containerd's built-in runc definition once a
// runtime is added, and the CRI plugin would refuse to load: the installer defines the default runtime too.
func TestInstallContainerdDefinesTheDefaultRuntimeWhenMissing(t *testing.T) {
	for _, c := range []struct {
		config, want string
	}{
		{"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"p\"\n", "runtimes.runc]"},
		{"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n", "runtimes.crun]"},
		{"", "runtimes.runc]"},
	} {
		out, err := ctrdV2Install([]byte(c.config), ctrdHandler{shim: defaultShimBin})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("config %q: no %s in\n%s", c.config, c.want, out)
		}
		var m map[string]any
		if _, err := toml.Decode(string(out), &m); err != nil {
			t.Errorf("result does not parse: %v", err)
		}
		if again, _ := ctrdV2Install(out, ctrdHandler{shim: defaultShimBin}); !bytes.Equal(again, out) {
			t.Errorf("second install changed the file")
		}
	}
	out, _ := ctrdV2Install([]byte(ctrdConfig16), ctrdHandler{shim: defaultShimBin})
	if strings.Count(string(out), "runtimes.runc]") != 1 {
		t.Error("a config that defines runc got a second definition")
	}
}

// A binary that does not exist is never registered: nothing is written.
func TestInstallRefusesMissingBinaries(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "daemon.json")
	_, err := runCLI(t, "install", "docker", "--config", p, "--docker-version", "20.10", "--runtime", filepath.Join(d, "nope", "detshare-runtime"))
	if err == nil || !strings.Contains(err.Error(), "not an executable file") || !strings.Contains(err.Error(), "--runtime") {
		t.Errorf("missing runtime: %v", err)
	}
	nonExec := filepath.Join(d, "containerd-shim-detshare-v1")
	os.WriteFile(nonExec, []byte("x"), 0o644)
	c := filepath.Join(d, "config.toml")
	_, err = runCLI(t, "install", "containerd", "--config", c, "--containerd-version", "1.6", "--shim", nonExec)
	if err == nil || !strings.Contains(err.Error(), "not an executable file") {
		t.Errorf("non-executable shim: %v", err)
	}
	for _, f := range []string{p, c} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s written although the binary is missing", f)
		}
	}
}

// The existing config's version decides the dialect, whatever containerd --version says: a version-3 config gets
// the containerd 2.x plugin name (io.containerd.cri.v1.runtime) and runtime_path names the shim; a version-2 config
// gets io.containerd.grpc.v1.cri. Install prints the lines it added; uninstall removes what install created.
func TestInstallContainerdDetectsConfigVersion3(t *testing.T) {
	d := t.TempDir()
	c := filepath.Join(d, "config.toml")
	drop := filepath.Join(d, "conf.d", "detshare.toml")
	os.WriteFile(c, []byte("version = 3\n"), 0o644)
	shim := fakeBin(t, "containerd-shim-detshare-v1")
	out, err := runCLI(t, "install", "containerd", "--config", c, "--drop-in", drop, "--containerd-version", "1.6.20", "--shim", shim)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	dd, _ := os.ReadFile(drop)
	var m map[string]any
	if _, err := toml.Decode(string(dd), &m); err != nil {
		t.Fatalf("drop-in: %v\n%s", err, dd)
	}
	if p, _ := lookupPath(m, "plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "detshare", "runtime_path"); p != shim {
		t.Errorf("version-3 config: drop-in\n%s\nwant plugin io.containerd.cri.v1.runtime with runtime_path %s", dd, shim)
	}
	if strings.Contains(string(dd), "io.containerd.grpc.v1.cri") {
		t.Error("containerd 1.x plugin name in a version-3 drop-in")
	}
	if !strings.Contains(out, "+ imports = [") || !strings.Contains(out, `+   runtime_path = "`+shim+`"`) {
		t.Errorf("install did not say what it added:\n%s", out)
	}
	if out, err := runCLI(t, "uninstall", "containerd", "--containerd-config", c, "--drop-in", drop); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if after, _ := os.ReadFile(c); strings.TrimSpace(string(after)) != "version = 3" {
		t.Errorf("after uninstall:\n%s", after)
	}
	if _, err := os.Stat(c + backupSuffix); err == nil {
		t.Error("backup equal to the restored file left behind")
	}
	c2 := filepath.Join(d, "v2.toml")
	os.WriteFile(c2, []byte("version = 2\n"), 0o644)
	if out, err := runCLI(t, "install", "containerd", "--config", c2, "--containerd-version", "2.1", "--shim", shim); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if data, _ := os.ReadFile(c2); !strings.Contains(string(data), `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare`) {
		t.Errorf("version-2 config:\n%s", data)
	}
	fresh := filepath.Join(d, "fresh", "config.toml")
	if out, err := runCLI(t, "install", "containerd", "--config", fresh, "--containerd-version", "1.6", "--shim", shim); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := runCLI(t, "uninstall", "containerd", "--containerd-config", fresh, "--drop-in", drop); err != nil || !strings.Contains(out, "detshare had created it") {
		t.Errorf("uninstall of a created config: %v %s", err, out)
	}
	if _, err := os.Stat(fresh); err == nil {
		t.Error("config created by install left after uninstall")
	}
}

// Configuration files as administrators write them: odd key order, tabs, four-space indents, no or several final
// newlines. install then uninstall must give each back byte for byte.
const (
	oddDaemonJSON = "{\n\t\"zeta\": true,\n\t\"runtimes\": {\n\t\t\"nvidia\": { \"path\": \"nvidia-container-runtime\" }\n\t},\n\t\"alpha\":   [1, 2],\n\t\"data-root\": \"/srv/docker\"\n}"
	oddDaemonNoRT = "{\n    \"log-opts\": {\"max-size\": \"10m\"},\n    \"exec-opts\": [\"native.cgroupdriver=systemd\"]\n}\n\n"
	oddCtrd16     = "version = 2\n# site config\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n      default_runtime_name = \"runc\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n\n\n"
	oddCtrd2      = "version = 3\n    root = '/srv/containerd'\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = \"overlayfs\""
)

func TestInstallThenUninstallRestoresConfigsByteForByte(t *testing.T) {
	for _, c := range []struct {
		name, daemon, ctrd, ctrdVer string
	}{
		{"docker 20.10 with runtimes, containerd 1.6", oddDaemonJSON, oddCtrd16, "1.6.20"},
		{"daemon.json without runtimes, containerd 2", oddDaemonNoRT, oddCtrd2, "2.1.4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			dj, ct, drop := filepath.Join(d, "daemon.json"), filepath.Join(d, "config.toml"), filepath.Join(d, "conf.d", "detshare.toml")
			os.WriteFile(dj, []byte(c.daemon), 0o644)
			os.WriteFile(ct, []byte(c.ctrd), 0o644)
			if out, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"),
				"--config", dj, "--docker-version", "20.10.24"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if out, err := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", ct, "--drop-in", drop,
				"--containerd-version", c.ctrdVer); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if m := readJSON(t, dj); m["runtimes"].(map[string]any)["detshare"] == nil {
				t.Fatalf("install did not register in daemon.json: %v", m)
			}
			out, err := runCLI(t, "uninstall", "--docker-config", dj, "--containerd-config", ct, "--drop-in", drop)
			if err != nil {
				t.Fatalf("uninstall: %v: %s", err, out)
			}
			for p, want := range map[string]string{dj: c.daemon, ct: c.ctrd} {
				if got, _ := os.ReadFile(p); string(got) != want {
					t.Errorf("%s after install+uninstall:\n%q\nwant the original byte for byte:\n%q\n%s", filepath.Base(p), got, want, out)
				}
				if _, err := os.Stat(p + backupSuffix); err == nil {
					t.Errorf("%s left behind", p+backupSuffix)
				}
			}
			if _, err := os.Stat(drop); err == nil {
				t.Error("drop-in left behind")
			}
		})
	}
}

// When the administrator changed the file after install, uninstall removes only detshare's entries and keeps
// every other byte of the file as it is now (their change included).
func TestUninstallAfterAnEditRemovesOnlyOurEntries(t *testing.T) {
	d := t.TempDir()
	dj, ct := filepath.Join(d, "daemon.json"), filepath.Join(d, "config.toml")
	os.WriteFile(dj, []byte(oddDaemonJSON), 0o644)
	os.WriteFile(ct, []byte(oddCtrd16), 0o644)
	if out, err := runCLI(t, "install", "docker", "--runtime", fakeBin(t, "detshare-runtime"), "--shim", fakeBin(t, "containerd-shim-detshare-v1"),
		"--config", dj, "--docker-version", "20.10.24"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := runCLI(t, "install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", ct, "--containerd-version", "1.6"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	edit := func(p, old, new string) {
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), old) {
			t.Fatalf("%s lacks %q:\n%s", p, old, b)
		}
		os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0o644)
	}
	edit(dj, "\t\"zeta\": true,\n", "\t\"zeta\": true,\n\t\"log-level\":\"debug\",\n")
	edit(ct, "# site config\n", "# site config\n  root = \"/srv/ctrd\"\n")
	if out, err := runCLI(t, "uninstall", "--docker-config", dj, "--containerd-config", ct, "--drop-in", filepath.Join(d, "none.toml")); err != nil {
		t.Fatalf("uninstall: %v: %s", err, out)
	}
	wantDJ := strings.Replace(oddDaemonJSON, "\t\"zeta\": true,\n", "\t\"zeta\": true,\n\t\"log-level\":\"debug\",\n", 1)
	wantCT := strings.Replace(oddCtrd16, "# site config\n", "# site config\n  root = \"/srv/ctrd\"\n", 1)
	if got, _ := os.ReadFile(dj); string(got) != wantDJ {
		t.Errorf("daemon.json:\n%q\nwant\n%q", got, wantDJ)
	}
	if got, _ := os.ReadFile(ct); string(got) != wantCT {
		t.Errorf("config.toml:\n%q\nwant\n%q", got, wantCT)
	}
}

// Pods' own annotations reach the handler only when asked for (--pod-annotations), and never the allocation's keys:
// a pod's quota is otherwise its allocation, lowered only by its own environment (issue 29).
func TestInstallContainerdPodAnnotationsOptIn(t *testing.T) {
	for _, opt := range []bool{false, true} {
		d := t.TempDir()
		c := filepath.Join(d, "config.toml")
		drop := filepath.Join(d, "conf.d", "detshare.toml")
		os.WriteFile(c, []byte("version = 3\n"), 0o644)
		args := []string{"install", "containerd", "--shim", fakeBin(t, "containerd-shim-detshare-v1"), "--config", c, "--drop-in", drop, "--containerd-version", "2.2.9"}
		if opt {
			args = append(args, "--pod-annotations")
		}
		if out, err := runCLI(t, args...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var m map[string]any
		dd, _ := os.ReadFile(drop)
		if _, err := toml.Decode(string(dd), &m); err != nil {
			t.Fatalf("drop-in: %v", err)
		}
		rt, _ := lookupPath(m, "plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "detshare")
		rtm, _ := rt.(map[string]any)
		pods, passed := rtm["pod_annotations"].([]any)
		if passed != opt || opt && (len(pods) != 1 || pods[0] != "detshare.io/*") {
			t.Errorf("--pod-annotations=%v: pod_annotations = %v (present %v)\n%s", opt, pods, passed, dd)
		}
		if ctr, _ := rtm["container_annotations"].([]any); len(ctr) != 1 || ctr[0] != "alloc.detshare.io/*" {
			t.Errorf("container_annotations = %v, want [alloc.detshare.io/*]", ctr)
		}
	}
}
