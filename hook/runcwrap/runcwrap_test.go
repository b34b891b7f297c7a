package runcwrap

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook/specmod"
	"github.com/detshare/detshare/internal/simgpu"
)

func TestMain(m *testing.M) {
	if os.Getenv("RUNCWRAP_TEST_MAIN") == "1" { // the test binary doubles as detshare-runtime
		os.Exit(Main(os.Args[1:], tenant.Registrar{DiscoverGPUs: simgpu.Discover},
			func(string) cdi.Source { return cdi.Simulated{} }, "test"))
	}
	os.Exit(m.Run())
}

func TestParse(t *testing.T) {
	cases := []struct {
		args []string
		want Invocation
	}{
		{[]string{"--root", "/run/runc", "--log", "/l.json", "--log-format=json", "create", "--bundle", "/b",
			"--pid-file", "/p", "--console-socket=/s", "abc"},
			Invocation{Own: map[string]string{}, Command: "create", ID: "abc", Bundle: "/b", Log: "/l.json", LogFormat: "json",
				RuncArgs: []string{"--root", "/run/runc", "--log", "/l.json", "--log-format=json", "create", "--bundle", "/b",
					"--pid-file", "/p", "--console-socket=/s", "abc"}}},
		// Docker's runtimeArgs come first; "create" after --bundle is the bundle, not the verb.
		{[]string{"--detshare-run-dir", "/rd", "--detshare-fail-closed", "--detshare-runc=/usr/sbin/runc", "--systemd-cgroup",
			"create", "-b", "create", "--no-pivot", "id1"},
			Invocation{Own: map[string]string{FlagRunDir: "/rd", FlagFailClosed: "true", FlagRunc: "/usr/sbin/runc"},
				Command: "create", ID: "id1", Bundle: "create",
				RuncArgs: []string{"--systemd-cgroup", "create", "-b", "create", "--no-pivot", "id1"}}},
		{[]string{"--root", "/r", "delete", "--force", "id2"},
			Invocation{Own: map[string]string{}, Command: "delete", ID: "id2",
				RuncArgs: []string{"--root", "/r", "delete", "--force", "id2"}}},
		{[]string{"--root", "/r", "state", "id3"},
			Invocation{Own: map[string]string{}, Command: "state", RuncArgs: []string{"--root", "/r", "state", "id3"}}},
		{[]string{"--version"}, Invocation{Own: map[string]string{}, RuncArgs: []string{"--version"}}},
		{[]string{"run", "--bundle=/x", "--", "id4"},
			Invocation{Own: map[string]string{}, Command: "run", ID: "id4", Bundle: "/x", RuncArgs: []string{"run", "--bundle=/x", "--", "id4"}}},
	}
	for _, c := range cases {
		got, err := Parse(c.args)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.args, err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q)\n got %+v\nwant %+v", c.args, got, c.want)
		}
	}
	if _, err := Parse([]string{"--detshare-bogus", "create"}); err == nil || !strings.Contains(err.Error(), "--detshare-bogus") ||
		!strings.Contains(err.Error(), FlagRunDir) {
		t.Errorf("unknown own flag: err = %v, want it named with the allowed flags", err)
	}
	if _, err := Parse([]string{"--root", "/r", "", "--detshare-runc", "x"}); err == nil ||
		!strings.Contains(err.Error(), "argument 3 is empty") {
		t.Errorf("empty subcommand: %v; want an error naming argument 3", err)
	}
	if _, err := Parse([]string{"--detshare-run-dir"}); err == nil || !strings.Contains(err.Error(), "needs a value") {
		t.Errorf("missing value: err = %v", err)
	}
}

func TestDockerLabels(t *testing.T) {
	root := t.TempDir()
	id := "0123abcd"
	os.MkdirAll(filepath.Join(root, "containers", id), 0o755)
	os.WriteFile(filepath.Join(root, "containers", id, "config.v2.json"),
		[]byte(`{"ID":"0123abcd","Config":{"Labels":{"detshare.io/tier":"burstable","x":"y"},"Image":"i"},"State":{}}`), 0o600)
	l, err := DockerLabels(root, id)
	if err != nil || l["detshare.io/tier"] != "burstable" {
		t.Fatalf("labels = %v, %v", l, err)
	}
	if l, err := DockerLabels(root, "other"); err != nil || l != nil {
		t.Errorf("missing record: %v, %v; want nil, nil", l, err)
	}
	if l, err := DockerLabels(root, "../../etc"); err != nil || l != nil {
		t.Errorf("path-like id read something: %v %v", l, err)
	}
}

