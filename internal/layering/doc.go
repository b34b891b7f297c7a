// Package layering holds the allowed direction of imports between DetShare's folders (Layers) and the check that
// enforces it on the whole module in the normal test run (TestImportsPointDown). docs/internals.md shows the same
// order; a package that imports upward, or a new folder not placed in Layers, fails the test.
package layering

import (
	"fmt"
	"sort"
	"strings"
)

// Module is the module path of the product (k8s/ is a separate module that sits above all of it).
const Module = "github.com/detshare/detshare"

// Layer is one unit of the tree (a folder, or a package given its own floor) and its floor: production code may
// import its own unit and lower floors only.
type Layer struct {
	Prefix string // path inside the module; the longest matching Prefix places a package
	Floor  int
}

// Layers is the allowed direction, ground floor first. internal/table (the table ABI: C headers and Go mirror,
// run-dir and in-container paths, ID validation) is the shared contract everything stands on, the C library
// included: it gets its own floor above the small helpers, so that none of them can lean on it and it can import
// nothing above them.
var Layers = []Layer{
	{"internal", 0},        // small helpers with no DetShare imports (atomic files, quoting, layout, fail-open)
	{"internal/table", 1},  // the shared contract
	{"internal/simgpu", 2}, // the binaries' choice of the simulated GPU (a test double)
	{"sched", 2},           // the host scheduler and its pieces (policy, daemon, mps, gpuinfo, ensure, view, ...)
	{"cgroupgpu", 3},       // per-tenant enforcement: quota keys, registration, placement, libdetshare
	{"hook", 4},            // container attach: OCI hook, spec edits, runc wrapper
	{"shimv2", 5},          // containerd shim v2 task service
	{"integration", 6},     // the simulated GPU (a test double) and test support; only mains and tests import it
	{"cmd", 7},             // the binaries: the only place dependencies are chosen and wired
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

// Check returns one line per upward (or sideways, between two units of one floor) import, and per package that no
// Layer places. Paths are the full import paths; imports outside the module are ignored.
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
			case lt.Prefix == lf.Prefix || lt.Floor < lf.Floor:
			default:
				bad = append(bad, fmt.Sprintf("%s (%s, floor %d) imports %s (%s, floor %d): imports must point down",
					from, lf.Prefix, lf.Floor, to, lt.Prefix, lt.Floor))
			}
		}
	}
	sort.Strings(bad)
	return bad
}
