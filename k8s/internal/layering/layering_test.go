// Package layering checks the Kubernetes module's imports with the main module's rules (internal/layering.Layers):
// its plugins are glue over cgroupgpu and internal/ and may not import the scheduler (sched/), only its binaries
// (k8s/cmd, k8s/tools) may, and no production package may import the test folder integration/.
package layering

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/layering"
)

// TestImportsPointDown lists every package of the Kubernetes module and fails on any production import that the
// main module's Layers refuse.
func TestImportsPointDown(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := layering.List(root)
	if err != nil {
		t.Fatal(err)
	}
	var plugins int
	for _, p := range pkgs {
		if !strings.HasPrefix(p.Path, layering.Module+"/k8s/") {
			t.Fatalf("go list in %s lists %s, outside the Kubernetes module", root, p.Path)
		}
		if strings.HasSuffix(p.Path, "/deviceplugin") || strings.HasSuffix(p.Path, "/dra") {
			plugins++
		}
	}
	if plugins != 2 {
		t.Fatalf("go list in %s did not list the device plugin and the DRA plugin: %v", root, pkgs)
	}
	for _, b := range layering.Check(pkgs) {
		t.Error(b)
	}
}
