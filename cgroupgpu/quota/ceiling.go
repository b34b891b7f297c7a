package quota

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/detshare/detshare/internal/quote"
	"github.com/detshare/detshare/internal/table"
)

// The ceiling: what a cluster allocated a container. DetShare's Kubernetes device plugin sets it as container
// annotations (alloc.detshare.io/<field>, which kubelet passes in the container's CRI config and a pod cannot set),
// its DRA driver as CDI environment (DETSHARE_ALLOC_<FIELD>, which replaces any variable of that name the pod sets).
// A container that carries a ceiling is a tenant whose quota defaults to the ceiling; its own annotations, labels and
// environment may lower each field, never raise it: a field asked above the ceiling is capped to it
// (Resolved.Capped says which, for the log). A ceiling seen in both places is their minimum, so a forged one can
// only lower what the cluster allocated.
//
//	tier    the highest tier allowed (missing: best-effort)
//	sms     the SMs allocated (missing: 0, no guarantee)
//	memory  the bytes of GPU memory allocated (missing: none, and the container is refused: the cluster accounted
//	        no memory for it, and an unlimited tenant would take what others were promised)
//	gpu     the allocated GPU (index or UUID)
//	weight  the highest weight allowed (missing: 1)
//	role    the roles allowed, comma-separated (missing: none)

// CeilingAnnotationPrefix prefixes the ceiling's annotation keys; CeilingEnvPrefix its environment keys.
const (
	CeilingAnnotationPrefix = "alloc.detshare.io/"
	CeilingEnvPrefix        = "DETSHARE_ALLOC_"
)

// CRIContainerType (containerd's CRI plugin) and CRIOContainerType (CRI-O) mark a container a Kubernetes runtime
// created: the runtime sets one on every container of a pod ("sandbox" on its pause container), and a pod cannot set
// or remove it.
const (
	CRIContainerType  = "io.kubernetes.cri.container-type"
	CRIOContainerType = "io.kubernetes.cri-o.ContainerType"
)

// CRIContainerTypeAnnotations are both.
var CRIContainerTypeAnnotations = []string{CRIContainerType, CRIOContainerType}

// IsKubernetes tells whether annotations are those of a workload container created through CRI (kubelet), not a
// pod's sandbox (pause) container. Such a container's quota is what the cluster allocated it: one with no
// allocation that sets quota keys of its own is refused.
func IsKubernetes(annotations map[string]string) bool {
	for _, k := range CRIContainerTypeAnnotations {
		if v, ok := annotations[k]; ok {
			return v != "sandbox"
		}
	}
	return false
}

// noAllocation is the refusal of a Kubernetes container that sets its own quota without an allocation.
const noAllocation = "this Kubernetes container has no DetShare allocation (no alloc.detshare.io/* from the device " +
	"plugin, no DETSHARE_ALLOC_* from a DRA claim), so it may not choose its own quota: ask for detshare.io/gpu-memory " +
	"(and detshare.io/gpu for guaranteed SMs) or a ResourceClaim of DeviceClass gpu.detshare.io, whose allocation its " +
	"own keys may then lower, or drop the DetShare keys to run without a GPU"

// SourceAllocation marks a field that took its value from the ceiling.
const SourceAllocation Source = "allocation"

// CeilingFields are the fields a ceiling bounds.
var CeilingFields = []Field{FieldTier, FieldSMs, FieldMemory, FieldGPU, FieldWeight, FieldRole}

// CeilingAnnotationKey is the ceiling's annotation key of f.
func CeilingAnnotationKey(f Field) string { return CeilingAnnotationPrefix + string(f) }

// CeilingEnvKey is the ceiling's environment key of f.
func CeilingEnvKey(f Field) string { return CeilingEnvPrefix + strings.ToUpper(string(f)) }

// Ceiling is what the cluster allocated a container: the most its quota may be.
type Ceiling struct {
	Tier      table.Tier
	SMs       uint32 // guaranteed SMs allocated
	Memory    uint64 // bytes allocated; 0: none
	GPU       GPUSelector
	MaxWeight uint32
	Roles     []table.Role
	// Keys records, per field, the key it was read from (for messages).
	Keys map[Field]string
}

// NoCeiling is the ceiling of a container that carries no ceiling key: nothing allocated, best-effort.
func NoCeiling() Ceiling {
	return Ceiling{Tier: table.TierBestEffort, GPU: GPUSelector{Auto: true}, MaxWeight: 1, Roles: []table.Role{table.RoleNone}}
}

// Annotations renders fields of c (none named: all) as the device plugin's container annotations.
func (c Ceiling) Annotations(fields ...Field) map[string]string {
	m := map[string]string{}
	for f, v := range c.values(fields) {
		m[CeilingAnnotationKey(f)] = v
	}
	return m
}

