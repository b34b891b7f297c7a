package hook

import (
	"context"
	"errors"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook/specmod"
)

// TestAttachOnePathForBothAppliers: the standalone hook's applier (bind mounts) goes through the same routine as
// the spec editor: a stale registration of the ID is replaced for it too, the tenant it is handed carries the
// registration's quota file and no poststop hook, and an applier that fails leaves no registration behind.
func TestAttachOnePathForBothAppliers(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	spec, err := specmod.Parse([]byte(`{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	c := container{id: "c1", spec: spec}
	var got []specmod.Tenant
	record := func(tn specmod.Tenant) error { got = append(got, tn); return nil }
	for i := 0; i < 2; i++ { // the second attach finds a stale registration under the same ID
		p, err := attach(context.Background(), cfg, c, record)
		if err != nil || !p.Registered {
			t.Fatalf("round %d: %+v, %v", i, p, err)
		}
	}
	if len(got) != 2 || got[1].QuotaFile == "" || got[1].HookPath != "" || got[1].ID != "c1" {
		t.Fatalf("applier was handed %+v", got)
	}
	if _, err := attach(context.Background(), cfg, c, func(specmod.Tenant) error { return errors.New("mount failed") }); err == nil {
		t.Fatal("a failing applier must refuse the container (fail-closed by default)")
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "c1"); ok {
		t.Fatal("a failing applier left the registration behind")
	}
}
