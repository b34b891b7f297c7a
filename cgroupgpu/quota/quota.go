package quota

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/detshare/detshare/internal/quote"
	"github.com/detshare/detshare/internal/table"
)

// Field is a quota key (the <field> of detshare.io/<field> and DETSHARE_<FIELD>).
type Field string

// The quota fields.
const (
	FieldTier   Field = "tier"
	FieldSMs    Field = "sms"
	FieldMemory Field = "memory"
	FieldWeight Field = "weight"
	FieldRole   Field = "role"
	FieldGPU    Field = "gpu"
	FieldLend   Field = "lend"
	// FieldPinned keeps a latency-critical tenant on exactly its guarantee (it never expands over lower tiers).
	FieldPinned Field = "pinned"
	// FieldSLOP99 is a latency-critical tenant's P99 target (detshare.io/slo-p99=5ms, DETSHARE_SLO_P99): the
	// scheduler sizes its expansion and its neighbours' throttling from the latency the library observes.
	FieldSLOP99 Field = "slo-p99"
)

// Fields lists every field in a fixed order.
var Fields = []Field{FieldTier, FieldSMs, FieldMemory, FieldWeight, FieldRole, FieldGPU, FieldLend, FieldPinned,
	FieldSLOP99}

// AnnotationPrefix prefixes annotation and label keys.
const AnnotationPrefix = "detshare.io/"

// EnvPrefix prefixes environment keys.
const EnvPrefix = "DETSHARE_"

// AnnotationKey is the annotation/label key of f.
func (f Field) AnnotationKey() string { return AnnotationPrefix + string(f) }

// EnvKey is the environment key of f.
func (f Field) EnvKey() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(string(f), "-", "_"))
}

// Source says where a field's value came from.
type Source string

// The sources, highest precedence first.
const (
	SourceAnnotation Source = "annotation"
	SourceLabel      Source = "label"
	SourceEnv        Source = "env"
	SourceDefault    Source = "default"
	SourceFlag       Source = "flag" // `detshare run` flags, given as annotations of highest precedence
)

// SMs is an SM request: a count, a percent of the GPU, or nothing (both zero).
type SMs struct {
	Count   uint32
	Percent uint32
}

// IsZero tells whether no SMs are requested.
func (s SMs) IsZero() bool { return s.Count == 0 && s.Percent == 0 }

func (s SMs) String() string {
	if s.Percent != 0 {
		return fmt.Sprintf("%d%%", s.Percent)
	}
	return strconv.FormatUint(uint64(s.Count), 10)
}

// Wanted returns the SMs requested on a GPU with smCount SMs (percent rounded up).
func (s SMs) Wanted(smCount uint32) uint32 {
	if s.Percent != 0 {
		return uint32((uint64(smCount)*uint64(s.Percent) + 99) / 100)
	}
	return s.Count
}

// Memory is a memory limit: bytes, a percent of the GPU's memory, or unlimited (both zero).
type Memory struct {
	Bytes   uint64
	Percent uint32
}

// IsZero tells whether the memory is unlimited.
func (m Memory) IsZero() bool { return m.Bytes == 0 && m.Percent == 0 }

func (m Memory) String() string {
	if m.Percent != 0 {
		return fmt.Sprintf("%d%%", m.Percent)
	}
	return strconv.FormatUint(m.Bytes, 10)
}

// Limit returns the limit in bytes on a GPU with memTotal bytes (0 = unlimited).
func (m Memory) Limit(memTotal uint64) uint64 {
	if m.Percent != 0 {
		return new(big.Int).Div(new(big.Int).Mul(new(big.Int).SetUint64(memTotal), big.NewInt(int64(m.Percent))),
			big.NewInt(100)).Uint64()
	}
	return m.Bytes
}

// GPUSelector picks a GPU: Auto, an index, or a UUID.
type GPUSelector struct {
	Auto  bool
	Index int // valid when !Auto && UUID == ""
	UUID  string
}

func (g GPUSelector) String() string {
	switch {
	case g.Auto:
		return "auto"
	case g.UUID != "":
		return g.UUID
	}
	return strconv.Itoa(g.Index)
}

