package layout

import (
	"os"
	"path/filepath"
	"testing"
)

// The installed layout ($PREFIX/lib/detshare) wins over the build tree's (build/lib); the environment wins over both;
// with neither present the installed path is named so errors say where the library belongs.
func TestLibPathForInstalledAndBuildLayouts(t *testing.T) {
	d := t.TempDir()
	bin := filepath.Join(d, "bin")
	if got, want := LibPathFor("", bin), filepath.Join(d, "lib", "detshare", LibName); got != want {
		t.Errorf("nothing present: %s, want %s", got, want)
	}
	os.MkdirAll(filepath.Join(d, "lib"), 0o755)
	os.WriteFile(filepath.Join(d, "lib", LibName), []byte("x"), 0o644)
	if got, want := LibPathFor("", bin), filepath.Join(d, "lib", LibName); got != want {
		t.Errorf("build tree: %s, want %s", got, want)
	}
	os.MkdirAll(filepath.Join(d, "lib", "detshare"), 0o755)
	os.WriteFile(filepath.Join(d, "lib", "detshare", LibName), []byte("x"), 0o644)
	if got, want := LibPathFor("", bin), filepath.Join(d, "lib", "detshare", LibName); got != want {
		t.Errorf("installed: %s, want %s", got, want)
	}
	if got := LibPathFor("/x/lib.so", bin); got != "/x/lib.so" {
		t.Errorf("env: %s", got)
	}
}
