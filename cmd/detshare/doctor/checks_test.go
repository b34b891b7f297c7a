package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeEnv is a host whose detshare is installed in <root>/bin with its library in <root>/lib (build-tree layout), with
// the given tools on PATH and the given configuration files.
func fakeEnv(t *testing.T, tools map[string]string, files map[string]string, drv DriverInfo) Env {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.MkdirAll(filepath.Join(root, "lib"), 0o755)
	for _, b := range []string{"detshare", "containerd-shim-detshare-v1", "containerd-shim-detshare-v1-serve", "detshare-runtime"} {
		os.WriteFile(filepath.Join(root, "bin", b), []byte("#!/bin/sh\n"), 0o755)
	}
	return Env{
		LibDir:           filepath.Join(root, "lib"),
		BinDir:           filepath.Join(root, "bin"),
		DockerConfig:     "/etc/docker/daemon.json",
		ContainerdConfig: "/etc/containerd/config.toml",
		RunDir:           filepath.Join(root, "run"),
		LookPath: func(n string) (string, error) {
			if _, ok := tools[n]; ok {
				return "/usr/bin/" + n, nil
			}
			return "", errors.New("not found")
		},
		Output: func(n string, _ ...string) (string, error) { return tools[n], nil },
		ReadFile: func(p string) ([]byte, error) {
			if b, ok := files[p]; ok {
				return []byte(b), nil
			}
			return nil, os.ErrNotExist
		},
		Driver: func() DriverInfo { return drv },
	}
}

func find(r *Report, name string) Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return Check{}
}

func TestNoDriverIsNotReadyAndSaysHowToFix(t *testing.T) {
	env := fakeEnv(t, nil, nil, DriverInfo{Err: errors.New("libnvidia-ml.so.1 not found")})
	r := Run(env)
	if r.Ready {
		t.Fatal("host without a driver reported ready")
	}
	c := find(r, "nvidia driver")
	if c.Status != Fail || !strings.Contains(c.Found, "no NVIDIA driver") || !strings.Contains(c.Fix, "--simulated-gpu") {
		t.Fatalf("driver check = %+v", c)
	}
}

