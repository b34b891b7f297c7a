// Package placement picks the GPU for a tenant whose quota says gpu=auto (cgroupgpu/tenant's Placer): among the GPUs
// where its guarantee is admitted, the one whose current tenants' measured profile best complements it. A
// compute-heavy newcomer (role prefill) goes where the neighbours keep the SMs least busy; a memory-heavy one (role
// decode) where the neighbours use the least memory; one with no role where the sum is lowest. Profiles are measured
// from the client pages (busy time since registration, device memory held); a neighbour with no history yet counts
// by its role. The decision and its reason are logged, and the reason is part of the refusal when nothing fits.
package placement

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// Placer implements cgroupgpu/tenant.Placer.
type Placer struct {
	// RunDir is where the client pages are; empty means table.RunDir("") ($DETSHARE_RUN_DIR or /run/detshare).
	RunDir string
	// Now is the clock (tests); nil means time.Now.
	Now        func() time.Time
	mu         sync.Mutex
	lastReason string
}

// LastReason is the reason of the last decision (for callers that show it).
func (pl *Placer) LastReason() string {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.lastReason
}

// Pressure is what the tenants of one GPU load it with.
type Pressure struct {
	Compute float64 // sum of busy fractions (0..1 each)
	Memory  float64 // sum of memory held / GPU memory
}

type candidate struct {
	gpu   table.GPUState
	free  int
	total int
	p     Pressure
	score float64
}

// Kind classifies a newcomer by its role.
func Kind(r table.Role) string {
	switch r {
	case table.RolePrefill:
		return "compute-heavy"
	case table.RoleDecode:
		return "memory-heavy"
	}
	return "unknown"
}

// Score is the cost of putting a newcomer of kind on a GPU with pressure p and free groups free (lower is better).
func Score(kind string, p Pressure, free, total int) float64 {
	wc, wm := 1.0, 1.0
	switch kind {
	case "compute-heavy":
		wm = 0.25
	case "memory-heavy":
		wc = 0.25
	}
	s := wc*p.Compute + wm*p.Memory
	if total > 0 {
		s += 0.1 * float64(total-free) / float64(total) // tie-break: more room left
	}
	return s
}

// Place implements cgroupgpu/tenant.Placer.
func (pl *Placer) Place(id string, q quota.Quota, gpus []table.GPUState, existing *quota.Existing) (int, error) {
	kind := Kind(q.Role)
	var cands []candidate
	var refusals []error
	for _, g := range gpus {
		p, err := q.Place(g)
		if err == nil {
			err = quota.Admit(g, existing, id, q.Tier, p)
		}
		if err != nil {
			refusals = append(refusals, err)
			continue
		}
		used := int(existing.Groups(g.Index))
		total := len(g.Split.Groups)
		cands = append(cands, candidate{gpu: g, free: total - used - int(p.Groups), total: total})
	}
	if len(cands) == 0 {
		if len(refusals) == 0 {
			return -1, errors.New("gpu=auto: no GPUs")
		}
		return -1, fmt.Errorf("gpu=auto: no GPU can take %q: %w", id, errors.Join(refusals...))
	}
	// The neighbours' profile decides between GPUs; with one candidate there is nothing to decide, and measuring
	// reads every tenant's client page (a registration would cost more the more tenants there are, issue 28).
	if len(cands) > 1 {
		pressure := pl.measure(gpus)
		for i := range cands {
			cands[i].p = pressure[cands[i].gpu.Index]
		}
	}
	for i := range cands {
		cands[i].score = Score(kind, cands[i].p, cands[i].free, cands[i].total)
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].score < cands[j].score })
	best := cands[0]
	var others []string
	for _, c := range cands[1:] {
		others = append(others, fmt.Sprintf("GPU %d score %.2f", c.gpu.Index, c.score))
	}
	for _, e := range refusals {
		others = append(others, "refused: "+e.Error())
	}
	reason := fmt.Sprintf("GPU %d: guarantee fits (%d groups left free); neighbours' compute pressure %.2f, memory pressure %.2f; %s newcomer, score %.2f",
		best.gpu.Index, best.free, best.p.Compute, best.p.Memory, kind, best.score)
	if len(cands) == 1 {
		reason = fmt.Sprintf("GPU %d: the only GPU that admits it (%d groups left free; neighbours not measured)",
			best.gpu.Index, best.free)
	}
	if len(others) > 0 {
		reason += " [" + strings.Join(others, "; ") + "]"
	}
	pl.mu.Lock()
	pl.lastReason = reason
	pl.mu.Unlock()
	logrus.WithFields(logrus.Fields{"id": id, "gpu": best.gpu.Index, "reason": reason}).Info("placement (gpu=auto)")
	return best.gpu.Index, nil
}

// measure is each GPU's Pressure: what the scheduler published (table.Reaper.PublishPressure) when every GPU's
// publication is fresh (table.PressureFresh), else measured here from the client pages, read-only, with the same
// table.TenantLoad. Anything unreadable counts as no pressure: placement must never fail because a page could not
// be read.
func (pl *Placer) measure(gpus []table.GPUState) map[int]Pressure {
	now := time.Now
	if pl.Now != nil {
		now = pl.Now
	}
	out := map[int]Pressure{}
	fresh := true
	for _, g := range gpus {
		age := now().Sub(g.Pressure.At)
		if g.Pressure.At.IsZero() || age < -table.PressureFresh || age > table.PressureFresh {
			fresh = false
			break
		}
		out[g.Index] = Pressure{Compute: g.Pressure.Compute, Memory: ratio(g.Pressure.MemBytes, g.MemTotal)}
	}
	if fresh {
		return out
	}
	clear(out)
	t, err := table.OpenReadOnly(table.RunDir(pl.RunDir))
	if err != nil {
		return out
	}
	defer t.Close()
	mem := map[int]uint64{}
	for _, g := range gpus {
		mem[g.Index] = g.MemTotal
	}
	// One copy of each page, read (not mapped: unmapping 256 pages cost ~0.1 s on a 2-core VM); a page a tenant
	// truncated or damaged only loses this tenant's measurement.
	pg := new(table.ClientPage)
	for _, r := range t.List() {
		mine := table.ReadClientPage(r.ClientPagePath, pg) == nil && pg.Slot == uint32(r.Slot) && pg.SlotGen == r.Gen
		page := pg
		if !mine {
			page = nil
		}
		busy, used := table.TenantLoad(page, r.RegisteredNs, r.Role, mem[r.GPU], now())
		p := out[r.GPU]
		p.Compute += busy
		p.Memory += ratio(used, mem[r.GPU])
		out[r.GPU] = p
	}
	return out
}

func ratio(used, total uint64) float64 {
	if total == 0 {
		return 0
	}
	return float64(used) / float64(total)
}
