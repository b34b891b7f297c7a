package testenv

import (
	"strings"
	"testing"
)

func TestContainerdMajor(t *testing.T) {
	for in, want := range map[string]int{
		"containerd github.com/containerd/containerd/v2 v2.2.9 ":            2,
		"containerd containerd.io 1.6.20~ds1 1.6.20~ds1-1+deb12u1":          1,
		"containerd github.com/containerd/containerd v1.7.35 abcdef0123456": 1,
	} {
		if got, err := ContainerdMajor(in); err != nil || got != want {
			t.Errorf("ContainerdMajor(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ContainerdMajor("containerd dev"); err == nil {
		t.Error("no version: want an error")
	}
}

func TestContainerdConfigVersions(t *testing.T) {
	c := ContainerdConfig{Root: "/r", State: "/s", Socket: "/c.sock", SandboxImage: "pause:t", CNIBin: "/b", CNIConf: "/f",
		ContainerAnnotations: []string{"detshare.io/*"}}
	c.Major = 2
	v3 := c.Render()
	for _, want := range []string{"version = 3", `[plugins."io.containerd.cri.v1.images".pinned_images]`, `sandbox = "pause:t"`,
		`runtime_type = "io.containerd.detshare.v1"`, `container_annotations = ["detshare.io/*"]`, `pod_annotations = []`, `bin_dirs = ["/b"]`} {
		if !strings.Contains(v3, want) {
			t.Errorf("version 3 config lacks %q:\n%s", want, v3)
		}
	}
	c.Major = 1
	if v2 := c.Render(); !strings.Contains(v2, "version = 2") || !strings.Contains(v2, `sandbox_image = "pause:t"`) {
		t.Errorf("version 2 config:\n%s", v2)
	}
}
