package quota

import (
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/detshare/detshare/internal/table"
)

// RoundSMs rounds a request of wanted SMs up to whole groups of split (groups are taken in array order, as the
// driver assigns them) and returns the groups and the SMs they hold, which is what the tenant is granted.
func RoundSMs(split table.Split, wanted uint32) (groups, sms uint32, err error) {
	if wanted == 0 {
		return 0, 0, nil
	}
	for i, g := range split.Groups {
		sms += g
		if sms >= wanted {
			return uint32(i + 1), sms, nil
		}
	}
	return 0, 0, fmt.Errorf("%d SMs do not fit: the GPU's split has %d groups holding %d SMs (%d SMs are left over and cannot be guaranteed)",
		wanted, len(split.Groups), split.TotalSMs(), split.Remainder)
}

// Placement is a quota made concrete on one GPU.
type Placement struct {
	GPU      int
	UUID     string
	Groups   uint32 // guaranteed SM groups
	SMs      uint32 // granted (guaranteed) SMs after rounding
	Wanted   uint32 // SMs asked for before rounding
	MemLimit uint64 // bytes, 0 = unlimited
}

// Place resolves q's percentages and rounds its SMs on gpu.
func (q Quota) Place(gpu table.GPUState) (Placement, error) {
	p := Placement{GPU: gpu.Index, UUID: gpu.UUID}
	if q.Tier.Guaranteed() && !q.SMs.IsZero() {
		p.Wanted = q.SMs.Wanted(gpu.SMCount)
		if q.Ceiling != nil && p.Wanted > q.Ceiling.SMs { // a percent above what the cluster allocated
			p.Wanted = q.Ceiling.SMs
		}
		g, s, err := RoundSMs(gpu.Split, p.Wanted)
		if err != nil {
			src := q.SourceOf(FieldSMs)
			return Placement{}, &FieldError{Key: KeyFor(FieldSMs, src), Value: q.specOf(FieldSMs, q.SMs.String()),
				Source: src, Allowed: fmt.Sprintf("on GPU %d (%s, %d SMs): %v", gpu.Index, gpu.UUID, gpu.SMCount, err)}
		}
		p.Groups, p.SMs = g, s
	}
	p.MemLimit = q.Memory.Limit(gpu.MemTotal)
	if c := q.Ceiling; c != nil && (p.MemLimit == 0 || p.MemLimit > c.Memory) {
		p.MemLimit = c.Memory // memory is what the cluster allocated, never unlimited
	}
	if gpu.MemTotal != 0 && p.MemLimit > gpu.MemTotal {
		src := q.SourceOf(FieldMemory)
		return Placement{}, &FieldError{Key: KeyFor(FieldMemory, src), Value: q.specOf(FieldMemory, q.Memory.String()),
			Source: src, Allowed: fmt.Sprintf("more than GPU %d (%s) has: %d bytes", gpu.Index, gpu.UUID, gpu.MemTotal)}
	}
	if q.Memory.Percent != 0 && p.MemLimit == 0 {
		p.MemLimit = 1 // a percent of a GPU with unknown memory must not turn into "unlimited"
	}
	return p, nil
}

// Registered is an existing tenant as admission sees it.
type Registered struct {
	ID     string
	GPU    int
	Tier   table.Tier
	Groups uint32
	SMs    uint32
	Memory uint64 // bytes, 0 = unlimited
}

// reserves is what r holds back on its GPU: the SM groups of a latency-critical or burstable tenant, and its memory
// limit (an unlimited tenant reserves nothing). The one rule admission sums and lists by.
func (r Registered) reserves() (groups uint32, memory uint64) {
	if r.Tier.Guaranteed() {
		groups = r.Groups
	}
	return groups, r.Memory
}

// Existing is the tenants already registered, as admission and placement see them: each GPU's reserved SM groups
// and memory, summed once when it is made, and the tenants themselves, enumerated only to explain a refusal. Made
// from the table (FromTable) it copies no tenant and builds no string while admitting, so that admission costs the
// same beside 255 tenants as beside none (issue 28: a Registered per tenant and a description of every one, on
// each admission, made the n-th registration cost grow with n).
type Existing struct {
	n       int
	groups  [table.MaxGPUs]uint32
	memory  [table.MaxGPUs]uint64
	tenants iter.Seq[Registered]
}

// ExistingOf is Existing over a list of tenants.
func ExistingOf(regs ...Registered) *Existing {
	return newExisting(slices.Values(regs), slices.Values(regs))
}

// FromTable is Existing over a registration's active slots (table.RegisterRequest.Check), read in place; a tenant's
// ID is read only to explain a refusal. It is valid only while Check runs.
func FromTable(active *table.Active) *Existing {
	slots := func(withIDs bool) iter.Seq[Registered] {
		return func(yield func(Registered) bool) {
			for a := range active.All() {
				id := ""
				if withIDs {
					id = a.ID()
				}
				if !yield(registeredOf(a, id)) {
					return
				}
			}
		}
	}
	return newExisting(slots(false), slots(true))
}

