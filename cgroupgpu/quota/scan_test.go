package quota_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/internal/simgpu"
)

// TestOneCreateScansItsInputsOnce: a create through the hook path (hook.Prepare: the runc wrapper and the shim go
// through the same attach) resolves the container's annotations, labels and environment exactly once, for a
// container that asks for DetShare (registered, including the retry over a stale registration of its ID), one
// that does not, and one that only misspells a key (refused).
func TestOneCreateScansItsInputsOnce(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	d := t.TempDir()
	lib := filepath.Join(d, "libdetshare.so")
	hookBin := filepath.Join(d, "detshare-hook")
	if err := os.WriteFile(lib, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hookBin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := hook.Config{RunDir: filepath.Join(d, "run"), LibPath: lib, HookPath: hookBin,
		Registrar: tenant.Registrar{DiscoverGPUs: simgpu.Discover}}
	for _, c := range []struct {
		name, id, spec string
		registered     bool
		refused        bool
	}{
		{"asks", "c1", `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},` +
			`"annotations":{"detshare.io/memory":"1Gi"},"root":{"path":"rootfs"}}`, true, false},
		{"stale registration replaced", "c1", `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`, true, false},
		{"does not ask", "c2", `{"process":{"env":["PATH=/bin"]},"root":{"path":"rootfs"}}`, false, false},
		{"misspelt key", "c3", `{"process":{"env":["DETSHARE_TEIR=burstable"]},"root":{"path":"rootfs"}}`, false, true},
	} {
		b := t.TempDir()
		if err := os.WriteFile(filepath.Join(b, "config.json"), []byte(c.spec), 0o644); err != nil {
			t.Fatal(err)
		}
		before := quota.Resolves()
		p, err := hook.Prepare(context.Background(), cfg, hook.Request{ID: c.id, Bundle: b})
		if n := quota.Resolves() - before; n != 1 {
			t.Errorf("%s: the create scanned its inputs %d times, want 1", c.name, n)
		}
		if (err != nil) != c.refused || p.Registered != c.registered {
			t.Errorf("%s: registered %v, err %v; want registered %v, refused %v", c.name, p.Registered, err, c.registered, c.refused)
		}
	}
}
