package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/detshare/detshare/internal/ociimage"
)

// WorkloadImage writes dir/workload.tar, the image detshare-e2e:test: busybox, simgpu-probe and the simulated GPU's
// libcuda (a test double) from the build directory, with the shared libraries they need.
func WorkloadImage(dir, build string) (string, error) {
	files := []ociimage.File{
		{Path: "bin/busybox", Src: "/bin/busybox", Mode: 0o755},
		{Path: "usr/local/bin/simgpu-probe", Src: filepath.Join(build, "tests/simgpu-probe"), Mode: 0o755},
		{Path: "usr/lib/simgpu/libcuda.so.1", Src: filepath.Join(build, "lib/simgpu/libcuda.so.1"), Mode: 0o755},
	}
	for _, tool := range []string{"sh", "cat", "sleep", "echo", "grep", "ls", "true", "test", "stat", "touch"} {
		files = append(files, ociimage.File{Path: "bin/" + tool, Link: "busybox"})
	}
	libs, err := ociimage.SharedLibs(filepath.Join(build, "tests/simgpu-probe"), filepath.Join(build, "lib/simgpu/libcuda.so.1"),
		filepath.Join(build, "lib/libdetshare.so"))
	if err != nil {
		return "", err
	}
	for _, l := range libs {
		files = append(files, ociimage.File{Path: strings.TrimPrefix(l, "/"), Src: l, Mode: 0o755})
	}
	cfg := map[string]any{"Env": []string{"PATH=/usr/local/bin:/bin", "LD_LIBRARY_PATH=/usr/lib/simgpu",
		"DETSHARE_SIMGPU_SMS=132"}, "Cmd": []string{"/bin/sh"}}
	return ociimage.WriteImage(filepath.Join(dir, "workload.tar"), "detshare-e2e:test", files, cfg)
}

// PauseImage writes dir/pause.tar, the sandbox image detshare-pause:test (a static C pause built with gcc).
func PauseImage(dir string) (string, error) {
	src := filepath.Join(dir, "pause.c")
	bin := filepath.Join(dir, "pause")
	code := `#include <signal.h>
#include <unistd.h>
static void done(int s) { (void)s; _exit(0); }
int main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }
`
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "gcc", "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc -static pause: %v: %s", err, out)
	}
	return ociimage.WriteImage(filepath.Join(dir, "pause.tar"), "detshare-pause:test", []ociimage.File{{Path: "pause", Src: bin, Mode: 0o755}},
		map[string]any{"Cmd": []string{"/pause"}})
}
