package testenv

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var containerdVersion = regexp.MustCompile(`\bv?([0-9]+)\.[0-9]+\.[0-9]+`)

// ContainerdMajor reads the major version from `containerd --version` ("containerd github.com/... v2.2.9 <commit>"
// or Debian's "containerd containerd.io 1.6.20~ds1 ...").
func ContainerdMajor(version string) (int, error) {
	m := containerdVersion.FindStringSubmatch(version)
	if m == nil {
		return 0, fmt.Errorf("no version in %q", version)
	}
	return strconv.Atoi(m[1])
}

// ContainerdConfig describes a private containerd with the DetShare runtime handler "detshare".
type ContainerdConfig struct {
	Major                int // containerd's major version: 1 renders config version 2, 2 renders version 3
	Root, State, Socket  string
	SandboxImage         string
	CNIBin, CNIConf      string
	PodAnnotations       []string // pod annotations the handler passes to the OCI spec
	ContainerAnnotations []string // container annotations (for instance a device plugin's) it passes
}

// Render returns the configuration file. The CI sandbox forbids lowering oom_score_adj (CRI gives pause containers
// -998), so restrict_oom_score_adj keeps it at containerd's own.
func (c ContainerdConfig) Render() string {
	list := func(v []string) string {
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	if c.Major >= 2 {
		return fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.detshare]
      runtime_type = "io.containerd.detshare.v1"
      pod_annotations = %s
      container_annotations = %s
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
`, c.Root, c.State, c.Socket, c.SandboxImage, list(c.PodAnnotations), list(c.ContainerAnnotations), c.CNIBin, c.CNIConf)
	}
	return fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.detshare]
      runtime_type = "io.containerd.detshare.v1"
      pod_annotations = %s
      container_annotations = %s
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, c.Root, c.State, c.Socket, c.SandboxImage, list(c.PodAnnotations), list(c.ContainerAnnotations), c.CNIBin, c.CNIConf)
}
