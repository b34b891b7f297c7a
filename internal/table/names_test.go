package table

import "testing"

// TestEnumNamesRoundTrip: every value of the C enums (checked against detshare_table.h by TestABIMatchesC) has one
// name that parses back to it, and values outside the enums are shown, not mistaken for a valid one.
func TestEnumNamesRoundTrip(t *testing.T) {
	for _, v := range []uint32{TierBestEffort, TierBurstable, TierLatencyCritical} {
		if got, ok := ParseTier(TierName(v)); !ok || got != v {
			t.Errorf("tier %d: %q parses to %d %v", v, TierName(v), got, ok)
		}
	}
	for _, v := range []uint32{RoleNone, RolePrefill, RoleDecode} {
		if got, ok := ParseRole(RoleName(v)); !ok || got != v {
			t.Errorf("role %d: %q parses to %d %v", v, RoleName(v), got, ok)
		}
	}
	if TierName(TierLatencyCritical) != "latency-critical" || RoleName(RoleDecode) != "decode" ||
		ModeName(ModeUnrestricted) != "unrestricted" || ModeName(ModeSpatial) != "spatial" {
		t.Error("names differ from the words of the quota keys and the status output")
	}
	if TierName(7) != "tier(7)" || RoleName(9) != "role(9)" || ModeName(4) != "mode(4)" {
		t.Error("an out-of-range value must be shown as such")
	}
	if _, ok := ParseTier("Latency-Critical"); ok {
		t.Error("ParseTier is exact; callers normalise")
	}
}
