package containers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
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
	if e.ctrdMajor, err = containerdMajor(out); err != nil {
		return fmt.Errorf("%s: %w", e.ctrdBin, err)
	}
	return nil
}

var containerdVersion = regexp.MustCompile(`\bv?([0-9]+)\.[0-9]+\.[0-9]+`)

// containerdMajor reads the major version from `containerd --version` ("containerd github.com/... v2.2.9 <commit>"
// or Debian's "containerd containerd.io 1.6.20~ds1 ...").
func containerdMajor(version string) (int, error) {
	m := containerdVersion.FindStringSubmatch(version)
	if m == nil {
		return 0, fmt.Errorf("no version in %q", version)
	}
	return strconv.Atoi(m[1])
}

// containerdConfig is the daemon's configuration: version 2 for containerd 1.x, version 3 (CRI split into
// io.containerd.cri.v1.images and io.containerd.cri.v1.runtime) for containerd 2.x. Both register the DetShare
// runtime handler with the same options.
func (e *env) containerdConfig() string {
	root, state := filepath.Join(e.dir, "ctrd-root"), filepath.Join(e.dir, "ctrd-state")
	cniBin, cniConf := filepath.Join(e.dir, "cni-bin"), filepath.Join(e.dir, "cni-conf")
	if e.ctrdMajor >= 2 {
		return fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
  # The CI sandbox forbids lowering oom_score_adj (CRI gives pause containers -998): keep it at containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.detshare]
      runtime_type = "io.containerd.detshare.v1"
      pod_annotations = ["detshare.io/*"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
`, root, state, e.ctrSock, pauseRef, cniBin, cniConf)
	}
	return fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # The CI sandbox forbids lowering oom_score_adj (CRI gives pause containers -998): keep it at containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare]
      runtime_type = "io.containerd.detshare.v1"
      pod_annotations = ["detshare.io/*"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, root, state, e.ctrSock, pauseRef, cniBin, cniConf)
}
