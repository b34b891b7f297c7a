package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
)

// TestHooksDPoststopDeregisters: the poststop hook exists for the standalone hooks.d path only (podman, CRI-O; the
// shim and the runc wrapper deregister on delete themselves). Run with configs/hooks.d/detshare-poststop.json's
// arguments and the OCI state on stdin, as the engine runs it, it deregisters the container named in the state, and
// running it again, or for a container DetShare never registered, is not an error.
func TestHooksDPoststopDeregisters(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "configs", "hooks.d", "detshare-poststop.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hooksd struct {
		Hook   struct{ Args []string }
		Stages []string
	}
	if err := json.Unmarshal(data, &hooksd); err != nil || len(hooksd.Hook.Args) < 2 || hooksd.Stages[0] != "poststop" {
		t.Fatalf("detshare-poststop.json: %+v %v", hooksd, err)
	}
	runDir := filepath.Join(t.TempDir(), "run")
	if _, err := (tenant.Registrar{DiscoverGPUs: simgpu.Discover}).Register(context.Background(), runDir,
		tenant.Request{ID: "c1", Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=burstable"}}.Resolve()}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := tenant.Lookup(runDir, "c1"); !ok || err != nil {
		t.Fatalf("not registered: %v", err)
	}
	poststop := func(id string) error {
		app := newApp()
		app.Reader = strings.NewReader(`{"ociVersion":"1.0.2","id":"` + id + `","status":"stopped","bundle":"/b"}`)
		args := append([]string{hooksd.Hook.Args[0], "--run-dir", runDir}, hooksd.Hook.Args[1:]...)
		return app.Run(args)
	}
	if err := poststop("c1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := tenant.Lookup(runDir, "c1"); ok {
		t.Fatal("c1 still registered after the poststop hook")
	}
	if _, err := os.Stat(filepath.Join(runDir, "tenants", "c1")); !os.IsNotExist(err) {
		t.Errorf("tenant directory left: %v", err)
	}
	for _, id := range []string{"c1", "never-registered"} {
		if err := poststop(id); err != nil {
			t.Errorf("poststop of %s: %v", id, err)
		}
	}
}
