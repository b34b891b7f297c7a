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
	wantFindings(t, bad, want)
}

// TestCheckKeepsWingsApartAndTestsOut: the two wings (cgroupgpu with the glue over it, sched) may not import each
// other, in either direction and from any floor of the glue, in both modules; no production package outside
// integration/ may import it (a binary included); the binaries, and the Kubernetes module's binaries, may import
// both wings and the ground floor.
func TestCheckKeepsWingsApartAndTestsOut(t *testing.T) {
	m := func(p string) string { return Module + "/" + p }
	bad := Check([]Package{
		{m("cgroupgpu/tenant"), []string{m("internal/table"), m("sched/workload")}},
		{m("sched/view"), []string{m("cgroupgpu/quota")}},
		{m("hook"), []string{m("sched/ensure"), m("internal/simgpu")}},
		{m("shimv2"), []string{m("sched/policy")}},
		{m("k8s/deviceplugin"), []string{m("sched/gpuinfo"), m("cgroupgpu/cdi")}},
		{m("cmd/internal/wiring"), []string{m("integration/simgpu"), m("sched/ensure"), m("cgroupgpu/tenant")}},
		{m("k8s/cmd/detshare-dra-plugin"), []string{m("integration/simgpu"), m("sched/gpuinfo"), m("cmd/detshare/version"), m("k8s/dra")}},
		{m("k8s/installerimage"), []string{m("integration/testenv"), m("internal/ociimage")}},
		{m("k8s/tools/installer-image"), []string{m("k8s/installerimage")}},
		{m("integration/testenv"), []string{m("integration/hostleft"), m("internal/ociimage")}},
		{m("cmd/detshare"), []string{m("sched/daemon"), m("cgroupgpu/tenant"), m("hook"), m("internal/simgpu")}},
	})
	want := []string{
		"cgroupgpu/tenant (cgroupgpu, floor 3) imports sched/workload (sched, floor 3)",
		"sched/view (sched, floor 3) imports cgroupgpu/quota (cgroupgpu, floor 3)",
		"hook (cgroupgpu wing) imports sched/ensure (sched wing)",
		"shimv2 (cgroupgpu wing) imports sched/policy (sched wing)",
		"k8s/deviceplugin (cgroupgpu wing) imports sched/gpuinfo (sched wing)",
		"cmd/internal/wiring imports integration/simgpu: integration is test support",
		"k8s/cmd/detshare-dra-plugin imports integration/simgpu: integration is test support",
		"k8s/installerimage imports integration/testenv: integration is test support",
	}
	wantFindings(t, bad, want)
}

// wantFindings fails unless bad has as many findings as want and one starting with each of want.
func wantFindings(t *testing.T, bad, want []string) {
	t.Helper()
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
