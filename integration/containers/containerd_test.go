package containers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/detshare/detshare/integration/testenv"
)

// pickContainerd chooses the containerd under test: DETSHARE_CONTAINERD_BIN names a directory holding containerd,
// ctr and containerd-shim-runc-v2 (for instance containerd v2.2.9 built by integration/kubernetes/build-components.sh);
// without it the tests run Debian's containerd from PATH.
func (e *env) pickContainerd() error {
	e.ctrdBin, e.ctrBin = "containerd", "ctr"
	if d := os.Getenv("DETSHARE_CONTAINERD_BIN"); d != "" {
		e.ctrdBin, e.ctrBin = filepath.Join(d, "containerd"), filepath.Join(d, "ctr")
	}
	for _, tool := range []string{e.ctrdBin, e.ctrBin} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install containerd from Debian (.ci/run does) or set DETSHARE_CONTAINERD_BIN: %w", tool, err)
		}
	}
	out, err := run(10*time.Second, nil, e.ctrdBin, "--version")
	if err != nil {
		return fmt.Errorf("%s --version: %v: %s", e.ctrdBin, err, out)
	}
	if e.ctrdMajor, err = testenv.ContainerdMajor(out); err != nil {
		return fmt.Errorf("%s: %w", e.ctrdBin, err)
	}
	return nil
}

// containerdConfig is the daemon's configuration (version 2 for containerd 1.x, 3 for 2.x) with the DetShare
// runtime handler passing detshare.io/* pod annotations and alloc.detshare.io/* container annotations (the device
// plugin's allocation, as kubelet passes it).
func (e *env) containerdConfig() string {
	return testenv.ContainerdConfig{Major: e.ctrdMajor, Root: filepath.Join(e.dir, "ctrd-root"),
		State: filepath.Join(e.dir, "ctrd-state"), Socket: e.ctrSock, SandboxImage: pauseRef,
		CNIBin: filepath.Join(e.dir, "cni-bin"), CNIConf: filepath.Join(e.dir, "cni-conf"),
		PodAnnotations: []string{"detshare.io/*"}, ContainerAnnotations: []string{"alloc.detshare.io/*"}}.Render()
}
