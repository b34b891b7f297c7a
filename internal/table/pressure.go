package table

import (
	"math"
	"sync/atomic"
	"time"
)

// Pressure is what a GPU's tenants load it with: the sum of their busy fractions (each 0..1: busy time since
// registration over its age) and of the device memory they hold. gpu=auto placement (cgroupgpu/placement) chooses
// between GPUs by it. The scheduler's reaper publishes it in the table every round (PublishPressure), so that a
// registration reads one record per GPU instead of every tenant's client page (issue 28: that read grew with the
// number of tenants); a registrar without a fresh publication measures the pages itself with the same TenantLoad.
type Pressure struct {
	Compute  float64
	MemBytes uint64
	At       time.Time // when published; zero: never (GPUState.Pressure)
}

// PressureFresh is how old a published Pressure may be for placement to use it instead of measuring: a few reaper
// rounds (reap_every, 250 ms by default).
const PressureFresh = 2 * time.Second

// TenantLoad is one tenant's contribution to its GPU's Pressure, from its client page pg (nil: unreadable, or not
// this registration's): its busy fraction since it registered and the memory it holds. A tenant with no history
// yet (younger than a second, or nothing measured) counts by its role: prefill as half busy, decode as holding a
// quarter of the GPU's memory (memTotal). Page values are tenant-written; they are clamped, never trusted to widen
// anything (placement only orders GPUs by them).
func TenantLoad(pg *ClientPage, registeredNs uint64, role Role, memTotal uint64, now time.Time) (busy float64, mem uint64) {
	age := now.Sub(time.Unix(0, int64(registeredNs)))
	if pg != nil {
		b := atomic.LoadUint64(&pg.BusyNs)
		for i := range pg.Procs {
			if atomic.LoadUint32(&pg.Procs[i].State) == ProcLive {
				b = max(b, atomic.LoadUint64(&pg.Procs[i].BusyNs))
			}
		}
		mem = atomic.LoadUint64(&pg.MemUsed)
		if memTotal > 0 {
			mem = min(mem, memTotal)
		}
		if age > time.Second && (b > 0 || mem > 0) {
			return min(1, float64(b)/float64(age)), mem
		}
	}
	switch role {
	case RolePrefill:
		return 0.5, mem
	case RoleDecode:
		return 0, memTotal / 4
	}
	return 0, mem
}

// PublishPressure sums TenantLoad over the active tenants of each GPU, from the pages the reaper keeps mapped, and
// publishes it in the GPUs' records (pressure_*; pressure_ns last, so that a reader that sees it fresh sees the
// sums written with it).
func (r *Reaper) PublishPressure(now time.Time) {
	t := r.t
	n := min(int(atomic.LoadUint32(&t.Header().NGPUs)), MaxGPUs)
	var compute [MaxGPUs]float64
	var mem [MaxGPUs]uint64
	var memTotal [MaxGPUs]uint64
	for g := 0; g < n; g++ {
		memTotal[g] = t.GPU(g).MemTotal
	}
	for slot := 0; slot < MaxContainers; slot++ {
		cl, c := r.pageOfSlot(slot)
		if atomic.LoadUint32(&c.State) != SlotActive {
			continue
		}
		g := int(c.GPU)
		if g < 0 || g >= n {
			continue
		}
		var pg *ClientPage
		if cl != nil {
			pg = cl.Page()
		}
		var busy float64
		var used uint64
		if Guard("pressure: client page", func() { busy, used = TenantLoad(pg, c.RegisteredNs, Role(c.Role), memTotal[g], now) }) != nil {
			busy, used = TenantLoad(nil, c.RegisteredNs, Role(c.Role), memTotal[g], now)
		}
		compute[g] += busy
		mem[g] += used
	}
	for g := 0; g < n; g++ {
		e := t.GPU(g)
		atomic.StoreUint64(&e.PressureComputePPM, uint64(math.Round(compute[g]*1e6)))
		atomic.StoreUint64(&e.PressureMemBytes, mem[g])
		atomic.StoreUint64(&e.PressureNs, uint64(now.UnixNano()))
	}
}
