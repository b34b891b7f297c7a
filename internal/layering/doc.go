// Package layering holds the allowed direction of imports between DetShare's folders (Layers) and the check that
// enforces it in the normal test run, on the main module (TestImportsPointDown) and on the Kubernetes module k8s/
// (k8s/internal/layering). docs/internals.md draws the same map; a package that imports upward or sideways, across
// the wings, or from the test folder integration/, or a new folder not placed in Layers, fails the test.
package layering

import (
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// Module is the module path of the product. The Kubernetes module (github.com/detshare/detshare/k8s, its own
// go.mod) lies under it, so one Layers places both.
const Module = "github.com/detshare/detshare"

// Wings: the two halves of the product that stand side by side on internal/ and meet only in the binaries (cmd/,
// k8s/cmd/). Per-tenant enforcement (cgroupgpu) and the container glue over it (hook, shimv2, the Kubernetes
// plugins) form one; the host scheduler (sched) the other. They share only internal/: the table, the config file,
// a tenant's workload record.
const (
	EnforcementWing = "cgroupgpu"
	SchedulerWing   = "sched"
)

// Layer is one unit of the tree (a folder, or a package given its own floor) and its floor: production code may
// import its own unit and lower floors only, and, in a wing, nothing of the other wing.
type Layer struct {
	Prefix string // path inside the module; the longest matching Prefix places a package
	Floor  int
	// Wing is EnforcementWing, SchedulerWing, or "" for what stands under both (internal/) or over both (cmd/).
	Wing string
	// TestsOnly marks test support: imported by tests only, so a production import of it from another unit is
	// refused whatever the floors.
	TestsOnly bool
}

// Layers is the allowed direction, ground floor first. internal/table (the table ABI: C headers and Go mirror,
// run-dir and in-container paths, ID validation) is the shared contract everything stands on, the C library
// included: it gets its own floor above the small helpers, so that none of them can lean on it and it can import
// nothing above them. Above it, what both wings read or write besides the table. The two wings share floor 3, so
// neither may import the other (an import between two units of one floor is refused).
var Layers = []Layer{
	{Prefix: "internal", Floor: 0},                         // helpers with no DetShare imports (atomic files, quoting, OCI image tars, ...)
	{Prefix: "internal/table", Floor: 1},                   // the shared contract
	{Prefix: "internal/simgpu", Floor: 2},                  // the binaries' choice of the simulated GPU (a test double)
	{Prefix: "internal/workload", Floor: 2},                // a tenant's Kubernetes pod/container record
	{Prefix: "internal/config", Floor: 2},                  // the host configuration file (config.toml)
	{Prefix: "cgroupgpu", Floor: 3, Wing: EnforcementWing}, // per-tenant enforcement: quota keys, registration, placement, CDI, libdetshare
	{Prefix: "sched", Floor: 3, Wing: SchedulerWing},       // the host scheduler and its pieces (policy, daemon, mps, gpuinfo, ensure, view, ...)
	{Prefix: "hook", Floor: 4, Wing: EnforcementWing},      // container attach: OCI hook, spec edits, runc wrapper
	{Prefix: "shimv2", Floor: 5, Wing: EnforcementWing},    // containerd shim v2 task service
	{Prefix: "k8s", Floor: 6, Wing: EnforcementWing},       // the Kubernetes module's device plugin, DRA plugin, installer image
	{Prefix: "cmd", Floor: 7},                              // the binaries: the only place dependencies are chosen and wired
	{Prefix: "k8s/cmd", Floor: 8},                          // the Kubernetes module's binaries (they take cmd/detshare/version)
	{Prefix: "k8s/tools", Floor: 8},                        // the Kubernetes module's build tools (installer-image)
	{Prefix: "integration", Floor: 9, TestsOnly: true},     // the simulated GPU (a test double) and test support
}

// Package is one package's import path (inside the module) and its production (non-test) imports.
type Package struct {
	Path    string
	Imports []string
}

// place returns the Layer of a path inside the module, or false.
func place(p string) (Layer, bool) {
	best, ok := Layer{}, false
	for _, l := range Layers {
		if (p == l.Prefix || strings.HasPrefix(p, l.Prefix+"/")) && len(l.Prefix) > len(best.Prefix) {
			best, ok = l, true
		}
	}
	return best, ok
}

// Check returns one line per upward (or sideways, between two units of one floor) import, per import across the
// wings, per production import of test support (integration/) from outside it, and per package that no Layer
// places. Paths are the full import paths; imports outside the module are ignored.
func Check(pkgs []Package) []string {
	var bad []string
	for _, p := range pkgs {
		from, ok := strings.CutPrefix(p.Path, Module+"/")
		if !ok {
			continue
		}
		lf, ok := place(from)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: its folder has no floor in internal/layering.Layers", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ok := strings.CutPrefix(imp, Module+"/")
			if !ok {
				continue
			}
			lt, ok := place(to)
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("%s imports %s, whose folder has no floor", from, to))
			case lt.Prefix == lf.Prefix:
			case lt.TestsOnly:
				bad = append(bad, fmt.Sprintf("%s imports %s: %s is test support, imported by tests only", from, to, lt.Prefix))
			case lt.Floor >= lf.Floor:
				bad = append(bad, fmt.Sprintf("%s (%s, floor %d) imports %s (%s, floor %d): imports must point down",
					from, lf.Prefix, lf.Floor, to, lt.Prefix, lt.Floor))
			case lf.Wing != "" && lt.Wing != "" && lf.Wing != lt.Wing:
				bad = append(bad, fmt.Sprintf("%s (%s wing) imports %s (%s wing): the wings meet only in the binaries (cmd/)",
					from, lf.Wing, to, lt.Wing))
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// List lists every package of the module whose root is dir with `go list` (production imports only), failing on a
// package that does not load.
func List(dir string) ([]Package, error) {
	cmd := exec.Command("go", "list", "-e", "-f", "{{.ImportPath}} {{if .Error}}ERROR{{end}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %w", dir, err)
	}
	var pkgs []Package
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[1] == "ERROR" {
			return nil, fmt.Errorf("go list in %s: package %s does not load", dir, f[0])
		}
		pkgs = append(pkgs, Package{Path: f[0], Imports: f[1:]})
	}
	return pkgs, nil
}
