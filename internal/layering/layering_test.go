package layering

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestImportsPointDown lists every package of the module with `go list` and fails on any production import that
// points up (or sideways) in Layers, crosses the wings, or takes test support (integration/). Test files may import
// test support from above (integration/simgpu). k8s/internal/layering checks the Kubernetes module the same way.
func TestImportsPointDown(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := List(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 30 {
		t.Fatalf("go list found only %d packages in %s: %v", len(pkgs), root, pkgs)
	}
	for _, b := range Check(pkgs) {
		t.Error(b)
	}
}

// TestCheckFindsUpwardImports: the check itself catches the folder cycle this layout removed (sched/ensure
// importing cgroupgpu/tenant), an import into the contract's floor from above it the wrong way, a sideways import
// and an unplaced folder, and lets downward and same-unit imports through.
func TestCheckFindsUpwardImports(t *testing.T) {
	m := func(p string) string { return Module + "/" + p }
	bad := Check([]Package{
		{m("sched/ensure"), []string{m("internal/table"), m("cgroupgpu/tenant"), "os"}},
		{m("internal/table"), []string{m("internal/quote"), m("sched/policy")}},
		{m("hook"), []string{m("cgroupgpu/tenant"), m("hook/specmod"), m("shimv2")}},
		{m("cmd/detshare"), []string{m("internal/simgpu"), m("hook"), m("cmd/internal/wiring")}},
		{m("newfolder/x"), nil},
	})
	want := []string{"newfolder/x: ", "hook (hook, floor 4) imports shimv2", "sched/ensure (sched, floor 3) imports cgroupgpu/tenant",
		"internal/table (internal/table, floor 1) imports sched/policy"}
	if len(bad) != len(want) {
		t.Fatalf("got %d findings, want %d:\n%s", len(bad), len(want), strings.Join(bad, "\n"))
	}
	for _, w := range want {
		found := false
		for _, b := range bad {
			found = found || strings.HasPrefix(b, w)
		}
		if !found {
			t.Errorf("missing %q in:\n%s", w, strings.Join(bad, "\n"))
		}
	}
}
