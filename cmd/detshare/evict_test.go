package main

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/view"
)

// TestEvictDeregistersATenant: `detshare evict` is the operator's remedy when the reaper cannot tell a tenant is
// gone (issue 27): it frees the slot and the guarantee and removes the tenant's files, as the reaper would; status
// no longer lists it; an unknown id fails naming it and the registered ones; nothing is changed by a refusal.
func TestEvictDeregistersATenant(t *testing.T) {
	dir := viewRunDir(t)
	tb, err := table.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	var train table.Registration
	for _, r := range tb.List() {
		if r.ID == "train" {
			train = r
		}
	}
	p := table.NewPaths(dir)
	// What the shim leaves for a container tenant (its quota files); the reaper removes it with the slot.
	if err := os.MkdirAll(p.TenantDir("train"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{train.ClientPagePath, p.TenantDir("train")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("before evict: %v", err)
		}
	}

	out, err := runCLI(t, "--run-dir", dir, "evict", "train")
	if err != nil {
		t.Fatalf("evict: %v\n%s", err, out)
	}
	if !strings.Contains(out, "train") {
		t.Errorf("evict says nothing about what it did: %q", out)
	}
	if n := len(tb.List()); n != 1 || tb.List()[0].ID == "train" {
		t.Fatalf("after evict: %+v", tb.List())
	}
	if st := tb.Container(train.Slot).State; st != table.SlotFree {
		t.Fatalf("slot %d state %d after evict, want free", train.Slot, st)
	}
	for _, f := range []string{train.ClientPagePath, p.TenantDir("train")} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind by evict: %v", f, err)
		}
	}
	js, err := captureRun(t, "--run-dir", dir, "status", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var s view.Snapshot
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		t.Fatal(err)
	}
	for _, v := range s.Tenants {
		if v.ID == "train" {
			t.Fatalf("status still lists the evicted tenant: %+v", s.Tenants)
		}
	}

	// Refusals name what was wrong and change nothing.
	long := "an-extremely-long-container-id-0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"ghost"}, []string{`"ghost"`, "not registered", long}},
		{[]string{"train"}, []string{`"train"`, "not registered", long}},
		{nil, []string{"tenant-id", "detshare tenants"}},
		{[]string{"a", "b"}, []string{"tenant-id", "2"}},
		{[]string{"../x"}, []string{"../x"}},
	} {
		out, err := runCLI(t, append([]string{"--run-dir", dir, "evict"}, c.args...)...)
		if err == nil {
			t.Fatalf("evict %q succeeded: %s", c.args, out)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("evict %q: error %q lacks %q", c.args, err, w)
			}
		}
		if n := len(tb.List()); n != 1 {
			t.Fatalf("refused evict %q changed the table: %+v", c.args, tb.List())
		}
	}
	if _, err := runCLI(t, "--run-dir", dir+"/missing", "evict", "x"); err == nil || !strings.Contains(err.Error(), dir+"/missing") {
		t.Errorf("evict without a table: %v; want the run directory named", err)
	}
	help, err := runCLI(t, "evict", "--help")
	if err != nil || !strings.Contains(help, "held until they exit") || !strings.Contains(help, "tenant-id") {
		t.Errorf("evict --help: %v\n%s", err, help)
	}
}
