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

// oldGlibcRoot returns a Debian 11 (glibc 2.31) root file system with coreutils: $DETSHARE_OLD_GLIBC_ROOT, else one
// made once from Debian's archive with apt-get download (the Debian mirror is the one network CI has) and cached in
// /var/cache/detshare-oldglibc. Each test works on its own copy.
func oldGlibcRoot(t *testing.T) string {
	t.Helper()
	src := os.Getenv("DETSHARE_OLD_GLIBC_ROOT")
	if src == "" {
		src = "/var/cache/detshare-oldglibc/bullseye-rootfs"
		if _, err := os.Stat(filepath.Join(src, "bin", "cat")); err != nil {
			apt := filepath.Join(filepath.Dir(src), "apt")
			for _, d := range []string{"lists/partial", "cache/archives/partial", "debs"} {
				if err := os.MkdirAll(filepath.Join(apt, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			mirror := debianMirror(t)
			list := filepath.Join(apt, "sources.list")
			os.WriteFile(list, []byte("deb "+mirror+" bullseye main\n"), 0o644)
			opts := []string{"-o", "Dir::Etc::SourceList=" + list, "-o", "Dir::Etc::SourceParts=/dev/null",
				"-o", "Dir::State::Lists=" + filepath.Join(apt, "lists"), "-o", "Dir::Cache=" + filepath.Join(apt, "cache"),
				"-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"}
			run := func(dir string, name string, args ...string) {
				cmd := exec.Command(name, args...)
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("making a Debian 11 root file system (set DETSHARE_OLD_GLIBC_ROOT to use one you have): %s %v: %v\n%s", name, args, err, out)
				}
			}
			run(apt, "apt-get", append(opts, "update")...)
			run(filepath.Join(apt, "debs"), "apt-get", append(opts, "download", "libc6/bullseye", "coreutils/bullseye")...)
			tmp := src + ".tmp"
			os.RemoveAll(tmp)
			debs, _ := filepath.Glob(filepath.Join(apt, "debs", "*.deb"))
			for _, d := range debs {
				run(apt, "dpkg-deb", "-x", d, tmp)
			}
			if err := os.Rename(tmp, src); err != nil {
				t.Fatal(err)
			}
		}
	}
	root := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-a", src, root).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v\n%s", src, err, out)
	}
	return root
}

// debianMirror is the Debian archive this host's apt already uses (its sources.list or deb822 .sources files,
// security archives skipped): the same mirror serves the older release.
func debianMirror(t *testing.T) string {
	t.Helper()
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append([]string{"/etc/apt/sources.list"}, files...)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Fields(line)
			var uris []string
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				uris = fields[1:]
			case len(fields) >= 3 && fields[0] == "deb":
				uris = fields[1:2]
				if strings.HasPrefix(uris[0], "[") { // deb [options] uri suite
					uris = nil
					for i, f := range fields {
						if strings.HasSuffix(f, "]") && i+1 < len(fields) {
							uris = fields[i+1 : i+2]
						}
					}
				}
			}
			for _, u := range uris {
				if strings.Contains(u, "://") && !strings.Contains(u, "security") && strings.HasSuffix(strings.TrimSuffix(u, "/"), "/debian") {
					return u
				}
			}
		}
	}
	t.Fatal("no Debian archive in this host's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.sources): set DETSHARE_OLD_GLIBC_ROOT to a Debian 11 root file system")
	return ""
}

// TestLibdetsharePreloadsUnderDebian11Glibc is the failure this baseline prevents, for real: libdetshare in
// /etc/ld.so.preload of a Debian 11 root file system (glibc 2.31), and programs of that system must still run (and
// the library's constructor with them). It needs root (chroot).
func TestLibdetsharePreloadsUnderDebian11Glibc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (chroot into a Debian 11 root file system)")
	}
	lib := need(t, filepath.Join("lib", "libdetshare.so"))
	root := oldGlibcRoot(t)
	libc, _ := filepath.Glob(filepath.Join(root, "lib", "x86_64-linux-gnu", "libc-2.*.so"))
	if len(libc) != 1 || !strings.HasSuffix(libc[0], "libc-2.31.so") {
		t.Fatalf("%s is not a glibc 2.31 system: %v", root, libc)
	}
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "usr", "lib", "detshare"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "usr", "lib", "detshare", "libdetshare.so"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "etc", "ld.so.preload"), []byte("/usr/lib/detshare/libdetshare.so\n"), 0o644)
	for _, args := range [][]string{{"/bin/cat", "/etc/ld.so.preload"}, {"/usr/bin/sort", "--parallel=2", "/etc/ld.so.preload"}} {
		out, err := exec.Command("chroot", append([]string{root}, args...)...).CombinedOutput()
		if err != nil || string(out) != "/usr/lib/detshare/libdetshare.so\n" {
			t.Errorf("%v under glibc 2.31 with libdetshare preloaded: %v\n%s", args, err, out)
		}
	}
}
