package hook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook/specmod"
	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
)

func testConfig(t testing.TB) Config {
	d := t.TempDir()
	lib := filepath.Join(d, "libdetshare.so")
	os.WriteFile(lib, []byte("x"), 0o644)
	h := filepath.Join(d, "detshare-hook")
	os.WriteFile(h, []byte("#!/bin/sh\n"), 0o755)
	return Config{RunDir: filepath.Join(d, "run"), LibPath: lib, HookPath: h,
		Registrar: tenant.Registrar{DiscoverGPUs: simgpu.Discover}}
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

// A container that asked for DetShare and cannot get it is refused by default (nothing left behind), runs unshared
// with a count under fail-open, and a container that asked for nothing is never touched.
func TestPrepareRefusesByDefaultAndFailsOpenLoudlyWhenConfigured(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	os.MkdirAll(cfg.RunDir, 0o755)
	cfg.LibPath = "/nonexistent/libdetshare.so"
	spec := `{"process":{"env":["DETSHARE_TIER=latency-critical","DETSHARE_SMS=8"]}}`
	b := writeBundle(t, spec)
	_, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: b})
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "libdetshare.so not readable") ||
		!strings.Contains(err.Error(), "fail_open") {
		t.Fatalf("default policy: %v; want a refusal naming the library and the fail_open key", err)
	}
	if data, _ := os.ReadFile(filepath.Join(b, "config.json")); string(data) != spec {
		t.Error("spec edited although the container was refused")
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "c1"); ok {
		t.Error("refused container left a registration")
	}
	cfg.FailOpen = true
	p, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: b})
	if err != nil || p.Registered || p.FailedOpen == nil {
		t.Fatalf("fail-open: %+v, %v", p, err)
	}
	if n := failopen.Count(cfg.RunDir); n != 1 {
		t.Errorf("fail-open events recorded: %d, want 1", n)
	}
	if msg := Notice(p.FailedOpen); !strings.HasPrefix(msg, "detshare: WARNING") || !strings.Contains(msg, "WITHOUT") {
		t.Errorf("notice %q", msg)
	}
	cfg.FailOpen = false
	plain := `{"process":{"env":["PATH=/bin"]}}`
	pb := writeBundle(t, plain)
	if p, err := Prepare(context.Background(), cfg, Request{ID: "c2", Bundle: pb}); err != nil || p.Registered || p.FailedOpen != nil {
		t.Errorf("container without settings: %+v, %v; want it left alone", p, err)
	}
}

// A full table refuses a container that asked for a tier, and leaves no slot behind.
func TestPrepareTableFullRefuses(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	for i := 0; i < table.MaxContainers; i++ {
		if _, err := cfg.Registrar.Register(context.Background(), cfg.RunDir, tenant.Request{ID: fmt.Sprintf("t%d", i),
			Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=best-effort"}}.Resolve()}); err != nil {
			t.Fatalf("filling slot %d: %v", i, err)
		}
	}
	b := writeBundle(t, `{"process":{"env":["DETSHARE_TIER=latency-critical","DETSHARE_SMS=8"]}}`)
	_, err := Prepare(context.Background(), cfg, Request{ID: "late", Bundle: b, NoPoststopHook: true})
	if err == nil || !strings.Contains(err.Error(), "table full") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("table full: %v", err)
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "late"); ok {
		t.Error("refused container registered")
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
	_, err = Prepare(context.Background(), cfg, Request{ID: "c2", Bundle: writeBundle(t, spec)})
	if err == nil || !strings.Contains(err.Error(), "DETSHARE_HOOK") {
		t.Errorf("with a poststop hook and no hook binary: %v; want a refusal naming DETSHARE_HOOK", err)
	}
}

// A misspelt key refuses the container, alone (it would otherwise run unshared) or next to valid keys (it would run
// with a quota it did not ask for), even under fail-open (it is the user's mistake, not DetShare failing), and
// registers nothing; DetShare's own runtime variables alone leave the container untouched.
func TestPrepareRefusesUnknownKeys(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	t.Setenv("DETSHARE_FAIL_OPEN", "1")
	cfg := testConfig(t)
	cfg.FailOpen = true
	for i, env := range []string{`"DETSHARE_TEIR=latency-critical"`, `"DETSHARE_TIER=burstable","DETSHARE_SMS=8","DETSHARE_MEMROY=1G"`} {
		id := fmt.Sprintf("typo%d", i)
		spec := `{"process":{"env":["PATH=/bin",` + env + `]},"root":{"path":"rootfs"}}`
		p, err := Prepare(context.Background(), cfg, Request{ID: id, Bundle: writeBundle(t, spec)})
		if err == nil || p.Registered || p.FailedOpen != nil {
			t.Fatalf("%s: want a refusal, got %+v, %v", env, p, err)
		}
		for _, want := range []string{"not a DetShare key", "valid keys are DETSHARE_TIER, DETSHARE_SMS"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q lacks %q", env, err, want)
			}
		}
		if _, ok, _ := tenant.Lookup(cfg.RunDir, id); ok {
			t.Errorf("%s: refused container left a registration", id)
		}
	}
	spec := `{"process":{"env":["DETSHARE_LOG_LEVEL=debug","DETSHARE_RUN_DIR=/run/detshare"]},"root":{"path":"rootfs"}}`
	if p, err := Prepare(context.Background(), cfg, Request{ID: "plain", Bundle: writeBundle(t, spec)}); err != nil || p.Registered {
		t.Errorf("container with only DetShare's runtime variables: %+v, %v", p, err)
	}
}

