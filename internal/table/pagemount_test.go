package table

import "testing"

// TestPageMountsDecidedBySchedulerElseByDefault: until a scheduler decided (tenants.page_mounts), a registrar applies
// "auto" itself (on for /run/detshare only), so a tenant registered between a scheduler's start and its decision is
// not left without the bound; once decided, the decision holds either way.
func TestPageMountsDecidedBySchedulerElseByDefault(t *testing.T) {
	if !PageMountsByDefault("/run/detshare/") || PageMountsByDefault("/tmp/x/run") {
		t.Fatal("auto: want on for /run/detshare, off elsewhere")
	}
	tb := newTable(t)
	if tb.PageMounts() {
		t.Error("undecided, in a run directory other than /run/detshare: want off")
	}
	tb.SetPageMounts(true)
	if !tb.PageMounts() {
		t.Error("decided on: want on")
	}
	tb.SetPageMounts(false)
	if tb.PageMounts() {
		t.Error("decided off: want off")
	}
	if tb.Header().Flags&HeaderFlagPageMountsSet == 0 {
		t.Error("a decision is not recorded as one")
	}
}