// Quota is one tenant's resolved quota, with the source of each field.
type Quota struct {
	Tier   table.Tier
	SMs    SMs
	Memory Memory
	Weight uint32
	Role   table.Role
	GPU    GPUSelector
	Lend   bool
	Pinned bool
	SLOP99 time.Duration // 0 = none
	// Ceiling is what the cluster allocated the tenant (nil: no allocation): Place caps SMs and memory to it.
	Ceiling *Ceiling
	// Source records, per field, which source won.
	Source map[Field]Source
	// Spec records, per field, the text that was parsed (empty for untouched defaults).
	Spec map[Field]string
}

// Default is the quota of a tenant that says nothing: best-effort, no SM guarantee, unlimited memory, weight 1,
// no role, GPU auto.
func Default() Quota {
	return Quota{Tier: table.TierBestEffort, Weight: 1, Role: table.RoleNone, GPU: GPUSelector{Auto: true}}
}

// FieldError is a validation error for one field.
type FieldError struct {
	Key     string // the key as the user wrote it: detshare.io/sms, DETSHARE_SMS, or the field name for defaults
	Value   string
	Source  Source
	Allowed string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s=%s (%s): %s", quote.Bounded(e.Key), quote.Q(e.Value), e.Source, e.Allowed)
}

// KeyFor is field f's key as the user wrote it in src (for error messages).
func KeyFor(f Field, src Source) string {
	switch src {
	case SourceAnnotation, SourceLabel:
		return f.AnnotationKey()
	case SourceEnv:
		return f.EnvKey()
	case SourceAllocation:
		return CeilingAnnotationKey(f)
	case SourceFlag:
		if f == FieldSMs {
			return "--sm" // the flag of `detshare run`
		}
		return "--" + string(f)
	}
	return "default " + string(f)
}

const (
	allowedTier   = "allowed values are latency-critical, burstable, best-effort"
	allowedRole   = "allowed values are none, prefill, decode"
	allowedLend   = "allowed values are true, false"
	allowedPinned = "allowed values are true, false"
	allowedSLO    = "a duration from 100us to 60s (examples: 500us, 5ms, 1s)"
	allowedWeight = "must be an integer in 1..10000"
	allowedGPU    = "allowed values are auto, a GPU index 0..15, or a GPU UUID (GPU-… or SIM-…)"
	maxSMs        = 1 << 16
	maxMemory     = uint64(1) << 62
)

// ParseTier parses a tier as users write it (any case, surrounding space ignored).
func ParseTier(s string) (table.Tier, error) {
	t, err := table.ParseTier(strings.ToLower(strings.TrimSpace(s)))
	if err != nil {
		return 0, errors.New(allowedTier)
	}
	return t, nil
}

// ParseRole parses a role as users write it (any case, surrounding space ignored; empty is none).
func ParseRole(s string) (table.Role, error) {
	r := strings.ToLower(strings.TrimSpace(s))
	if r == "" {
		return table.RoleNone, nil
	}
	v, err := table.ParseRole(r)
	if err != nil {
		return 0, errors.New(allowedRole)
	}
	return v, nil
}

// ParseSMs parses an SM request: "0", "N" (1..65536 SMs) or "P%" (1..100).
func ParseSMs(s string) (SMs, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil || n < 1 || n > 100 {
			return SMs{}, errors.New("percent must be in 1..100")
		}
		return SMs{Percent: uint32(n)}, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > maxSMs {
		return SMs{}, fmt.Errorf("must be 0 (no guarantee), a number of SMs 1..%d, or a percent 1%%..100%%", maxSMs)
	}
	return SMs{Count: uint32(n)}, nil
}

var memUnits = map[string]uint64{
	"": 1, "B": 1,
	"K": 1e3, "KB": 1e3, "k": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
	"Ki": 1 << 10, "KiB": 1 << 10, "Mi": 1 << 20, "MiB": 1 << 20, "Gi": 1 << 30, "GiB": 1 << 30,
	"Ti": 1 << 40, "TiB": 1 << 40,
}

const allowedMemory = "must be 0 (unlimited), bytes with an optional unit (K, M, G, T = powers of 1000; " +
	"Ki, Mi, Gi, Ti = powers of 1024; e.g. 8Gi, 1.5G, 512Mi) up to 4 EiB, or a percent 1%..100%"

