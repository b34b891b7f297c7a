package view

import (
	"strings"
	"testing"
)

// Overlapping grants are counted once in the GPU's granted SMs, every shared group is named with its holders, and
// temporal mode says why grants overlap there.
func TestAccountCountsOverlapOnce(t *testing.T) {
	g := GPU{Index: 0, SMs: 66, Groups: []uint32{8, 8, 8, 8, 8, 8, 8, 8}, Mode: "temporal"}
	ts := []Tenant{
		{ID: "a", GPU: 0, GuaranteedSMs: 16, GrantedSMs: 64, GrantGroups: 0xff, Demand: 1},
		{ID: "b", GPU: 0, GuaranteedSMs: 16, GrantedSMs: 64, GrantGroups: 0xff},
		{ID: "c", GPU: 1, GrantedSMs: 8, GrantGroups: 0x1},
	}
	a := Account(g, ts)
	if a.Guaranteed != 32 || a.Beyond != 96 || a.Granted != 64 || a.Free != 2 || a.SharedSMs != 64 || len(a.Shared) != 1 ||
		GroupRanges(a.Shared[0].Groups) != "0-7" {
		t.Fatalf("account %+v", a)
	}
	if ts[0].SharedSMs != 64 || strings.Join(ts[0].SharesWith, ",") != "b" || ts[2].SharedSMs != 0 || ts[2].BorrowedSMs != 0 {
		t.Errorf("tenants %+v", ts)
	}
	lines := strings.Join(AccountLines(g, a, ts), "\n")
	for _, want := range []string{"66 SMs: 32 guaranteed, 96 borrowed, 64 granted (each SM once), 2 free", "temporal mode: they take turns",
		"groups 0-7 (64 SMs): a, b (idle)"} {
		if !strings.Contains(lines, want) {
			t.Errorf("lines lack %q:\n%s", want, lines)
		}
	}
	// under share_overlap without MPS nobody takes turns by the token: the grants are unrestricted, the driver
	// time-slices the tenants, and the line says so instead
	for i := range ts {
		ts[i].GrantMode = "unrestricted"
	}
	if lines := strings.Join(AccountLines(g, Account(g, ts), ts), "\n"); !strings.Contains(lines, "the driver time-slices them") ||
		strings.Contains(lines, "take turns") {
		t.Errorf("unrestricted grants in temporal mode:\n%s", lines)
	}
	if GroupRanges([]int{0, 1, 2, 5, 7, 8}) != "0-2,5,7-8" {
		t.Errorf("GroupRanges: %s", GroupRanges([]int{0, 1, 2, 5, 7, 8}))
	}
}
