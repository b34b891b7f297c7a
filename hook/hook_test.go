package hook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook/specmod"
)

func testConfig(t testing.TB) Config {
	d := t.TempDir()
	lib := filepath.Join(d, "libdetshare.so")
	os.WriteFile(lib, []byte("x"), 0o644)
	h := filepath.Join(d, "detshare-hook")
	os.WriteFile(h, []byte("#!/bin/sh\n"), 0o755)
	return Config{RunDir: filepath.Join(d, "run"), LibPath: lib, HookPath: h}
}

func writeBundle(t testing.TB, spec string) string {
	b := t.TempDir()
	if err := os.WriteFile(filepath.Join(b, "config.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPrepareRegistersAndReplacesStaleRegistration(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	spec := `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`
	for i := 0; i < 2; i++ { // the second create under the same ID finds a stale registration (no poststop ran)
		p, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: writeBundle(t, spec)})
		if err != nil || !p.Registered {
			t.Fatalf("round %d: %+v, %v", i, p, err)
		}
	}
	if res, ok, _ := tenant.Lookup(cfg.RunDir, "c1"); !ok || res.Registration.SMs < 8 {
		t.Fatalf("c1 not registered: %+v", res)
	}
	pre, err := os.ReadFile(filepath.Join(cfg.RunDir, PreloadFileName))
	if err != nil || string(pre) != "/usr/lib/detshare/libdetshare.so\n" {
		t.Errorf("preload file %q, %v", pre, err)
	}
	if err := Poststop(cfg, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := Poststop(cfg, "c1"); err != nil {
		t.Errorf("second poststop (hook then shim) must be a no-op: %v", err)
	}
}

func TestPrepareFailsOpenOrClosed(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	cfg.LibPath = "/nonexistent/libdetshare.so"
	spec := `{"process":{"env":["DETSHARE_TIER=best-effort"]}}`
	b := writeBundle(t, spec)
	p, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: b})
	if err != nil || p.Registered || p.FailedOpen == nil {
		t.Fatalf("fail-open: %+v, %v", p, err)
	}
	if data, _ := os.ReadFile(filepath.Join(b, "config.json")); string(data) != spec {
		t.Error("spec edited although DetShare failed")
	}
	cfg.FailClosed = true
	if _, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: b}); err == nil || !strings.Contains(err.Error(), "DETSHARE_LIB") {
		t.Errorf("fail-closed: %v", err)
	}
}

func TestReadState(t *testing.T) {
	st, err := ReadState(strings.NewReader(`{"ociVersion":"1.0.2","id":"abc","status":"creating","pid":12,"bundlePath":"/b"}`))
	if err != nil || st.ID != "abc" || st.Bundle != "/b" || st.Pid != 12 {
		t.Errorf("%+v %v", st, err)
	}
	if _, err := ReadState(strings.NewReader(`{"pid":1}`)); err == nil || !strings.Contains(err.Error(), `"id"`) {
		t.Errorf("state without id: %v", err)
	}
	if _, err := ReadState(strings.NewReader(`nope`)); err == nil {
		t.Error("garbage accepted")
	}
}

// BenchmarkPrepareAndPoststop is the registration work the shim and the wrapper add to a container start
// (spec read, register, spec write) and to its deletion.
func BenchmarkPrepareAndPoststop(b *testing.B) {
	os.Setenv("DETSHARE_SIMGPU", "1")
	defer os.Unsetenv("DETSHARE_SIMGPU")
	cfg := testConfig(b)
	spec := `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=16","DETSHARE_MEMORY=1GiB"]},"root":{"path":"rootfs"}}`
	bundle := writeBundle(b, spec)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		os.WriteFile(filepath.Join(bundle, "config.json"), []byte(spec), 0o644)
		id := fmt.Sprintf("c%d", i)
		b.StartTimer()
		if _, err := Prepare(context.Background(), cfg, Request{ID: id, Bundle: bundle}); err != nil {
			b.Fatal(err)
		}
		if err := Poststop(cfg, id); err != nil {
			b.Fatal(err)
		}
	}
}

var _ = specmod.TenantIDAnnotation

func TestPrepareNeedsTheHookOnlyWhenItAddsIt(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	cfg.HookPath = "/nonexistent/detshare-hook"
	spec := `{"process":{"env":["DETSHARE_TIER=best-effort"]}}`
	p, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: writeBundle(t, spec), NoPoststopHook: true})
	if err != nil || !p.Registered {
		t.Fatalf("without a poststop hook the hook binary is not needed: %+v %v", p, err)
	}
	s, _ := specmod.Load(filepath.Join(writeBundle(t, spec), "config.json"))
	if len(s.Hooks("poststop")) != 0 {
		t.Error("unexpected hook")
	}
	p, err = Prepare(context.Background(), cfg, Request{ID: "c2", Bundle: writeBundle(t, spec)})
	if err != nil || p.Registered || p.FailedOpen == nil || !strings.Contains(p.FailedOpen.Error(), "DETSHARE_HOOK") {
		t.Errorf("with a poststop hook and no hook binary: %+v %v; want fail-open naming DETSHARE_HOOK", p, err)
	}
}
