package table

import (
	"fmt"
	"strings"
)

// The words users write and read for the table's Tier*, Role*, Mode* and MPS* values: quota keys (cgroupgpu/quota),
// tenants.max_tier (internal/config), the scheduler's logs (sched/policy), `detshare status` and the metrics
// (sched/view). This is the one place they are spelled; the values are the C enums of detshare_table.h
// (TestABIMatchesC).
var (
	tierNames = [...]string{TierBestEffort: "best-effort", TierBurstable: "burstable", TierLatencyCritical: "latency-critical"}
	roleNames = [...]string{RoleNone: "none", RolePrefill: "prefill", RoleDecode: "decode"}
	modeNames = [...]string{ModeNone: "none", ModeSpatial: "spatial", ModeTemporal: "temporal",
		ModeUnrestricted: "unrestricted"}
	mpsNames = [...]string{MPSUnknown: "unknown", MPSAbsent: "absent", MPSRunning: "running", MPSFailed: "failed"}
)

// Tier is a tenant's SLO tier (C enum DS_TIER_*, struct ds_container.tier). Its values are ordered by priority, so
// comparing two tiers compares their rank.
type Tier uint32

// Role is a tenant's LLM-serving phase for TPOT-First (C enum DS_ROLE_*, struct ds_container.role).
type Role uint32

// String names t; a value outside the enum reads "tier(N)".
func (t Tier) String() string { return name(tierNames[:], "tier", uint32(t)) }

// Guaranteed reports whether the tier holds an SM guarantee (burstable and latency-critical).
func (t Tier) Guaranteed() bool { return t == TierBurstable || t == TierLatencyCritical }

// Valid reports whether t is one of the enum's values.
func (t Tier) Valid() bool { return t <= TierLatencyCritical }

// String names r; a value outside the enum reads "role(N)".
func (r Role) String() string { return name(roleNames[:], "role", uint32(r)) }

// Valid reports whether r is one of the enum's values.
func (r Role) Valid() bool { return r <= RoleDecode }

// ModeName names a Mode* value; a value outside the enum reads "mode(N)".
func ModeName(v uint32) string { return name(modeNames[:], "mode", v) }

// MPSName names a GPU.MPSState value (MPS*); a value outside the enum reads "mps(N)".
func MPSName(v uint32) string { return name(mpsNames[:], "mps", v) }

// ParseTier returns the tier named s, spelled exactly as Tier.String spells it (callers normalise case and space).
func ParseTier(s string) (Tier, error) {
	if v, ok := parse(tierNames[:], s); ok {
		return Tier(v), nil
	}
	return 0, fmt.Errorf("%q: allowed values are %s", s, strings.Join(tierNames[:], ", "))
}

// ParseRole returns the role named s, spelled exactly as Role.String spells it (callers normalise case and space).
func ParseRole(s string) (Role, error) {
	if v, ok := parse(roleNames[:], s); ok {
		return Role(v), nil
	}
	return 0, fmt.Errorf("%q: allowed values are %s", s, strings.Join(roleNames[:], ", "))
}

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