// Env renders fields of c (none named: all) as the DRA driver's CDI environment (KEY=VALUE, in CeilingFields order).
func (c Ceiling) Env(fields ...Field) []string {
	vals := c.values(fields)
	var env []string
	for _, f := range CeilingFields {
		if v, ok := vals[f]; ok {
			env = append(env, CeilingEnvKey(f)+"="+v)
		}
	}
	return env
}

func (c Ceiling) values(fields []Field) map[Field]string {
	if len(fields) > 0 {
		all := c.values(nil)
		m := map[Field]string{}
		for _, f := range fields {
			if v, ok := all[f]; ok {
				m[f] = v
			}
		}
		return m
	}
	m := map[Field]string{FieldTier: c.Tier.String(), FieldSMs: strconv.FormatUint(uint64(c.SMs), 10),
		FieldWeight: strconv.FormatUint(uint64(max(c.MaxWeight, 1)), 10)}
	if c.Memory > 0 {
		m[FieldMemory] = exactBytes(c.Memory)
	}
	if !c.GPU.Auto {
		m[FieldGPU] = c.GPU.String()
	}
	roles := make([]string, 0, len(c.Roles))
	for _, r := range c.Roles {
		roles = append(roles, r.String())
	}
	if len(roles) == 0 {
		roles = []string{table.RoleNone.String()}
	}
	m[FieldRole] = strings.Join(roles, ",")
	return m
}

