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
	CDISpecDirs          []string // when set, CDI is enabled with specs from these directories (containerd 1.7+)
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
	// Version 3 splits the CRI plugin into images and runtime plugins; the runtime handlers read the same in both.
	head := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
`, c.Root, c.State, c.Socket, c.SandboxImage)
	cri, cniBin := `plugins."io.containerd.grpc.v1.cri"`, fmt.Sprintf("bin_dir = %q", c.CNIBin)
	if c.Major >= 2 {
		head = fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
`, c.Root, c.State, c.Socket, c.SandboxImage)
		cri, cniBin = `plugins."io.containerd.cri.v1.runtime"`, fmt.Sprintf("bin_dirs = [%q]", c.CNIBin)
	}
	if len(c.CDISpecDirs) > 0 {
		head += fmt.Sprintf("  enable_cdi = true\n  cdi_spec_dirs = %s\n", list(c.CDISpecDirs))
	}
	return head + fmt.Sprintf(`  restrict_oom_score_adj = true
  [%[1]s.containerd]
    default_runtime_name = "runc"
    [%[1]s.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [%[1]s.containerd.runtimes.detshare]
      runtime_type = "io.containerd.detshare.v1"
      pod_annotations = %[2]s
      container_annotations = %[3]s
  [%[1]s.cni]
    %[4]s
    conf_dir = %[5]q
`, cri, list(c.PodAnnotations), list(c.ContainerAnnotations), cniBin, c.CNIConf)
}
