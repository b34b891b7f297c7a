package table

import "testing"

// TestEnumNamesRoundTrip: every value of the C enums (checked against detshare_table.h by TestABIMatchesC) has one
// name that parses back to it, and values outside the enums are shown, not mistaken for a valid one.
func TestEnumNamesRoundTrip(t *testing.T) {
	for _, v := range []Tier{TierBestEffort, TierBurstable, TierLatencyCritical} {
		if got, err := ParseTier(v.String()); err != nil || got != v {
			t.Errorf("tier %d: %q parses to %d %v", v, v.String(), got, err)
		}
	}
	for _, v := range []Role{RoleNone, RolePrefill, RoleDecode} {
		if got, err := ParseRole(v.String()); err != nil || got != v {
			t.Errorf("role %d: %q parses to %d %v", v, v.String(), got, err)
		}
	}
	if TierLatencyCritical.String() != "latency-critical" || RoleDecode.String() != "decode" ||
		ModeName(ModeUnrestricted) != "unrestricted" || ModeName(ModeSpatial) != "spatial" {
		t.Error("names differ from the words of the quota keys and the status output")
	}
	if Tier(7).String() != "tier(7)" || Role(9).String() != "role(9)" || ModeName(4) != "mode(4)" {
		t.Error("an out-of-range value must be shown as such")
	}
	if _, err := ParseTier("Latency-Critical"); err == nil {
		t.Error("ParseTier is exact; callers normalise")
	}
}
