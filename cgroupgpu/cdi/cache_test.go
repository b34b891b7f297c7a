package cdi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// The driver edit is generated once and then read from CacheFile, equal to a fresh generation, until the driver
// changes: a new driver version, a library directory changed (a library installed or removed), or another hook.
func TestDriverEditCache(t *testing.T) {
	root := hostTree(t)
	cache := t.TempDir()
	gpu := GPU{Index: 1, UUID: uuidA}
	fresh := func() ContainerEdits {
		t.Helper()
		e, err := Driver{Root: root, HookPath: "/hook"}.Edits(gpu)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	cached := Driver{Root: root, HookPath: "/hook", CacheDir: cache}
	first, err := cached.Edits(gpu)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, fresh()) {
		t.Fatalf("edit with a cache differs from a fresh one:\n%+v\n%+v", first, fresh())
	}
	if _, err := os.Stat(filepath.Join(cache, CacheFile)); err != nil {
		t.Fatalf("no cache written: %v", err)
	}
	// Mark the cached copy: a start that reads the cache returns the mark, one that regenerates does not.
	mark := func() {
		t.Helper()
		var c cachedEdit
		data, _ := os.ReadFile(filepath.Join(cache, CacheFile))
		if err := jsonUnmarshal(data, &c); err != nil {
			t.Fatal(err)
		}
		c.Edits.Env = []string{"FROM_CACHE=1"}
		if err := os.WriteFile(filepath.Join(cache, CacheFile), jsonMarshal(t, c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fromCache := func(d Driver) bool {
		t.Helper()
		e, err := d.Edits(gpu)
		if err != nil {
			t.Fatal(err)
		}
		return reflect.DeepEqual(e.Env, []string{"FROM_CACHE=1"})
	}
	mark()
	if !fromCache(cached) {
		t.Fatal("second start regenerated the edit instead of reading the cache")
	}
	later := time.Now().Add(time.Hour)
	for _, change := range []struct {
		name string
		do   func()
		d    Driver
	}{
		{"library directory changed", func() { os.Chtimes(filepath.Join(root, lib), later, later) }, cached},
		{"driver version changed", func() {
			os.WriteFile(filepath.Join(root, "proc/driver/nvidia/version"),
				[]byte("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.06  Release Build\n"), 0o644)
			os.WriteFile(filepath.Join(root, lib, "libcuda.so.580.95.06"), []byte("ELF"), 0o755)
		}, cached},
		{"another hook", func() {}, Driver{Root: root, HookPath: "/other-hook", CacheDir: cache}},
	} {
		mark()
		change.do()
		if fromCache(change.d) {
			t.Errorf("%s: the stale cached edit was used", change.name)
		}
	}
	// Without a version (no driver loaded) nothing is cached.
	os.Remove(filepath.Join(root, "proc/driver/nvidia/version"))
	os.Remove(filepath.Join(cache, CacheFile))
	if _, err := cached.Edits(gpu); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cache, CacheFile)); err == nil {
		t.Error("an edit was cached without a driver version")
	}
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

func jsonMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