// A container carrying the cluster's allocation (the device plugin's alloc.detshare.io/* annotations) gets at most
// that: its environment's asks above it are capped and logged; one allocated no memory is refused, even under
// fail-open, and nothing is registered (issue 29).
func TestPrepareCapsToTheAllocation(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	logged := logtest.NewGlobal()
	spec := `{"process":{"env":["DETSHARE_TIER=latency-critical","DETSHARE_SMS=100%","DETSHARE_MEMORY=0","DETSHARE_WEIGHT=10000"]},` +
		`"annotations":{"alloc.detshare.io/tier":"burstable","alloc.detshare.io/sms":"16","alloc.detshare.io/memory":"1Gi",` +
		`"alloc.detshare.io/gpu":"0","alloc.detshare.io/weight":"1","alloc.detshare.io/role":"none"},"root":{"path":"rootfs"}}`
	p, err := Prepare(context.Background(), cfg, Request{ID: "c1", Bundle: writeBundle(t, spec), NoPoststopHook: true})
	if err != nil || !p.Registered {
		t.Fatalf("prepare: %+v, %v", p, err)
	}
	reg := p.Result.Registration
	if reg.Tier != table.TierBurstable || reg.SMs != 16 || reg.MemLimit != 1<<30 || reg.Weight != 1 {
		t.Errorf("registered tier %s, %d SMs, memory %d, weight %d; want burstable, 16, 1 GiB, 1", reg.Tier, reg.SMs, reg.MemLimit, reg.Weight)
	}
	var capped []string
	for _, e := range logged.AllEntries() {
		if e.Message == "quota capped to the allocation" {
			capped = append(capped, fmt.Sprint(e.Data["capped"]))
		}
	}
	if all := strings.Join(capped, "\n"); !strings.Contains(all, "DETSHARE_TIER") || !strings.Contains(all, "DETSHARE_MEMORY") ||
		!strings.Contains(all, "DETSHARE_WEIGHT") {
		t.Errorf("capped fields logged: %q, want DETSHARE_TIER, DETSHARE_MEMORY and DETSHARE_WEIGHT", capped)
	}

	cfg.FailOpen = true
	noMem := `{"process":{"env":["PATH=/bin"]},"annotations":{"alloc.detshare.io/tier":"burstable","alloc.detshare.io/sms":"16",` +
		`"alloc.detshare.io/gpu":"0"},"root":{"path":"rootfs"}}`
	if p, err := Prepare(context.Background(), cfg, Request{ID: "c2", Bundle: writeBundle(t, noMem), NoPoststopHook: true}); err == nil ||
		!strings.Contains(err.Error(), "detshare.io/gpu-memory") || p.Registered || p.FailedOpen != nil {
		t.Errorf("allocation without memory: %+v, %v; want a refusal asking for detshare.io/gpu-memory", p, err)
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "c2"); ok {
		t.Error("the refused container is registered")
	}
}
