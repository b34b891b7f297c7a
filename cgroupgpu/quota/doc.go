// Package quota is DetShare's per-tenant GPU "cgroup" model: the quota fields (tier, SMs, memory, weight, role,
// GPU, lend), where each comes from, their parsing and validation, rounding SMs to the GPU's SM-group split,
// admission (guarantees must fit on the GPU), and the quota file that libdetshare reads.
//
// Sources, highest precedence first (Resolve):
//
//	OCI annotation   detshare.io/<field>
//	container label  detshare.io/<field>
//	environment      DETSHARE_<FIELD>   (in the container spec)
//	defaults         the configured defaults (Default() when none are configured)
//
// Fields and values:
//
//	tier    latency-critical | burstable | best-effort
//	sms     0 (no guarantee) | N (SMs) | P% (1..100 percent of the GPU); rounded up to whole SM groups
//	memory  0 (unlimited) | bytes with optional unit K M G T (10^3..) or Ki Mi Gi Ti (2^10..), optional B | P%
//	weight  1..10000 (share of what is not guaranteed)
//	role    none | prefill | decode  (TPOT-First)
//	gpu     auto | index | UUID (GPU-… or SIM-… for the simulated GPU, a test double)
//	lend    true | false (a latency-critical tenant lets its idle groups be lent)
//
// Every validation error names the key as the user wrote it, the value, the source and what is allowed, e.g.
// `detshare.io/sms="200%" (annotation): percent must be in 1..100`. This package is the one implementation of quota
// parsing: the hook, the shim, the runc wrapper and `detshare run` reach it through cgroupgpu/tenant.
package quota
