package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// containerd executes the shim binary three times per container (start, the serving shim, delete); the front does
// start and delete, so every package it links costs each container start twice (BENCHMARKS.md, "Issue 28:
// container start with a front binary for start/delete"). It must stay a small binary: no containerd (its shim
// library and runc manager are what the front replaces), no grpc or ttrpc, no TOML/YAML parser, no net stack, no
// DetShare code beyond the deregistration (cgroupgpu/tenant).
func TestFrontLinksNoContainerd(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	seen := map[string]bool{}
	for _, p := range deps {
		seen[p] = true
	}
	if !seen["github.com/detshare/detshare/shimv2/front"] || !seen["github.com/detshare/detshare/cgroupgpu/tenant"] {
		t.Fatalf("go list -deps did not list the front and the deregistration: %s", out)
	}
	for _, p := range deps {
		for _, bad := range []string{"github.com/containerd/", "google.golang.org/grpc", "github.com/BurntSushi/toml",
			"gopkg.in/yaml", "github.com/detshare/detshare/shimv2", "github.com/detshare/detshare/hook",
			"github.com/cyphar/", "google.golang.org/protobuf/reflect", "google.golang.org/protobuf/proto"} {
			if p == bad || strings.HasPrefix(p, bad) && p != "github.com/detshare/detshare/shimv2/front" {
				t.Errorf("the front links %s", p)
			}
		}
		switch p {
		case "net", "net/http", "crypto/tls", "html/template", "text/template":
			t.Errorf("the front links %s", p)
		}
	}
}

// -v and --help answer without the serving shim.
func TestOwnFlags(t *testing.T) {
	var b bytes.Buffer
	if !ownFlag([]string{"-v"}, &b) || !strings.HasPrefix(b.String(), name+" version ") {
		t.Errorf("-v: %q", b.String())
	}
	b.Reset()
	if !ownFlag([]string{"--help"}, &b) || !strings.Contains(b.String(), "containerd-shim-detshare-v1-serve") {
		t.Errorf("--help does not name the serving shim: %q", b.String())
	}
	if ownFlag([]string{"-namespace", "x", "start"}, &b) {
		t.Error("containerd's invocation taken for --help/--version")
	}
}