// ParseRoles parses a comma-separated list of roles (none, prefill, decode).
func ParseRoles(s string) ([]table.Role, error) {
	var out []table.Role
	for _, p := range strings.Split(s, ",") {
		r, err := ParseRole(p)
		if err != nil {
			return nil, fmt.Errorf("a comma-separated list of roles: %w", err)
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// set parses value into field f of c, lowering what is there (the minimum of two sources).
func (c *Ceiling) set(f Field, key, value string, first bool) error {
	bad := func(allowed string) error {
		return &FieldError{Key: key, Value: value, Source: SourceAllocation, Allowed: allowed}
	}
	switch f {
	case FieldTier:
		t, err := ParseTier(value)
		if err != nil {
			return bad(err.Error())
		}
		if first || t < c.Tier {
			c.Tier = t
		}
	case FieldSMs:
		s, err := ParseSMs(value)
		if err != nil || s.Percent != 0 {
			return bad(fmt.Sprintf("a number of SMs 0..%d", maxSMs))
		}
		if first || s.Count < c.SMs {
			c.SMs = s.Count
		}
	case FieldMemory:
		m, err := ParseMemory(value)
		if err != nil || m.Percent != 0 || m.Bytes == 0 {
			return bad("bytes with an optional unit, at least 1 byte")
		}
		if first || m.Bytes < c.Memory {
			c.Memory = m.Bytes
		}
	case FieldGPU:
		g, err := ParseGPU(value)
		if err != nil || g.Auto {
			return bad("a GPU index 0..15 or a GPU UUID")
		}
		if !first && g != c.GPU {
			return bad(fmt.Sprintf("the allocation names two GPUs, %s and %s", c.GPU, g))
		}
		c.GPU = g
	case FieldWeight:
		w, err := ParseWeight(value)
		if err != nil {
			return bad(err.Error())
		}
		if first || w < c.MaxWeight {
			c.MaxWeight = w
		}
	case FieldRole:
		rs, err := ParseRoles(value)
		if err != nil {
			return bad(err.Error())
		}
		if first {
			c.Roles = rs
		} else {
			c.Roles = slices.DeleteFunc(c.Roles, func(r table.Role) bool { return !slices.Contains(rs, r) })
		}
	}
	c.Keys[f] = key
	return nil
}

// ceilingOf reads the ceiling from a container's annotations and environment; ok tells whether it carries one.
// Unknown alloc.detshare.io/ and DETSHARE_ALLOC_ keys are reported by checkKeys.
func ceilingOf(annotations, envm map[string]string) (c Ceiling, ok bool, err error) {
	c = NoCeiling()
	c.Keys = map[Field]string{}
	var errs []error
	for _, f := range CeilingFields {
		first := true
		for _, src := range []struct {
			key string
			kv  map[string]string
		}{{CeilingAnnotationKey(f), annotations}, {CeilingEnvKey(f), envm}} {
			v, present := src.kv[src.key]
			if !present {
				continue
			}
			ok = true
			if err := c.set(f, src.key, v, first); err != nil {
				errs = append(errs, err)
			}
			first = false
		}
	}
	if len(errs) > 0 {
		return c, ok, errors.Join(errs...)
	}
	return c, ok, nil
}

func isCeilingKey(key string) bool {
	for _, f := range CeilingFields {
		if key == CeilingAnnotationKey(f) || key == CeilingEnvKey(f) {
			return true
		}
	}
	return false
}

// defaults starts a quota under c: the allocation itself, with the configured weight up to c's.
func (c Ceiling) defaults(q Quota) Quota {
	set := func(f Field, v string) {
		q.Source[f] = SourceAllocation
		q.Spec[f] = v
	}
	q.Tier = c.Tier
	set(FieldTier, c.Tier.String())
	q.SMs = SMs{}
	if c.Tier.Guaranteed() && c.SMs > 0 {
		q.SMs = SMs{Count: c.SMs}
		set(FieldSMs, strconv.FormatUint(uint64(c.SMs), 10))
	}
	q.Memory = Memory{Bytes: c.Memory}
	set(FieldMemory, exactBytes(c.Memory))
	if !c.GPU.Auto {
		q.GPU = c.GPU
		set(FieldGPU, c.GPU.String())
	}
	if q.Weight > c.MaxWeight {
		q.Weight = c.MaxWeight
	}
	if !slices.Contains(c.Roles, q.Role) {
		q.Role = table.RoleNone
	}
	return q
}

// capTo lowers every field of q that asks above c to c, and says which (for the log). SMs and memory given as a
// percent of the GPU are capped when the quota is placed (Place), where the GPU is known.
func (c Ceiling) capTo(q Quota) (Quota, []string) {
	var capped []string
	note := func(f Field, asked, ceiling string) {
		src := q.SourceOf(f)
		key := c.Keys[f]
		if key == "" { // the allocation does not name the field: nothing of it was allocated
			key = CeilingAnnotationKey(f)
		}
		capped = append(capped, fmt.Sprintf("%s=%s (%s) is above what the cluster allocated (%s=%s): capped",
			quote.Bounded(KeyFor(f, src)), quote.Q(asked), src, key, ceiling))
		q.Source[f] = SourceAllocation
		q.Spec[f] = ceiling
	}
	if q.Tier > c.Tier {
		note(FieldTier, q.Tier.String(), c.Tier.String())
		q.Tier = c.Tier
	}
	if !q.SMs.IsZero() && (c.SMs == 0 || q.SMs.Percent == 0 && q.SMs.Count > c.SMs) {
		note(FieldSMs, q.specOf(FieldSMs, q.SMs.String()), strconv.FormatUint(uint64(c.SMs), 10))
		q.SMs = SMs{Count: c.SMs}
	}
	if q.Memory.IsZero() || q.Memory.Percent == 0 && q.Memory.Bytes > c.Memory {
		if c.Memory > 0 && q.SourceOf(FieldMemory) != SourceAllocation {
			note(FieldMemory, q.specOf(FieldMemory, q.Memory.String()), exactBytes(c.Memory))
		}
		q.Memory = Memory{Bytes: c.Memory}
	}
	if !c.GPU.Auto && q.GPU != c.GPU {
		if !q.GPU.Auto {
			note(FieldGPU, q.GPU.String(), c.GPU.String())
		}
		q.GPU = c.GPU
	}
	if q.Weight > c.MaxWeight {
		note(FieldWeight, strconv.FormatUint(uint64(q.Weight), 10), strconv.FormatUint(uint64(c.MaxWeight), 10))
		q.Weight = c.MaxWeight
	}
	if !slices.Contains(c.Roles, q.Role) {
		allowed := make([]string, len(c.Roles))
		for i, r := range c.Roles {
			allowed[i] = r.String()
		}
		note(FieldRole, q.Role.String(), strings.Join(allowed, ","))
		q.Role = table.RoleNone
	}
	return q, capped
}

// check refuses what a ceiling cannot serve: a container the cluster allocated no GPU memory.
func (c Ceiling) check() error {
	if c.Memory == 0 {
		key := c.Keys[FieldMemory]
		if key == "" {
			key = CeilingAnnotationKey(FieldMemory)
		}
		return &FieldError{Key: key, Value: "", Source: SourceAllocation, Allowed: "the cluster allocated this container " +
			"no GPU memory, and a DetShare tenant's memory is what was allocated, never unlimited: ask for " +
			"detshare.io/gpu-memory beside detshare.io/gpu (device plugin), or memory in the claim's DetShareConfig (DRA)"}
	}
	return nil
}

// exactBytes renders b as ParseMemory reads it back exactly: whole GiB or MiB with their unit, else bytes.
func exactBytes(b uint64) string {
	switch {
	case b%(1<<30) == 0:
		return strconv.FormatUint(b>>30, 10) + "Gi"
	case b%(1<<20) == 0:
		return strconv.FormatUint(b>>20, 10) + "Mi"
	}
	return strconv.FormatUint(b, 10)
}
