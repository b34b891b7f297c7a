package libdetshare_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var dsInclude = regexp.MustCompile(`(?m)^#include "(ds_\w+)\.h"`)

// srcIncludes maps each unit of src/ (a .c and its .h: "ds_streams") to the units whose headers it includes. A C
// file can only call another part of the library through that part's header (the build has
// -Werror=implicit-function-declaration through -Wall -Werror), so this is the library's call structure.
func srcIncludes(t *testing.T) map[string][]string {
	t.Helper()
	paths, err := filepath.Glob("src/ds_*.[ch]")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no sources under src/ (%v)", err)
	}
	deps := map[string][]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		unit := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(p), ".c"), ".h")
		if _, ok := deps[unit]; !ok {
			deps[unit] = nil
		}
		for _, m := range dsInclude.FindAllStringSubmatch(string(b), -1) {
			if m[1] != unit && m[1] != "ds_glibc" {
				deps[unit] = append(deps[unit], m[1])
			}
		}
	}
	return deps
}

// The library's files call each other in one direction only (docs/libdetshare.md, "Who calls whom"): no circle, the
// shared state (ds_process) calls nothing, and the start-up file (ds_init) is called by nothing. A circle here is
// what issue 30 took apart: one start-up file that every part called and that called every part.
func TestSourceFilesCallInOneDirection(t *testing.T) {
	deps := srcIncludes(t)
	const unvisited, open, done = 0, 1, 2
	state := map[string]int{}
	var stack []string
	var visit func(u string)
	visit = func(u string) {
		state[u] = open
		stack = append(stack, u)
		next := append([]string(nil), deps[u]...)
		sort.Strings(next)
		for _, v := range next {
			switch state[v] {
			case open:
				i := len(stack) - 1
				for stack[i] != v {
					i--
				}
				t.Errorf("src/ files call each other in a circle: %s -> %s", strings.Join(stack[i:], " -> "), v)
			case unvisited:
				visit(v)
			}
		}
		stack = stack[:len(stack)-1]
		state[u] = done
	}
	units := make([]string, 0, len(deps))
	for u := range deps {
		units = append(units, u)
	}
	sort.Strings(units)
	for _, u := range units {
		if state[u] == unvisited {
			visit(u)
		}
	}
	if d := deps["ds_process"]; len(d) != 0 {
		t.Errorf("ds_process (the state every part shares) includes %v: it must call no other part", d)
	}
	for _, u := range units {
		for _, v := range deps[u] {
			if v == "ds_init" {
				t.Errorf("%s includes ds_init.h: nothing may call the start-up file", u)
			}
		}
	}
}
