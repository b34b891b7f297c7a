package config

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/sched/policy"
)

func TestExampleFileIsTheDefaults(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	ex := filepath.Join(filepath.Dir(file), "..", "..", "configs", "detshare", "config.toml")
	c, err := Load(ex)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("configs/detshare/config.toml differs from Default():\n%+v\n%+v", c, Default())
	}
}

func TestMissingFileGivesDefaults(t *testing.T) {
	c, err := Load(filepath.Join(t.TempDir(), "none.toml"))
	if err != nil || !reflect.DeepEqual(c, Default()) {
		t.Fatal(c, err)
	}
}

func TestParse(t *testing.T) {
	c, err := Parse("t", []byte("[scheduler]\npolicy = \"tpot-first\"\nquantum = \"2ms\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	o := c.PolicyOptions()
	if policy.Kind(o.Kind) != policy.TPOTFirst || o.Quantum != 2*time.Millisecond || c.Metrics.Listen != "127.0.0.1:0" {
		t.Fatalf("%+v %+v", o, c)
	}
	if c, err := Parse("t", []byte("[scheduler]\nbe_floor = 0\n")); err != nil || c.PolicyOptions().Floor != 0 {
		t.Fatalf("be_floor = 0 (pause lower tiers while latency-critical is busy): %v", err)
	}
	bad := []struct{ in, want string }{
		{"[scheduler]\npolicy = \"fast\"", `scheduler.policy: policy "fast": allowed values are "throughput-oriented", "tpot-first"`},
		{"[scheduler]\nquantum = \"soon\"", `"soon" is not a duration`},
		{"[scheduler]\nquantum = \"1ns\"", "scheduler.quantum = 1ns: allowed values are 100µs..10s"},
		{"[scheduler]\ndecode_boost = 0", "scheduler.decode_boost = 0: allowed values are 1..100"},
		{"[scheduler]\nnarrow_groups = -1", "scheduler.narrow_groups = -1: allowed values are 0 (off) .. 63 SM groups"},
		{"[scheduler]\nnarrow_groups = 64", "scheduler.narrow_groups = 64: allowed values are 0 (off) .. 63 SM groups"},
		{"[scheduler]\nquantum = \"60ms\"", "scheduler.max_quantum = 50ms: must be >= scheduler.quantum (60ms)"},
		{"[scheduler]\npolcy = \"x\"", `unknown key "scheduler.polcy"`},
		{"[mps]\ncontrol = \"\"", "mps.control"},
		{"[tenants]\nmax_weight = 0", "tenants.max_weight = 0: allowed values are 1..10000"},
		{"[tenants]\nmax_tier = \"gold\"", `tenants.max_tier = "gold": allowed values are best-effort, burstable, latency-critical`},
		{"[tenants]\ntrusted = [\"[\"]", `tenants.trusted: "[" is not a pattern`},
		{"[tenants]\ndemand_window = \"1ms\"", "tenants.demand_window = 1ms: allowed values are 100ms..1m0s"},
		{"[scheduler]\nbe_floor = -1", "scheduler.be_floor = -1: allowed values are 0..64"},
		{"[scheduler]\nbe_floor = 65", "scheduler.be_floor = 65: allowed values are 0..64"},
	}
	for _, b := range bad {
		_, err := Parse("t", []byte(b.in))
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%q: error %v, want it to contain %q", b.in, err, b.want)
		}
	}
}

func TestUnreadableFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil { // a directory
		t.Fatal("reading a directory as config must fail")
	}
	p := filepath.Join(dir, "c.toml")
	os.WriteFile(p, []byte("[scheduler"), 0o644)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("syntax error must name the file: %v", err)
	}
}

func TestTenantCeilings(t *testing.T) {
	c, err := Parse("t", []byte("[tenants]\nmax_weight = 10\nmax_tier = \"burstable\"\ntrusted = [\"prod-*\", \"ops\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenants.MaxWeight != 10 || c.Tenants.MaxTier != "burstable" {
		t.Fatalf("%+v", c.Tenants)
	}
	for id, want := range map[string]bool{"prod-a": true, "ops": true, "dev-a": false, "prod": false, "": false} {
		if got := c.Tenants.Trusts(id); got != want {
			t.Errorf("Trusts(%q) = %v, want %v", id, got, want)
		}
	}
	if Default().Tenants.Trusts("anything") {
		t.Error("the default configuration trusts a tenant")
	}
}