// ParseMemory parses a memory limit: "0", bytes with an optional unit, or "P%".
func ParseMemory(s string) (Memory, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil || n < 1 || n > 100 {
			return Memory{}, errors.New("percent must be in 1..100")
		}
		return Memory{Percent: uint32(n)}, nil
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	mult, ok := memUnits[unit]
	if num == "" || !ok || strings.Count(num, ".") > 1 || num[0] == '.' || num[len(num)-1] == '.' || len(num) > 40 {
		return Memory{}, errors.New(allowedMemory)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return Memory{}, errors.New(allowedMemory)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).SetUint64(mult)))
	b := new(big.Int).Quo(r.Num(), r.Denom()) // whole bytes, rounded down
	if !b.IsUint64() || b.Uint64() > maxMemory {
		return Memory{}, errors.New(allowedMemory)
	}
	if b.Sign() == 0 && r.Sign() != 0 {
		return Memory{}, errors.New("must be at least 1 byte (0 means unlimited)")
	}
	return Memory{Bytes: b.Uint64()}, nil
}

// ParseWeight parses a weight (1..10000).
func ParseWeight(s string) (uint32, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil || n < 1 || n > 10000 {
		return 0, errors.New(allowedWeight)
	}
	return uint32(n), nil
}

// ParseGPU parses a GPU selector.
func ParseGPU(s string) (GPUSelector, error) {
	s = strings.TrimSpace(s)
	switch {
	case strings.EqualFold(s, "auto"):
		return GPUSelector{Auto: true}, nil
	case strings.HasPrefix(s, "GPU-") || strings.HasPrefix(s, "SIM-"):
		if len(s) > 63 || len(s) < 5 {
			return GPUSelector{}, errors.New(allowedGPU)
		}
		return GPUSelector{UUID: s}, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n >= table.MaxGPUs {
		return GPUSelector{}, errors.New(allowedGPU)
	}
	return GPUSelector{Index: int(n)}, nil
}

// ParseLend parses the lend flag.
func ParseLend(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1", "yes", "on":
		return true, nil
	case "false", "0", "no", "off", "":
		return false, nil
	}
	return false, errors.New(allowedLend)
}

// ParseSLOP99 parses a latency target.
func ParseSLOP99(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 100*time.Microsecond || d > 60*time.Second {
		return 0, errors.New(allowedSLO)
	}
	return d, nil
}

// Set parses value into field f of q, recording src. Errors are *FieldError.
func (q *Quota) Set(f Field, value string, src Source) error {
	var err error
	switch f {
	case FieldTier:
		q.Tier, err = ParseTier(value)
	case FieldSMs:
		q.SMs, err = ParseSMs(value)
	case FieldMemory:
		q.Memory, err = ParseMemory(value)
	case FieldWeight:
		q.Weight, err = ParseWeight(value)
	case FieldRole:
		q.Role, err = ParseRole(value)
	case FieldGPU:
		q.GPU, err = ParseGPU(value)
	case FieldLend:
		q.Lend, err = ParseLend(value)
	case FieldPinned:
		q.Pinned, err = ParseLend(value)
		if err != nil {
			err = errors.New(allowedPinned)
		}
	case FieldSLOP99:
		q.SLOP99, err = ParseSLOP99(value)
	default:
		return fmt.Errorf("unknown quota field %s: allowed fields are %s", quote.Q(string(f)), fieldList())
	}
	if err != nil {
		return &FieldError{Key: KeyFor(f, src), Value: value, Source: src, Allowed: err.Error()}
	}
	if q.Source == nil {
		q.Source = map[Field]Source{}
	}
	if q.Spec == nil {
		q.Spec = map[Field]string{}
	}
	q.Source[f] = src
	q.Spec[f] = value
	return nil
}

func fieldList() string {
	s := make([]string, len(Fields))
	for i, f := range Fields {
		s[i] = string(f)
	}
	return strings.Join(s, ", ")
}

// SourceOf returns the source of field f (SourceDefault when unrecorded).
func (q Quota) SourceOf(f Field) Source {
	if s, ok := q.Source[f]; ok {
		return s
	}
	return SourceDefault
}

func (q Quota) specOf(f Field, current string) string {
	if s, ok := q.Spec[f]; ok {
		return s
	}
	return current
}

