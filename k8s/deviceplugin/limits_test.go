package deviceplugin

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// The host's limits (--max-weight, --allowed-roles) are what a pod may raise its weight and role to; bad limits are
// refused naming the flag.
func TestHostLimitsBoundWeightAndRole(t *testing.T) {
	inv := testInventory()
	var err error
	inv.Limits, err = ParseLimits(50, "none,decode")
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := container(t, inv, units("sm", 1), units("mem", 1), nil, "DETSHARE_WEIGHT=10000", "DETSHARE_ROLE=decode")
	if err != nil || r.Quota.Weight != 50 || r.Quota.Role != table.RoleDecode {
		t.Errorf("--max-weight 50 --allowed-roles none,decode: weight %d role %s (%v), want 50 and decode", r.Quota.Weight, r.Quota.Role, err)
	}
	for _, bad := range []struct {
		w     uint
		roles string
		want  string
	}{{0, "none", "--max-weight=0"}, {10001, "none", "--max-weight=10001"}, {1, "none,boss", "--allowed-roles"}} {
		if _, err := ParseLimits(bad.w, bad.roles); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseLimits(%d, %q): %v, want an error naming %s", bad.w, bad.roles, err, bad.want)
		}
	}
}
