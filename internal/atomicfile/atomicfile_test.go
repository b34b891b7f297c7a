package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "quota")
	for _, content := range []string{"first\n", "second\n"} {
		if err := Write(p, []byte(content), 0o640, true); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != content {
			t.Fatalf("read back %q, %v; want %q", b, err, content)
		}
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640", st.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want only the file", len(ents))
	}
}

func TestWriteFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "sub") // a directory where the file should go: the rename must fail
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("data"), 0o644, false); err == nil {
		t.Fatal("renaming over a non-empty directory succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a temporary was left behind: %v", ents)
	}
}

// A sweeper tells whose temporary it found from its name alone: Write's naming and TargetOf must agree, and the
// pattern must find a temporary of Write that a writer left behind.
func TestTemporaryNamesTheirTarget(t *testing.T) {
	dir := t.TempDir()
	f, err := os.CreateTemp(dir, "."+"ld.so.preload"+tempInfix+"*") // what Write creates for ld.so.preload
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	found, err := filepath.Glob(TemporaryPattern(dir))
	if err != nil || len(found) != 1 || found[0] != f.Name() {
		t.Fatalf("TemporaryPattern found %v, %v; want %s", found, err, f.Name())
	}
	for name, want := range map[string]string{
		filepath.Base(f.Name()): "ld.so.preload",
		".table.tmp-123":        "table",
		".a.tmp-b.tmp-9":        "a.tmp-b",
	} {
		if got, ok := TargetOf(name); !ok || got != want {
			t.Errorf("TargetOf(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
	for _, name := range []string{"table", "table.tmp-1", "..tmp-1", ".tmp-1"} {
		if got, ok := TargetOf(name); ok {
			t.Errorf("TargetOf(%q) = %q: not a temporary of Write", name, got)
		}
	}
}