// Resolve builds a tenant's quota from its annotations, labels and environment (KEY=VALUE, as in an OCI spec)
// over defaults, with the precedence annotations > labels > env > defaults, and validates it. All field errors are
// reported together.
func Resolve(annotations, labels map[string]string, env []string, defaults Quota) (Quota, error) {
	return ResolveInputs(Inputs{Annotations: annotations, Labels: labels, Env: env, Defaults: &defaults})
}

// Inputs are the sources of a quota. Flags (from `detshare run`) take precedence over everything else.
type Inputs struct {
	Flags       map[Field]string
	Annotations map[string]string
	Labels      map[string]string
	Env         []string
	Defaults    *Quota // nil: Default()
}

// ResolveInputs is Resolve with the flag layer.
func ResolveInputs(in Inputs) (Quota, error) {
	r := in.Resolve()
	return r.Quota, r.Err
}

// Resolved is a tenant's quota inputs resolved once per create: each entry point (hook, shim and runc wrapper
// through hook.attach, `detshare run`) calls Inputs.Resolve and hands the value down (tenant.Request), so the
// container's annotations, labels and environment are scanned once and nobody re-reads them.
type Resolved struct {
	Quota Quota // the resolved, validated quota; zero when Err is set
	// Asked tells whether any quota key is set (flag, annotation, label or environment): the tenant asked for
	// DetShare.
	Asked bool
	// Unknown is CheckKeys' verdict: the keys with a DetShare prefix that DetShare does not know, joined, or nil.
	// It is part of Err too; alone it decides whether a container that set no quota key is refused.
	Unknown error
	// Capped says which fields asked above the Ceiling and were lowered to it, one message each (for the log).
	Capped []string
	// Err is why the inputs give no quota (bad values, unknown keys and fields, a bad combination), joined, or nil.
	Err error
	ok  bool // made by Resolve (the zero Resolved is not a quota)
}

// IsResolved tells whether r came from Inputs.Resolve.
func (r Resolved) IsResolved() bool { return r.ok }

// resolves counts Resolve calls: the test of one create checks that its inputs are scanned exactly once.
var resolves atomic.Uint64

// Resolve builds the quota from the inputs over the defaults, with the precedence flags > annotations > labels >
// env > defaults, and validates it; all field errors are reported together. It is the one place that scans a
// tenant's inputs.
func (in Inputs) Resolve() Resolved {
	resolves.Add(1)
	defaults := Default()
	if in.Defaults != nil {
		defaults = *in.Defaults
	}
	q := defaults
	q.Source = map[Field]Source{}
	q.Spec = map[Field]string{}
	for f, s := range defaults.Source {
		q.Source[f] = s
	}
	for f, s := range defaults.Spec {
		q.Spec[f] = s
	}
	envm := envMap(in.Env)
	r := Resolved{ok: true}
	var errs []error
	// What the cluster allocated (device plugin, DRA driver) is the defaults and the most each field may be.
	ceil, hasCeil, err := ceilingOf(in.Annotations, envm)
	if err != nil {
		errs = append(errs, err)
	}
	if hasCeil {
		r.Asked = true
		q = ceil.defaults(q)
	}
	var first *FieldError // the first quota key the container set itself
	for _, f := range Fields {
		var value string
		var src Source
		if v, ok := in.Flags[f]; ok {
			value, src = v, SourceFlag
		} else if v, ok := in.Annotations[f.AnnotationKey()]; ok {
			value, src = v, SourceAnnotation
		} else if v, ok := in.Labels[f.AnnotationKey()]; ok {
			value, src = v, SourceLabel
		} else if v, ok := envm[f.EnvKey()]; ok {
			value, src = v, SourceEnv
		} else {
			continue
		}
		r.Asked = true
		if first == nil {
			first = &FieldError{Key: KeyFor(f, src), Value: value, Source: src}
		}
		if err := q.Set(f, value, src); err != nil {
			errs = append(errs, err)
		}
	}
	if first != nil && !hasCeil && len(in.Flags) == 0 && IsKubernetes(in.Annotations) {
		// A Kubernetes container without an allocation asks for a quota of its own: refused, whatever it asks, so that
		// a pod with runtimeClassName detshare cannot take a GPU share the scheduler never accounted for.
		first.Allowed = noAllocation
		errs = append(errs, first)
	}
	if r.Unknown = checkKeys(in.Annotations, in.Labels, envm); r.Unknown != nil {
		errs = append(errs, r.Unknown)
	}
	for f := range in.Flags {
		if !knownField(f) {
			errs = append(errs, fmt.Errorf("unknown quota field %s: allowed fields are %s", quote.Q(string(f)), fieldList()))
		}
	}
	if hasCeil {
		if err := ceil.check(); err != nil {
			errs = append(errs, err)
		}
		q, r.Capped = ceil.capTo(q)
		q.Ceiling = &ceil
	}
	if len(errs) > 0 {
		r.Err = errors.Join(errs...)
		return r
	}
	if err := q.Validate(); err != nil {
		r.Err = err
		return r
	}
	r.Quota = q.Effective()
	return r
}

