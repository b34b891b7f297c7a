package containers

import (
	"strings"
	"testing"
)

// The in-container check of the GPU device: the simulated GPU (a test double) is visible only through its device
// node (DETSHARE_SIMGPU_DEVICE_DIR=/dev, as a real GPU through /dev/nvidia<N>), so cuInit succeeds in a container
// only when DetShare's GPU edit put /dev/detshare-simgpu0 there, a character device numbered as the host node.
const gpuScript = "stat -c 'node=%F %t:%T' /dev/detshare-simgpu0 2>&1; ls /dev | grep -c detshare-simgpu | sed 's/^/nodes=/'; simgpu-probe info 2>&1; echo rc=$?"

func checkGPUDevice(t *testing.T, engine, out string) {
	t.Helper()
	if !strings.Contains(out, "node=character special file 1:3") || !strings.Contains(out, "nodes=1") {
		t.Errorf("%s: the DetShare container has not exactly its GPU's device node:\n%s", engine, out)
	}
	if !strings.Contains(out, `"cmd":"info"`) || !strings.Contains(out, "rc=0") || strings.Contains(out, "CUDA_ERROR_NO_DEVICE") {
		t.Errorf("%s: the DetShare container cannot use its simulated GPU:\n%s", engine, out)
	}
}

func checkNoGPUDevice(t *testing.T, engine, out string) {
	t.Helper()
	if !strings.Contains(out, "CUDA_ERROR_NO_DEVICE") || !strings.Contains(out, "nodes=0") {
		t.Errorf("%s: a container without DetShare saw a GPU device (want CUDA_ERROR_NO_DEVICE):\n%s", engine, out)
	}
}

// Through the containerd shim: a DetShare container gets its simulated GPU's node; a plain one none.
func TestCtrGPUDeviceInjected(t *testing.T) {
	e := need(t)
	id := "ds-ctr-gpudev"
	out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_SIMGPU_DEVICE_DIR=/dev",
		"--env", "DETSHARE_TIER=best-effort", imageRef, id, "sh", "-c", gpuScript)
	if err != nil {
		t.Fatalf("ctr run: %v: %s", err, out)
	}
	checkGPUDevice(t, "shim", out)
	e.assertNoLeak(t, id)
	out, err = e.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_SIMGPU_DEVICE_DIR=/dev",
		imageRef, id+"-plain", "sh", "-c", gpuScript)
	if err != nil {
		t.Fatalf("ctr run (plain): %v: %s", err, out)
	}
	checkNoGPUDevice(t, "shim", out)
}

// Through the runc wrapper (docker run --runtime=detshare): the same.
func TestDockerGPUDeviceInjected(t *testing.T) {
	e := needDocker(t)
	out, err := e.docker("run", "--rm", "--runtime=detshare", "--network", "none", "-e", "DETSHARE_SIMGPU_DEVICE_DIR=/dev",
		"-e", "DETSHARE_TIER=best-effort", dockerImage, "sh", "-c", gpuScript)
	if err != nil {
		t.Fatalf("docker run: %v: %s", err, out)
	}
	checkGPUDevice(t, "runc wrapper", out)
	out, err = e.docker("run", "--rm", "--runtime=detshare", "--network", "none", "-e", "DETSHARE_SIMGPU_DEVICE_DIR=/dev",
		dockerImage, "sh", "-c", gpuScript)
	if err != nil {
		t.Fatalf("docker run (plain): %v: %s", err, out)
	}
	checkNoGPUDevice(t, "runc wrapper", out)
}