type env struct {
	dir, runDir, bundle, argsFile, runc, log string
	baseEnv                                  []string
}

func setup(t *testing.T, spec string) env {
	t.Helper()
	d := t.TempDir()
	e := env{dir: d, runDir: filepath.Join(d, "run"), bundle: filepath.Join(d, "bundle"),
		argsFile: filepath.Join(d, "runc.args"), runc: filepath.Join(d, "fake-runc"), log: filepath.Join(d, "log.json")}
	os.MkdirAll(e.bundle, 0o755)
	os.WriteFile(filepath.Join(e.bundle, "config.json"), []byte(spec), 0o644)
	// The fake runc records its arguments and exits with $FAKE_RUNC_EXIT.
	os.WriteFile(e.runc, []byte("#!/bin/sh\necho \"$@\" >> "+e.argsFile+"\nexit ${FAKE_RUNC_EXIT:-0}\n"), 0o755)
	lib := filepath.Join(d, "libdetshare.so")
	os.WriteFile(lib, []byte("not a real library"), 0o644)
	hookBin := filepath.Join(d, "detshare-hook")
	os.WriteFile(hookBin, []byte("#!/bin/sh\n"), 0o755)
	e.baseEnv = append(os.Environ(), "RUNCWRAP_TEST_MAIN=1", "DETSHARE_SIMGPU=1", "DETSHARE_SIMGPU_SMS=132",
		"DETSHARE_SIMGPU_MEM=85899345920", "DETSHARE_LIB="+lib, "DETSHARE_HOOK="+hookBin)
	return e
}