func TestReadyHostWithDriverLibraryAndContainerd(t *testing.T) {
	env := fakeEnv(t,
		map[string]string{"runc": "runc version 1.1.5", "containerd": "containerd github.com/containerd/containerd 1.6.20",
			"nvidia-cuda-mps-control": "", "nvidia-cuda-mps-server": ""},
		nil,
		DriverInfo{DriverVersion: "580.159.04", CUDAVersion: 13000, GPUs: []GPU{{Index: 0, Name: "NVIDIA H100", UUID: "GPU-1", MemBytes: 80 << 30}}})
	env.ReadFile = fakeFiles(map[string]string{"/etc/containerd/config.toml": `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare]
  runtime_type = "io.containerd.detshare.v1"
  runtime_path = "` + filepath.Join(env.BinDir, "containerd-shim-detshare-v1") + `"`})
	if err := os.WriteFile(filepath.Join(env.LibDir, "libdetshare.so"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run(env)
	if !r.Ready {
		var b bytes.Buffer
		r.WriteText(&b)
		t.Fatalf("expected ready:\n%s", b.String())
	}
	if c := find(r, "nvidia driver"); c.Status != OK || !strings.Contains(c.Found, "CUDA 13.0") {
		t.Fatalf("driver = %+v", c)
	}
	if c := find(r, "containerd"); c.Status != OK || !strings.Contains(c.Found, "1.6.20") || !strings.Contains(c.Found, "registered") {
		t.Fatalf("containerd = %+v", c)
	}
	if c := find(r, "docker"); c.Status != Info {
		t.Fatalf("absent docker should be informational: %+v", c)
	}
}

func TestOldDriverWarnsAboutGreenContextStreams(t *testing.T) {
	env := fakeEnv(t, nil, nil, DriverInfo{DriverVersion: "550.54", CUDAVersion: 12040, GPUs: []GPU{{Name: "x"}}})
	c := find(Run(env), "nvidia driver")
	if c.Status != Warn || !strings.Contains(c.Fix, "12.5") {
		t.Fatalf("CUDA 12.4 driver check = %+v", c)
	}
}

func TestMissingMPSFallsBackToTemporalWarning(t *testing.T) {
	env := fakeEnv(t, nil, nil, DriverInfo{CUDAVersion: 13000, GPUs: []GPU{{Name: "x"}}})
	c := find(Run(env), "mps")
	if c.Status != Warn || !strings.Contains(c.Found, "temporal") {
		t.Fatalf("mps = %+v", c)
	}
}

func TestDockerRegistrationIsReadFromDaemonJSON(t *testing.T) {
	tools := map[string]string{"dockerd": "Docker version 20.10.24+dfsg1, build 297e128"}
	unreg := Run(fakeEnv(t, tools, map[string]string{"/etc/docker/daemon.json": `{"runtimes":{}}`}, DriverInfo{}))
	if c := find(unreg, "docker"); c.Status != Warn || !strings.Contains(c.Fix, "detshare install docker") {
		t.Fatalf("unregistered docker = %+v", c)
	}
	env := fakeEnv(t, tools, nil, DriverInfo{})
	env.ReadFile = fakeFiles(map[string]string{"/etc/docker/daemon.json": `{"runtimes":{"detshare":{"path":"` + filepath.Join(env.BinDir, "detshare-runtime") + `"}}}`})
	reg := Run(env)
	if c := find(reg, "docker"); c.Status != OK || !strings.Contains(c.Found, "20.10.24") {
		t.Fatalf("registered docker = %+v", c)
	}
	if c := find(reg, "docker runtime binary"); c.Status != OK {
		t.Fatalf("registered wrapper = %+v", c)
	}
	if find(unreg, "runtime registration").Status != Fail || unreg.Ready {
		t.Fatal("docker present and no engine registered reported ready")
	}
}

func TestSimulatedGPUSelection(t *testing.T) {
	env := fakeEnv(t, nil, nil, DriverInfo{Err: errors.New("must not be asked")})
	env.Simulated = true
	r := Run(env)
	if c := find(r, "simulated gpu"); c.Status != Fail || !strings.Contains(c.Fix, "make install") || !strings.Contains(c.Fix, "--lib-dir") {
		t.Fatalf("unbuilt simulated gpu = %+v", c)
	}
	if find(r, "nvidia driver").Name != "" {
		t.Fatal("the driver was checked although the simulated GPU is selected")
	}
	os.MkdirAll(filepath.Join(env.LibDir, "simgpu"), 0o755)
	os.WriteFile(filepath.Join(env.LibDir, "simgpu", "libcuda.so.1"), nil, 0o644)
	r = Run(env)
	if r.Ready || find(r, "libdetshare (run)").Status != Fail {
		t.Fatalf("simulated GPU without the library reported ready: %+v", r)
	}
	os.WriteFile(filepath.Join(env.LibDir, "libdetshare.so"), nil, 0o644)
	r = Run(env)
	if !r.Ready || !r.SimulatedGPU {
		t.Fatalf("built simulated gpu should be ready: %+v", r)
	}
	var b bytes.Buffer
	r.WriteText(&b)
	if !strings.Contains(b.String(), "simulated GPU (a test double)") {
		t.Fatalf("text report does not say the GPU is simulated:\n%s", b.String())
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || !back.SimulatedGPU || !back.Ready {
		t.Fatalf("json round trip: %v %+v", err, back)
	}
}

func fakeFiles(files map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		if b, ok := files[p]; ok {
			return []byte(b), nil
		}
		return nil, os.ErrNotExist
	}
}

// The chain is followed from the registration: a registered shim that is missing, or a library missing next to the
// registered binary (where it is bind-mounted from), fails the host even with the simulated GPU; the library next to
// detshare alone does not make the host ready.
func TestChainFailsOnMissingShimOrLibraryEvenWithSimulatedGPU(t *testing.T) {
	tools := map[string]string{"runc": "runc version 1.1.5", "containerd": "containerd 1.6.20"}
	env := fakeEnv(t, tools, nil, DriverInfo{})
	env.Simulated = true
	os.MkdirAll(filepath.Join(env.LibDir, "simgpu"), 0o755)
	os.WriteFile(filepath.Join(env.LibDir, "simgpu", "libcuda.so.1"), nil, 0o644)
	os.WriteFile(filepath.Join(env.LibDir, "libdetshare.so"), nil, 0o644)
	other := t.TempDir() // an install elsewhere: bin/ with the shim, no lib/
	os.MkdirAll(filepath.Join(other, "bin"), 0o755)
	shim := filepath.Join(other, "bin", "containerd-shim-detshare-v1")
	os.WriteFile(shim, []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(other, "bin", "containerd-shim-detshare-v1-serve"), []byte("#!/bin/sh\n"), 0o755)
	env.ReadFile = fakeFiles(map[string]string{"/etc/containerd/config.toml": "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.detshare]\n  runtime_type = \"io.containerd.detshare.v1\"\n  runtime_path = \"" + shim + "\"\n"})
	r := Run(env)
	if c := find(r, "containerd library"); r.Ready || c.Status != Fail || !strings.Contains(c.Found, filepath.Join(other, "lib")) {
		t.Fatalf("library missing where the shim mounts it from: ready=%v %+v", r.Ready, c)
	}
	os.MkdirAll(filepath.Join(other, "lib", "detshare"), 0o755)
	os.WriteFile(filepath.Join(other, "lib", "detshare", "libdetshare.so"), nil, 0o644)
	if r := Run(env); !r.Ready {
		var b bytes.Buffer
		r.WriteText(&b)
		t.Fatalf("complete chain not ready:\n%s", b.String())
	}
	// the front without its serving shim beside it
	os.Remove(filepath.Join(other, "bin", "containerd-shim-detshare-v1-serve"))
	if r := Run(env); r.Ready || find(r, "containerd runtime binary").Status != Fail ||
		!strings.Contains(find(r, "containerd runtime binary").Found, "containerd-shim-detshare-v1-serve") {
		t.Fatalf("serving shim missing but ready: %+v", find(r, "containerd runtime binary"))
	}
	os.Remove(shim)
	if r := Run(env); r.Ready || find(r, "containerd runtime binary").Status != Fail {
		t.Fatalf("registered shim missing but ready: %+v", find(r, "containerd runtime binary"))
	}
}

func TestSchedulerAndFailOpenChecks(t *testing.T) {
	env := fakeEnv(t, nil, nil, DriverInfo{})
	if c := checkScheduler(env); c.Status != OK || !strings.Contains(c.Found, "on demand") {
		t.Errorf("startable scheduler: %+v", c)
	}
	env.SchedulerRunning = func(string) bool { return true }
	if c := checkScheduler(env); c.Status != OK || !strings.Contains(c.Found, "running") {
		t.Errorf("running scheduler: %+v", c)
	}
	env.SchedulerRunning = nil
	os.Remove(filepath.Join(env.BinDir, "detshare"))
	if c := checkScheduler(env); c.Status != Fail {
		t.Errorf("no scheduler and nothing to start it: %+v", c)
	}
	os.MkdirAll(env.RunDir, 0o755)
	os.WriteFile(filepath.Join(env.RunDir, "fail-open.log"), []byte(`{"time":"t","id":"c9","reason":"table full"}`+"\n"), 0o644)
	if c := checkFailOpens(env); c.Status != Warn || !strings.Contains(c.Found, "c9") || !strings.Contains(c.Found, "table full") {
		t.Errorf("fail-open events: %+v", c)
	}
}

// TestExclusiveOffWarns: doctor warns while [mps] exclusive is off (issue 27: a tenant process can leave MPS), is
// content when it is on, and fails naming the file when the configuration cannot be read.
func TestExclusiveOffWarns(t *testing.T) {
	for _, c := range []struct {
		name, file string
		want       Status
		found      string
	}{
		{"defaults", "", Warn, "mps.exclusive = false"},
		{"on", "[mps]\nexclusive = true\n", OK, "EXCLUSIVE_PROCESS"},
		{"mps off", "[mps]\nenable = false\n", Warn, "mps.enable = false"},
		{"bad", "[mps]\nexclusiv = true\n", Fail, "exclusiv"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := map[string]string{}
			if c.file != "" {
				files["/etc/detshare/config.toml"] = c.file
			}
			env := fakeEnv(t, nil, files, DriverInfo{Err: errors.New("no driver")})
			env.HostConfig = "/etc/detshare/config.toml"
			got := find(Run(env), "mps exclusive")
			if got.Status != c.want || !strings.Contains(got.Found, c.found) {
				t.Errorf("mps exclusive check: %+v, want %s and %q", got, c.want, c.found)
			}
		})
	}
}
