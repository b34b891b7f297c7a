package table

import "fmt"

// The words users write and read for the table's Tier*, Role* and Mode* values: quota keys (cgroupgpu/quota),
// tenants.max_tier (internal/config), the scheduler's logs (sched/policy), `detshare status` and the metrics
// (sched/view). This is the one place they are spelled; the values are the C enums of detshare_table.h
// (TestABIMatchesC).
var (
	tierNames = [...]string{TierBestEffort: "best-effort", TierBurstable: "burstable", TierLatencyCritical: "latency-critical"}
	roleNames = [...]string{RoleNone: "none", RolePrefill: "prefill", RoleDecode: "decode"}
	modeNames = [...]string{ModeNone: "none", ModeSpatial: "spatial", ModeTemporal: "temporal",
		ModeUnrestricted: "unrestricted"}
)

// TierName names a Tier* value; a value outside the enum reads "tier(N)".
func TierName(v uint32) string { return name(tierNames[:], "tier", v) }

// RoleName names a Role* value; a value outside the enum reads "role(N)".
func RoleName(v uint32) string { return name(roleNames[:], "role", v) }

// ModeName names a Mode* value; a value outside the enum reads "mode(N)".
func ModeName(v uint32) string { return name(modeNames[:], "mode", v) }

// ParseTier returns the Tier* value named s (exactly as TierName spells it).
func ParseTier(s string) (uint32, bool) { return parse(tierNames[:], s) }

// ParseRole returns the Role* value named s (exactly as RoleName spells it).
func ParseRole(s string) (uint32, bool) { return parse(roleNames[:], s) }

func name(names []string, kind string, v uint32) string {
	if int64(v) < int64(len(names)) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", kind, v)
}

func parse(names []string, s string) (uint32, bool) {
	for v, n := range names {
		if n == s {
			return uint32(v), true
		}
	}
	return 0, false
}