func knownField(f Field) bool {
	for _, k := range Fields {
		if k == f {
			return true
		}
	}
	return false
}

// Validate checks the combination of fields.
func (q Quota) Validate() error {
	tierSrc := fmt.Sprintf("tier %s from %s", q.Tier, q.SourceOf(FieldTier))
	switch q.Tier {
	case table.TierLatencyCritical, table.TierBurstable, table.TierBestEffort:
	default:
		return &FieldError{Key: KeyFor(FieldTier, q.SourceOf(FieldTier)), Value: q.Tier.String(),
			Source: q.SourceOf(FieldTier), Allowed: allowedTier}
	}
	if q.Weight < 1 || q.Weight > 10000 {
		return &FieldError{Key: KeyFor(FieldWeight, q.SourceOf(FieldWeight)), Value: strconv.Itoa(int(q.Weight)),
			Source: q.SourceOf(FieldWeight), Allowed: allowedWeight}
	}
	switch q.Role {
	case table.RoleNone, table.RolePrefill, table.RoleDecode:
	default:
		return &FieldError{Key: KeyFor(FieldRole, q.SourceOf(FieldRole)), Value: q.Role.String(),
			Source: q.SourceOf(FieldRole), Allowed: allowedRole}
	}
	if src := q.SourceOf(FieldSMs); q.Tier == table.TierBestEffort && !q.SMs.IsZero() && src != SourceDefault &&
		src != SourceAllocation {
		return &FieldError{Key: KeyFor(FieldSMs, src), Value: q.specOf(FieldSMs, q.SMs.String()), Source: src,
			Allowed: fmt.Sprintf("a best-effort tenant has no guaranteed SMs (%s); use tier burstable or latency-critical, or sms 0", tierSrc)}
	}
	if q.Tier == table.TierLatencyCritical && q.SMs.IsZero() {
		src := q.SourceOf(FieldSMs)
		return &FieldError{Key: KeyFor(FieldSMs, src), Value: q.specOf(FieldSMs, "0"), Source: src,
			Allowed: fmt.Sprintf("a latency-critical tenant needs guaranteed SMs (%s): set sms to a number of SMs or a percent", tierSrc)}
	}
	if q.Lend && q.Tier != table.TierLatencyCritical {
		src := q.SourceOf(FieldLend)
		return &FieldError{Key: KeyFor(FieldLend, src), Value: q.specOf(FieldLend, "true"), Source: src,
			Allowed: fmt.Sprintf("lending applies only to tier latency-critical (%s)", tierSrc)}
	}
	if q.Pinned && q.Tier != table.TierLatencyCritical {
		src := q.SourceOf(FieldPinned)
		return &FieldError{Key: KeyFor(FieldPinned, src), Value: q.specOf(FieldPinned, "true"), Source: src,
			Allowed: fmt.Sprintf("pinning applies only to tier latency-critical (%s)", tierSrc)}
	}
	if q.SLOP99 != 0 && q.Tier != table.TierLatencyCritical {
		src := q.SourceOf(FieldSLOP99)
		return &FieldError{Key: KeyFor(FieldSLOP99, src), Value: q.specOf(FieldSLOP99, q.SLOP99.String()), Source: src,
			Allowed: fmt.Sprintf("a latency target applies only to tier latency-critical (%s)", tierSrc)}
	}
	return nil
}

// Effective returns q with the SM request cleared for best-effort tenants whose SMs came from the defaults
// (defaults may carry an SM count meant for guaranteed tiers).
func (q Quota) Effective() Quota {
	if q.Tier == table.TierBestEffort {
		q.SMs = SMs{}
	}
	return q
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v // later entries win, as in execve
		}
	}
	return m
}
