package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/cdi"
)

// `detshare cdi spec --root` prints the edit generated from a host's driver files (a fixture root: GPU 1 is
// minor 0) as a CDI spec, and refuses unknown GPUs and formats naming the allowed values.
func TestCDISpecFromDriverFiles(t *testing.T) {
	root := t.TempDir()
	for _, n := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"} {
		os.MkdirAll(filepath.Join(root, "dev"), 0o755)
		os.Symlink("/dev/null", filepath.Join(root, "dev", n))
	}
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(s), 0o644)
	}
	write("proc/driver/nvidia/gpus/0000:19:00.0/information", "GPU UUID: \t GPU-aaaa\nDevice Minor: \t 1\n")
	write("proc/driver/nvidia/gpus/0000:3b:00.0/information", "GPU UUID: \t GPU-bbbb\nDevice Minor: \t 0\n")
	write("usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "ELF")
	os.Symlink("libcuda.so.580.95.05", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libcuda.so.1"))
	out, err := captureRun(t, "cdi", "spec", "--root", root, "--gpu", "GPU-bbbb", "--hook", "/opt/detshare/bin/detshare-hook")
	if err != nil {
		t.Fatal(err)
	}
	s, err := cdi.Parse([]byte(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	e, ok := s.Device("GPU-bbbb")
	if !ok || s.Kind != cdi.Kind || cdi.GPUNode(e) != "/dev/nvidia0" || len(e.Mounts) != 2 || len(e.Hooks) != 1 ||
		e.Hooks[0].Path != "/opt/detshare/bin/detshare-hook" {
		t.Errorf("spec:\n%s", out)
	}
	if _, ok := s.Device("1"); !ok {
		t.Errorf("no device named by the index:\n%s", out)
	}
	if _, err := captureRun(t, "cdi", "spec", "--root", root, "--gpu", "7"); err == nil || !strings.Contains(err.Error(), "GPU-aaaa") {
		t.Errorf("unknown GPU: %v", err)
	}
	if _, err := captureRun(t, "cdi", "spec", "--root", root, "--format", "xml"); err == nil || !strings.Contains(err.Error(), "yaml, json") {
		t.Errorf("bad format: %v", err)
	}
}