func registeredOf(a table.ActiveSlot, id string) Registered {
	t := table.TierBestEffort
	switch a.Tier {
	case table.TierLatencyCritical:
		t = table.TierLatencyCritical
	case table.TierBurstable:
		t = table.TierBurstable
	}
	return Registered{ID: id, GPU: a.GPU, Tier: t, Groups: a.SMGroups, SMs: a.SMs, Memory: a.MemLimit}
}

// newExisting sums quotas (the tenants, IDs not needed) per GPU; tenants enumerates them again, with IDs.
func newExisting(quotas, tenants iter.Seq[Registered]) *Existing {
	e := &Existing{tenants: tenants}
	for r := range quotas {
		e.n++
		if r.GPU < 0 || r.GPU >= table.MaxGPUs {
			continue // no GPU admits on an index the table cannot hold
		}
		g, m := r.reserves()
		e.groups[r.GPU] += g
		e.memory[r.GPU] += m
	}
	return e
}

// Len is the number of existing tenants (on every GPU).
func (e *Existing) Len() int { return e.n }

// Groups is the SM groups guaranteed to the existing tenants of GPU gpu.
func (e *Existing) Groups(gpu int) uint32 {
	if gpu < 0 || gpu >= table.MaxGPUs {
		return 0
	}
	return e.groups[gpu]
}

// Memory is the memory reserved by the existing tenants of GPU gpu (bytes).
func (e *Existing) Memory(gpu int) uint64 {
	if gpu < 0 || gpu >= table.MaxGPUs {
		return 0
	}
	return e.memory[gpu]
}

// users describes the tenants of GPU gpu that reserve SM groups and those that reserve memory (a refusal's
// explanation).
func (e *Existing) users(gpu int) (groupUsers, memUsers []string) {
	for r := range e.tenants {
		if r.GPU != gpu {
			continue
		}
		g, m := r.reserves()
		if g > 0 {
			groupUsers = append(groupUsers, fmt.Sprintf("%q %d groups/%d SMs (%s)", r.ID, r.Groups, r.SMs, r.Tier))
		}
		if m > 0 {
			memUsers = append(memUsers, fmt.Sprintf("%q %s", r.ID, FormatBytes(m)))
		}
	}
	return groupUsers, memUsers
}

// AdmissionError is a refusal: the guarantee does not fit on the GPU.
type AdmissionError struct {
	ID     string
	GPU    table.GPUState
	Reason string
}

func (e *AdmissionError) Error() string {
	return fmt.Sprintf("admission refused for %q on GPU %d (%s): %s", e.ID, e.GPU.Index, e.GPU.UUID, e.Reason)
}

// Admit checks that the new tenant's guarantees fit on gpu beside the existing tenants there: the SM groups of
// latency-critical and burstable tenants must not exceed the split's groups, and the memory limits of all tenants
// must not exceed the GPU's memory (unlimited tenants reserve nothing). The refusal lists what is in use and by whom.
func Admit(gpu table.GPUState, existing *Existing, id string, tier table.Tier, p Placement) error {
	usedGroups, usedMem := existing.Groups(gpu.Index), existing.Memory(gpu.Index)
	total := uint32(len(gpu.Split.Groups))
	if tier.Guaranteed() && p.Groups > 0 && uint64(usedGroups)+uint64(p.Groups) > uint64(total) {
		groupUsers, _ := existing.users(gpu.Index)
		return &AdmissionError{ID: id, GPU: gpu, Reason: fmt.Sprintf(
			"asks %d SM groups (%d SMs) but %d of the %d groups are guaranteed to others [%s]; %d free",
			p.Groups, p.SMs, usedGroups, total, strings.Join(groupUsers, ", "), total-min(usedGroups, total))}
	}
	if p.MemLimit > 0 && gpu.MemTotal > 0 && (usedMem > gpu.MemTotal || p.MemLimit > gpu.MemTotal-usedMem) {
		free := uint64(0)
		if usedMem < gpu.MemTotal {
			free = gpu.MemTotal - usedMem
		}
		_, memUsers := existing.users(gpu.Index)
		return &AdmissionError{ID: id, GPU: gpu, Reason: fmt.Sprintf(
			"asks %s of memory but %s of %s are reserved by others [%s]; %s free",
			FormatBytes(p.MemLimit), FormatBytes(usedMem), FormatBytes(gpu.MemTotal), strings.Join(memUsers, ", "),
			FormatBytes(free))}
	}
	return nil
}

// FormatBytes renders bytes with a binary unit for messages (exact bytes when not a whole unit).
func FormatBytes(b uint64) string {
	for _, u := range []struct {
		s string
		v uint64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b >= u.v && b%u.v == 0 {
			return fmt.Sprintf("%d%s", b/u.v, u.s)
		}
	}
	if b >= 1<<30 {
		return fmt.Sprintf("%.2fGi", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%dB", b)
}
