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

func fakeEnv(t *testing.T, tools map[string]string, files map[string]string, drv DriverInfo) Env {
	t.Helper()
	return Env{
		LibDir: t.TempDir(),
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
		map[string]string{"/etc/containerd/config.toml": `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare]
  runtime_type = "io.containerd.detshare.v1"`},
		DriverInfo{DriverVersion: "580.159.04", CUDAVersion: 13000, GPUs: []GPU{{Index: 0, Name: "NVIDIA H100", UUID: "GPU-1", MemBytes: 80 << 30}}})
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
	reg := Run(fakeEnv(t, tools, map[string]string{"/etc/docker/daemon.json": `{"runtimes":{"detshare":{"path":"/usr/bin/detshare-runtime"}}}`}, DriverInfo{}))
	if c := find(reg, "docker"); c.Status != OK || !strings.Contains(c.Found, "20.10.24") {
		t.Fatalf("registered docker = %+v", c)
	}
}

func TestSimulatedGPUSelection(t *testing.T) {
	env := fakeEnv(t, nil, nil, DriverInfo{Err: errors.New("must not be asked")})
	env.Simulated = true
	r := Run(env)
	if c := find(r, "simulated gpu"); c.Status != Fail || !strings.Contains(c.Fix, "make build") {
		t.Fatalf("unbuilt simulated gpu = %+v", c)
	}
	if find(r, "nvidia driver").Name != "" {
		t.Fatal("the driver was checked although the simulated GPU is selected")
	}
	os.MkdirAll(filepath.Join(env.LibDir, "simgpu"), 0o755)
	os.WriteFile(filepath.Join(env.LibDir, "simgpu", "libcuda.so.1"), nil, 0o644)
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
