package libdetshare_test

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// glibcBaseline is the oldest glibc a container image may have: libdetshare is preloaded into every process of a
// tenant container, so one symbol needing a newer version stops every program of an older image from starting
// ("version `GLIBC_2.34' not found (required by libdetshare.so)"). 2.17 covers CentOS 7 / UBI 7 and later.
var glibcBaseline = [2]int{2, 17}

// glibcVersion parses "GLIBC_2.34" (or "GLIBC_2.2.5") into major and minor; ok is false for other version names.
func glibcVersion(v string) (maj, min int, ok bool) {
	rest, found := strings.CutPrefix(v, "GLIBC_")
	if !found {
		return 0, 0, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) < 2 {
		return 0, 0, false
	}
	maj, err1 := strconv.Atoi(parts[0])
	min, err2 := strconv.Atoi(parts[1])
	return maj, min, err1 == nil && err2 == nil
}

func aboveBaseline(v string) bool {
	maj, min, ok := glibcVersion(v)
	return ok && (maj > glibcBaseline[0] || maj == glibcBaseline[0] && min > glibcBaseline[1])
}

// TestLibdetshareGlibcBaseline builds libdetshare from the current sources (the library's own build.mk, into a
// temporary directory, so a stale build/ cannot hide a regression) and fails listing every imported symbol and
// every version requirement above GLIBC_2.17. It also checks that libdl.so.2 and libpthread.so.0 are needed,
// since with glibc before 2.34 the dl* and pthread_* functions live there and a program that does not link them
// would leave them unresolved.
func TestLibdetshareGlibcBaseline(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("gcc is needed to build libdetshare: %v", err)
	}
	root, err := filepath.Abs(filepath.Join(buildDir(t), ".."))
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("DETSHARE_BUILD_DIR") != "" { // the sources are next to this file, not next to the build
		root, _ = filepath.Abs(filepath.Join("..", ".."))
	}
	out := t.TempDir()
	cmd := exec.Command("make", "--no-print-directory", "-f", "cgroupgpu/libdetshare/build.mk", "BUILD="+out,
		filepath.Join(out, "lib", "libdetshare.so"))
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building libdetshare: %v\n%s", err, b)
	}
	lib := filepath.Join(out, "lib", "libdetshare.so")
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var bad []string
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatalf("reading imported symbols of %s: %v", lib, err)
	}
	for _, s := range syms {
		if aboveBaseline(s.Version) {
			bad = append(bad, fmt.Sprintf("%s@%s (%s)", s.Name, s.Version, s.Library))
		}
	}
	needs, err := f.DynamicVersionNeeds()
	if err != nil {
		t.Fatalf("reading version needs of %s: %v", lib, err)
	}
	for _, n := range needs {
		for _, d := range n.Needs {
			if aboveBaseline(d.Dep) {
				bad = append(bad, fmt.Sprintf("version need %s from %s", d.Dep, n.Name))
			}
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("libdetshare.so needs glibc newer than %d.%d, so it cannot be preloaded into older images:\n  %s\n"+
			"bind the symbol to its old version in src/ds_glibc.h or use a system call",
			glibcBaseline[0], glibcBaseline[1], strings.Join(bad, "\n  "))
	}

	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"libc.so.6", "libdl.so.2", "libpthread.so.0"} {
		found := false
		for _, l := range libs {
			found = found || l == want
		}
		if !found {
			t.Errorf("libdetshare.so does not name %s as needed (has %v): with glibc before 2.34 its functions live there", want, libs)
		}
	}
}