func (e env) run(t *testing.T, extraEnv []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--detshare-runc", e.runc, "--detshare-run-dir", e.runDir,
		"--detshare-docker-root", filepath.Join(e.dir, "docker")}, args...)...)
	cmd.Env = append(append([]string{}, e.baseEnv...), extraEnv...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

func (e env) runcArgs() string { b, _ := os.ReadFile(e.argsFile); return strings.TrimSpace(string(b)) }

const plainSpec = `{"ociVersion":"1.0.2","process":{"args":["sh"],"env":["PATH=/bin"]},"root":{"path":"rootfs"},"x-unknown":1}`

func TestPassThroughVerbsExecRunc(t *testing.T) {
	e := setup(t, plainSpec)
	code, out := e.run(t, []string{"FAKE_RUNC_EXIT=7"}, "--root", "/r", "state", "c1")
	if code != 7 || e.runcArgs() != "--root /r state c1" {
		t.Fatalf("state: exit %d, runc got %q (%s); want 7 and the same args without own flags", code, e.runcArgs(), out)
	}
}

func TestCreateWithoutSettingsLeavesSpecUntouched(t *testing.T) {
	e := setup(t, plainSpec)
	code, out := e.run(t, nil, "create", "--bundle", e.bundle, "c1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	data, _ := os.ReadFile(filepath.Join(e.bundle, "config.json"))
	if string(data) != plainSpec {
		t.Errorf("spec changed for a container without DetShare settings:\n%s", data)
	}
	if e.runcArgs() != "create --bundle "+e.bundle+" c1" {
		t.Errorf("runc args %q", e.runcArgs())
	}
	if _, err := os.Stat(e.runDir); err == nil {
		t.Error("run directory created for a container without DetShare settings")
	}
}

func TestCreateRegistersEditsSpecAndDeleteDeregisters(t *testing.T) {
	spec := `{"ociVersion":"1.0.2","process":{"args":["sh"],"env":["PATH=/bin","DETSHARE_TIER=burstable","DETSHARE_SMS=16","DETSHARE_MEMORY=1GiB"]},"root":{"path":"rootfs"},"x-unknown":{"a":1}}`
	e := setup(t, spec)
	os.MkdirAll(filepath.Join(e.dir, "docker/containers/c1"), 0o755)
	os.WriteFile(filepath.Join(e.dir, "docker/containers/c1/config.v2.json"),
		[]byte(`{"Config":{"Labels":{"detshare.io/weight":"7"}}}`), 0o600)
	code, out := e.run(t, nil, "create", "--bundle", e.bundle, "c1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	res, ok, err := tenant.Lookup(e.runDir, "c1")
	if err != nil || !ok {
		t.Fatalf("c1 not registered: %v", err)
	}
	if res.Registration.SMs < 16 || res.Registration.MemLimit != 1<<30 || res.Registration.Weight != 7 {
		t.Errorf("registration %+v: want >=16 SMs, 1 GiB, weight 7 (from the Docker label)", res.Registration)
	}
	s, err := specmod.Load(filepath.Join(e.bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Annotations()[specmod.TenantIDAnnotation] != "c1" || len(s.Hooks("poststop")) != 0 || len(s.Mounts()) < 6 {
		t.Errorf("spec not edited: annotations %v, poststop %v, mounts %v", s.Annotations(), s.Hooks("poststop"), s.Mounts())
	}
	data, _ := os.ReadFile(filepath.Join(e.bundle, "config.json"))
	if !strings.Contains(string(data), `"x-unknown":{"a":1}`) {
		t.Errorf("unknown field lost: %s", data)
	}
	// The placed GPU's device node (the simulated GPU's, numbered as /dev/null) and its cgroup allow rule.
	devs := s.Devices()
	if len(devs) != 1 || devs[0] != (specmod.LinuxDevice{Path: "/dev/detshare-simgpu0", Type: "c", Major: 1, Minor: 3}) {
		t.Errorf("linux.devices = %+v, want the simulated GPU 0's node only", devs)
	}
	if !strings.Contains(string(data), `{"access":"rwm","allow":true,"major":1,"minor":3,"type":"c"}`) {
		t.Errorf("no device cgroup allow rule for the GPU node: %s", data)
	}
	code, out = e.run(t, nil, "delete", "c1")
	if code != 0 {
		t.Fatalf("delete exit %d: %s", code, out)
	}
	if _, ok, _ := tenant.Lookup(e.runDir, "c1"); ok {
		t.Error("c1 still registered after delete")
	}
	assertNoTenantFiles(t, e.runDir)
}

func assertNoTenantFiles(t *testing.T, runDir string) {
	t.Helper()
	for _, d := range []string{"clients", "tenants"} {
		ents, _ := os.ReadDir(filepath.Join(runDir, d))
		if len(ents) != 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s/ still holds %v", d, names)
		}
	}
}

func TestCreateBadQuotaFailsWithFieldInRuncLogAndLeavesNothing(t *testing.T) {
	cases := map[string]struct{ env, want string }{
		"unknown tier": {`"DETSHARE_TIER=gold"`, `DETSHARE_TIER="gold"`},
		"200% SMs":     {`"DETSHARE_TIER=burstable","DETSHARE_SMS=200%"`, `DETSHARE_SMS="200%"`},
		"memory > GPU": {`"DETSHARE_TIER=burstable","DETSHARE_MEMORY=100GiB"`, `DETSHARE_MEMORY="100GiB"`},
		// A misspelt key, alone (the container would run unshared) or beside valid ones (with a quota it did not ask
		// for): refused, the key named with the closest valid one.
		"misspelt key alone":     {`"DETSHARE_TEIR=burstable"`, `DETSHARE_TEIR="burstable" (env): not a DetShare key (did you mean DETSHARE_TIER?)`},
		"misspelt key and valid": {`"DETSHARE_TIER=burstable","DETSHARE_SMZ=8"`, `DETSHARE_SMZ="8" (env): not a DetShare key (did you mean DETSHARE_SMS?)`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			spec := `{"process":{"env":["PATH=/bin",` + c.env + `]},"root":{"path":"rootfs"}}`
			e := setup(t, spec)
			code, out := e.run(t, nil, "--log", e.log, "--log-format", "json", "create", "--bundle", e.bundle, "c1")
			if code == 0 {
				t.Fatal("create succeeded with a bad quota")
			}
			if !strings.Contains(out, c.want) {
				t.Errorf("stderr %q does not name %s", out, c.want)
			}
			logData, _ := os.ReadFile(e.log)
			var line map[string]string
			if err := json.Unmarshal(logData, &line); err != nil || line["level"] != "error" || !strings.Contains(line["msg"], c.want) {
				t.Errorf("runc log %q: want a JSON error line naming %s", logData, c.want)
			}
			if e.runcArgs() != "" {
				t.Errorf("runc was run: %q", e.runcArgs())
			}
			data, _ := os.ReadFile(filepath.Join(e.bundle, "config.json"))
			if string(data) != spec {
				t.Errorf("spec changed on refusal")
			}
			assertNoTenantFiles(t, e.runDir)
		})
	}
}

func TestCreateRollsBackWhenRuncFails(t *testing.T) {
	e := setup(t, `{"process":{"env":["DETSHARE_TIER=best-effort"]},"root":{"path":"rootfs"}}`)
	code, _ := e.run(t, []string{"FAKE_RUNC_EXIT=3"}, "create", "--bundle", e.bundle, "c1")
	if code != 3 {
		t.Fatalf("exit %d, want runc's 3", code)
	}
	if _, ok, _ := tenant.Lookup(e.runDir, "c1"); ok {
		t.Error("registration left after runc create failed")
	}
	assertNoTenantFiles(t, e.runDir)
}

func TestCreateRefusesOrFailsOpenLoudlyWhenDetShareIsBroken(t *testing.T) {
	e := setup(t, `{"process":{"env":["DETSHARE_TIER=latency-critical","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`)
	noLib := "DETSHARE_LIB=/nonexistent/libdetshare.so"
	code, out := e.run(t, []string{noLib, "DETSHARE_CONFIG=/nonexistent/config.toml"}, "create", "--bundle", e.bundle, "c1")
	if code == 0 || e.runcArgs() != "" || !strings.Contains(out, "refused") || !strings.Contains(out, "libdetshare.so not readable") {
		t.Fatalf("default: exit %d, runc %q (%s); want a refusal naming the library and runc not run", code, e.runcArgs(), out)
	}
	conf := filepath.Join(e.dir, "config.toml")
	os.WriteFile(conf, []byte("[tenants]\nfail_open = true\n"), 0o644)
	code, out = e.run(t, []string{noLib, "DETSHARE_CONFIG=" + conf}, "create", "--bundle", e.bundle, "c1")
	if code != 0 || e.runcArgs() == "" {
		t.Fatalf("fail_open: exit %d (%s): the container must run unshared", code, out)
	}
	if !strings.Contains(out, "detshare: WARNING: this tenant asked for DetShare but runs WITHOUT it") {
		t.Errorf("no notice on the container's stderr: %q", out)
	}
	code, out = e.run(t, []string{noLib, "DETSHARE_CONFIG=" + conf}, "--detshare-fail-closed", "create", "--bundle", e.bundle, "c2")
	if code == 0 || !strings.Contains(out, "DETSHARE_LIB") {
		t.Errorf("--detshare-fail-closed over fail_open: exit %d, %q; want a refusal naming DETSHARE_LIB", code, out)
	}
}

func TestRunVerbDeregistersWhenTheContainerIsGone(t *testing.T) {
	e := setup(t, `{"process":{"env":["DETSHARE_TIER=best-effort"]},"root":{"path":"rootfs"}}`)
	// The fake runc checks, while "running", that the container is registered.
	os.WriteFile(e.runc, []byte("#!/bin/sh\necho \"$@\" >> "+e.argsFile+"\ntest -e "+filepath.Join(e.runDir, "clients", "c1.page")+" || exit 9\n"), 0o755)
	code, out := e.run(t, nil, "run", "--bundle", e.bundle, "c1")
	if code != 0 {
		t.Fatalf("exit %d (9: not registered while running): %s", code, out)
	}
	if _, ok, _ := tenant.Lookup(e.runDir, "c1"); ok {
		t.Error("still registered after runc run returned")
	}
	assertNoTenantFiles(t, e.runDir)
}

// FuzzParse: no input panics, own flags never reach runc, and runc's arguments keep their order.
func FuzzParse(f *testing.F) {
	f.Add("--root\x00/r\x00create\x00--bundle\x00/b\x00id")
	f.Add("--detshare-run-dir=/x\x00--log\x00l\x00delete\x00--force\x00id")
	f.Add("--detshare-runc\x00")
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\x00")
		inv, err := Parse(args)
		if err != nil {
			return
		}
		if len(inv.RuncArgs) > len(args) {
			t.Fatalf("runc got more arguments than given: %q -> %q", args, inv.RuncArgs)
		}
		if inv.Command == "" {
			for _, a := range inv.RuncArgs {
				if strings.HasPrefix(a, "--detshare-") {
					t.Fatalf("own flag %q passed to runc", a)
				}
			}
		}
	})
}
