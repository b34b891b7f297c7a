// Package view reads a consistent-enough picture of the table and the client pages for humans and scripts:
// `detshare status`, `detshare top` and the metrics endpoint. It only reads (read-only mappings), so a viewer can
// never disturb tenants or the scheduler.
package view

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sort"
	"sync/atomic"
	"time"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/internal/workload"
	"github.com/detshare/detshare/sched/policy"
)

// Snapshot is one look at a run directory.
type Snapshot struct {
	RunDir    string    `json:"run_dir"`
	Taken     time.Time `json:"taken"`
	TakenNs   uint64    `json:"-"` // CLOCK_MONOTONIC, for rates
	Scheduler Leader    `json:"scheduler"`
	GPUs      []GPU     `json:"gpus"`
	Tenants   []Tenant  `json:"tenants"`
}

// Leader describes the scheduler leader.
type Leader struct {
	PID          int     `json:"pid"`
	Alive        bool    `json:"alive"`
	HeartbeatAge float64 `json:"heartbeat_age_seconds"`
	Epoch        uint64  `json:"epoch"`
	Policy       string  `json:"policy"`
}

// GPU is one GPU entry.
type GPU struct {
	Index        int      `json:"index"`
	UUID         string   `json:"uuid"`
	Name         string   `json:"name"`
	Simulated    bool     `json:"simulated"`
	SMs          uint32   `json:"sms"`
	MemTotal     uint64   `json:"memory_bytes"`
	Groups       []uint32 `json:"groups"`
	SplitKnown   bool     `json:"split_published"`
	MPS          string   `json:"mps"`
	Mode         string   `json:"mode"`
	TokenHolder  string   `json:"token_holder,omitempty"`
	GrantChanges uint64   `json:"grant_changes"`
	// Account explains the SMs: guarantees, grants beyond them, groups granted to several tenants (smaccount.go).
	Account SMAccount `json:"sm_account"`
}

// Tenant is one registered tenant with its grant and its client page's statistics.
type Tenant struct {
	ID string `json:"id"`
	// The Kubernetes pod, namespace and container the tenant is (internal/workload); empty outside Kubernetes.
	Pod           string `json:"pod,omitempty"`
	Namespace     string `json:"namespace,omitempty"`
	Container     string `json:"container,omitempty"`
	Slot          int    `json:"slot"`
	GPU           int    `json:"gpu"`
	Tier          string `json:"tier"`
	Role          string `json:"role"`
	Weight        uint32 `json:"weight"`
	Lend          bool   `json:"lend"`
	HostTenant    bool   `json:"host_tenant"`
	GuaranteedSMs uint32 `json:"guaranteed_sms"`
	GrantedSMs    uint32 `json:"granted_sms"`
	GrantGroups   uint64 `json:"grant_groups"`
	GrantMode     string `json:"grant_mode"`
	GrantEpoch    uint32 `json:"grant_epoch"`
	// BorrowedSMs is what the grant holds beyond the guarantee (lent, expanded or shared groups); SharedSMs the SMs
	// of its grant that are also in another tenant's grant, SharesWith those tenants (Account).
	BorrowedSMs uint32   `json:"borrowed_sms"`
	SharedSMs   uint32   `json:"shared_sms"`
	SharesWith  []string `json:"shares_with,omitempty"`
	Demand      uint32   `json:"demand"`
	Processes   int      `json:"processes"`
	Launches    uint64   `json:"launches"`
	BusyNs      uint64   `json:"busy_ns"`
	MemUsed     uint64   `json:"memory_used_bytes"`
	MemLimit    uint64   `json:"memory_limit_bytes"`
	// Issue 27: the device memory NVML reports for the tenant's processes (table.Attributor: those mapping its client
	// page, in its container's cgroup, or descending from its `detshare run`), and how much of that the library did
	// not charge (MemGPU - MemUsed when positive): allocations that bypassed libdetshare, and the driver's own memory
	// per context. Filled by GPUMemory; MemGPUKnown is false where NVML could not be read.
	MemGPUKnown bool   `json:"memory_gpu_known"`
	MemGPU      uint64 `json:"memory_gpu_bytes"`
	MemOutside  uint64 `json:"memory_outside_bytes"`
	// MemOutsideFlagged: MemOutside exceeds what the driver itself keeps for the tenant's contexts
	// (ContextAllowance per process NVML lists), so something allocated past the library.
	MemOutsideFlagged bool   `json:"memory_outside_flagged"`
	OOMRefusals       uint64 `json:"oom_refusals"`
	QueueDelayNs      uint64 `json:"queue_delay_ns"`
	QueueDelayMaxNs   uint64 `json:"queue_delay_max_ns"`
	// Issue 12: the latency the library observed (completion of each synchronisation that waited for work; counters
	// of the client page), the tenant's target and the dispatch gate the scheduler set.
	Pinned        bool    `json:"pinned"`
	SLOP99Ms      float64 `json:"slo_p99_ms,omitempty"`
	LatencyCount  uint64  `json:"latency_completions"`
	LatencyP99Ms  float64 `json:"latency_p99_ms"` // upper edge of the histogram bucket holding the P99 (1/8 octave)
	SLOWithin     uint64  `json:"slo_within"`     // completions certainly within the SLO
	SLOAttainment float64 `json:"slo_attainment"` // SLOWithin / LatencyCount; 0 without SLO or completions
	GateDepth     uint32  `json:"gate_depth"`     // kernels in flight per stream, 0 = no gate
	GateBudgetUs  uint32  `json:"gate_budget_us"` //
	GateWaits     uint64  `json:"gate_waits"`     // launches the gate held back
	GateWaitNs    uint64  `json:"gate_wait_ns"`   // time they waited
	// NarrowGroups (issue 26): groups of its grant its memory-bound kernels run on beside a latency-critical
	// tenant (scheduler.narrow_groups), 0 = all of it (NarrowNote)
	NarrowGroups uint32 `json:"narrow_groups"`
	// Issue 26: the SLO controller's last decision (tenants with slo-p99): SM groups left to lower tiers beyond one
	// neighbour's floor (the rest of the GPU is its exclusive partition), the P99 of its last window, the P99 measured at the most protective share (what it
	// can count on beside these neighbours; 0 until measured) and its state: "starting", "meeting", "missing"
	// (last window above the SLO) or "infeasible" (missed even at the most protective share).
	SLOGivenBackGroups uint32  `json:"slo_given_back_groups,omitempty"`
	SLOWindowP99Ms     float64 `json:"slo_window_p99_ms,omitempty"`
	SLOFloorMs         float64 `json:"slo_floor_ms,omitempty"`
	SLOState           string  `json:"slo_state,omitempty"`
	// SLOHolding: "infeasible", and the controller holds the largest share whose P99 was within 10 % of the floor
	// (SLOGivenBackGroups) rather than the most protective one.
	SLOHolding bool `json:"slo_holding,omitempty"`
	// Rates over the interval since the previous snapshot (Rates fills them).
	BusyPct     float64 `json:"busy_percent"`
	LaunchesSec float64 `json:"launches_per_second"`
}

// SLOStateName names the SLO controller's state bits (table.SLO*).
func SLOStateName(st uint32) string {
	switch {
	case st&table.SLOActive == 0:
		return "starting"
	case st&table.SLOInfeasible != 0:
		return "infeasible"
	case st&table.SLOMiss != 0:
		return "missing"
	}
	return "meeting"
}

// PolicyName names the policy id in the header (sched/policy.Kind.ID).
func PolicyName(id uint32) string {
	switch id {
	case 1:
		return "throughput-oriented"
	case 2:
		return "tpot-first"
	}
	return "none"
}

// Open maps runDir's table read-only. The error says clearly when there is no table or it is of another version.
func Open(runDir string) (*table.Table, error) {
	t, err := table.OpenReadOnly(runDir)
	if err != nil {
		return nil, fmt.Errorf("open the DetShare table in %s: %w", runDir, err)
	}
	return t, nil
}

// Take reads a snapshot.
func Take(t *table.Table) Snapshot {
	s := Snapshot{RunDir: t.Paths().Dir, Taken: time.Now(), TakenNs: table.MonotonicNs()}
	li := t.Leader()
	s.Scheduler = Leader{PID: li.PID, Epoch: li.Epoch, Alive: t.LeaderAlive(5 * time.Second),
		Policy: PolicyName(atomic.LoadUint32(&t.Header().Policy))}
	if li.HeartbeatNs != 0 && s.TakenNs > li.HeartbeatNs {
		s.Scheduler.HeartbeatAge = float64(s.TakenNs-li.HeartbeatNs) / 1e9
	}
	regs := t.List()
	slotID := map[int]string{}
	for _, r := range regs {
		slotID[r.Slot] = r.ID
	}
	for _, g := range t.GPUs() {
		e := t.GPU(g.Index)
		v := GPU{Index: g.Index, UUID: g.UUID, Name: g.Name, SMs: g.SMCount, MemTotal: g.MemTotal, Groups: g.Split.RunSizes(),
			SplitKnown: g.Split.Published, MPS: table.MPSName(g.MPSState), Mode: table.ModeName(g.Mode),
			GrantChanges: atomic.LoadUint64(&e.GrantChanges), Simulated: len(g.UUID) > 4 && g.UUID[:4] == "SIM-"}
		if tok := t.ReadToken(g.Index); tok.Holder >= 0 {
			v.TokenHolder = slotID[tok.Holder]
		}
		s.GPUs = append(s.GPUs, v)
	}
	for _, r := range regs {
		v := Tenant{ID: r.ID, Slot: r.Slot, GPU: r.GPU, Tier: r.Tier.String(), Role: r.Role.String(), Weight: r.Weight,
			Lend: r.Flags&table.FlagLend != 0, HostTenant: r.HostTenant(), GuaranteedSMs: r.SMs, MemLimit: r.MemLimit}
		id := workload.Read(t.Paths(), r.ID)
		v.Pod, v.Namespace, v.Container = id.Pod, id.Namespace, id.Container
		if g, err := t.ReadGrant(r.Slot); err == nil {
			v.GrantedSMs, v.GrantGroups, v.GrantMode, v.GrantEpoch = g.SMs, g.Groups, table.ModeName(g.Mode), g.Epoch
		}
		v.Pinned = r.Flags&table.FlagPinned != 0
		v.SLOP99Ms = float64(r.SLOP99Us) / 1000
		v.GateDepth, v.GateBudgetUs = t.Gate(r.Slot)
		v.NarrowGroups = t.Narrow(r.Slot)
		if rep := t.SLOReportOf(r.Slot); r.Tier == table.TierLatencyCritical && !v.Pinned && r.SLOP99Us > 0 {
			v.SLOGivenBackGroups, v.SLOState = rep.GivenBack, SLOStateName(rep.State)
			v.SLOHolding = rep.State&table.SLOHolding != 0 && rep.State&table.SLOInfeasible != 0
			v.SLOWindowP99Ms, v.SLOFloorMs = float64(rep.WindowUs)/1000, float64(rep.FloorUs)/1000
		}
		if cl, err := table.OpenClientPageReadOnly(r.ClientPagePath); err == nil {
			p := cl.Page()
			v0 := v
			// A tenant may truncate its page under us: a fault only loses this tenant's counters.
			if table.Guard("client page of "+r.ID, func() {
				if p.Slot == uint32(r.Slot) && p.SlotGen == r.Gen {
					v.Demand = atomic.LoadUint32(&p.Demand)
					v.Launches = atomic.LoadUint64(&p.Launches)
					v.BusyNs = atomic.LoadUint64(&p.BusyNs)
					v.MemUsed = atomic.LoadUint64(&p.MemUsed)
					v.OOMRefusals = atomic.LoadUint64(&p.OOMRefusals)
					v.QueueDelayNs = atomic.LoadUint64(&p.QueueDelayNs)
					v.QueueDelayMaxNs = atomic.LoadUint64(&p.QueueDelayMaxNs)
					latency(&v, p)
					v.Processes = cl.LiveProcesses()
					// Live processes count their own launches (the page holds those of processes that left);
					// per-process busy time is more up to date than the page total.
					var launches, busy uint64
					for i := range p.Procs {
						if atomic.LoadUint32(&p.Procs[i].State) == table.ProcLive {
							launches += atomic.LoadUint64(&p.Procs[i].Launches)
							busy += atomic.LoadUint64(&p.Procs[i].BusyNs)
						}
					}
					v.Launches += launches
					if busy > v.BusyNs {
						v.BusyNs = busy
					}
					// The library adds a busy period to busy_ns only when it ends (the process drains): a tenant busy
					// without pause would read 0% busy between two frames. Count the running period up to now.
					if since := atomic.LoadUint64(&p.DemandSinceNs); v.Demand > 0 && since > 0 && s.TakenNs > since {
						v.BusyNs += s.TakenNs - since
					}
				}
			}) != nil {
				v = v0
			}
			cl.Close()
		}
		s.Tenants = append(s.Tenants, v)
	}
	sort.Slice(s.Tenants, func(i, j int) bool {
		if s.Tenants[i].GPU != s.Tenants[j].GPU {
			return s.Tenants[i].GPU < s.Tenants[j].GPU
		}
		return s.Tenants[i].ID < s.Tenants[j].ID
	})
	AccountAll(&s)
	return s
}

// latency fills the observed-latency fields from a client page's histogram (counters the library increments).
func latency(v *Tenant, p *table.ClientPage) {
	var h [policy.LatencyBuckets]uint64
	var f [policy.FineBuckets]uint64
	for i := range h {
		h[i] = atomic.LoadUint64(&p.LatHist[i])
	}
	for i := range f {
		f[i] = atomic.LoadUint64(&p.LatFine[i])
	}
	p99, n := policy.WindowP99(h, f)
	v.LatencyCount, v.LatencyP99Ms = n, float64(p99)/1e6
	v.GateWaits, v.GateWaitNs = atomic.LoadUint64(&p.GateWaits), atomic.LoadUint64(&p.GateWaitNs)
	if v.SLOP99Ms > 0 && n > 0 {
		v.SLOWithin, _ = policy.HistWithin(h, time.Duration(v.SLOP99Ms*1e6))
		v.SLOAttainment = float64(v.SLOWithin) / float64(n)
	}
}

// Rates fills busy % and launches/s of cur from the difference with prev (same tenant ID and slot).
func Rates(prev, cur *Snapshot) {
	if prev == nil || cur.TakenNs <= prev.TakenNs {
		return
	}
	dt := float64(cur.TakenNs - prev.TakenNs)
	old := map[string]Tenant{}
	for _, t := range prev.Tenants {
		old[t.ID] = t
	}
	for i := range cur.Tenants {
		c := &cur.Tenants[i]
		p, ok := old[c.ID]
		if !ok || p.Slot != c.Slot {
			continue
		}
		if c.BusyNs >= p.BusyNs {
			c.BusyPct = 100 * float64(c.BusyNs-p.BusyNs) / dt
			if c.BusyPct > 100 {
				c.BusyPct = 100
			}
		}
		if c.Launches >= p.Launches {
			c.LaunchesSec = float64(c.Launches-p.Launches) / (dt / 1e9)
		}
	}
}

// Groups counts the groups in a mask.
func Groups(mask uint64) int { return bits.OnesCount64(mask) }

// RunDirExists tells whether runDir has a table (for friendlier messages).
func RunDirExists(runDir string) bool {
	_, err := os.Stat(table.NewPaths(runDir).Table())
	return err == nil
}

// ContextAllowance is the device memory the driver may keep per process for its context, outside anything the
// library charges: 516 MiB per MPS client on the H100 (driver 580, BENCHMARKS.md, issue 27 outside_mem.sh), with
// headroom. Only what a tenant holds beyond it per process is flagged as allocated past the library.
const ContextAllowance = 768 << 20

// GPUMemory fills every tenant's MemGPU and MemOutside (issue 27): read gives a GPU's per-process device memory
// (host PID -> bytes, gpuinfo.ProcessMemorySampler), and each process is attributed to a tenant by what the kernel
// says of it (table.Attributor), never by what a tenant wrote. A GPU that cannot be read leaves its tenants unknown
// (the error is returned, the rest is filled).
func GPUMemory(s *Snapshot, t *table.Table, read func(gpu int) (map[int]uint64, error)) error {
	if read == nil || len(s.Tenants) == 0 {
		return nil
	}
	gpus := make([]int, 0, len(s.GPUs))
	for _, g := range s.GPUs {
		gpus = append(gpus, g.Index)
	}
	procs, known, _, err := TenantProcesses(t, t.List(), gpus, read)
	used := map[string]uint64{}
	for id, ps := range procs {
		for _, p := range ps {
			used[id] += p.Bytes
		}
	}
	for i := range s.Tenants {
		v := &s.Tenants[i]
		if !known[v.GPU] {
			continue
		}
		v.MemGPUKnown, v.MemGPU = true, used[v.ID]
		if v.MemGPU > v.MemUsed {
			v.MemOutside = v.MemGPU - v.MemUsed
		}
		v.MemOutsideFlagged = v.MemOutside > uint64(len(procs[v.ID]))*ContextAllowance
	}
	return err
}

// ProcMem is one process's device memory, as NVML reports it.
type ProcMem struct {
	PID   int
	Bytes uint64
}

// TenantProcesses reads the per-process device memory of each GPU in gpus once (read: host PID -> bytes) and
// attributes every process to a tenant of regs by what the kernel says of it (table.Attributor), never by what a
// tenant wrote. known holds the GPUs read; attr is nil when no GPU listed a process (the attributor opens every
// client page, so it is made only then). A GPU that cannot be read is left out and its error returned.
func TenantProcesses(t *table.Table, regs []table.Registration, gpus []int,
	read func(gpu int) (map[int]uint64, error)) (procs map[string][]ProcMem, known map[int]bool, attr *table.Attributor, err error) {
	procs, known = map[string][]ProcMem{}, map[int]bool{}
	var errs []error
	for _, g := range gpus {
		mem, rerr := read(g)
		if rerr != nil {
			errs = append(errs, rerr)
			continue
		}
		known[g] = true
		if len(mem) > 0 && attr == nil {
			attr = t.NewAttributor(regs, nil)
		}
		for pid, b := range mem {
			if id, ok := attr.Tenant(pid); ok {
				procs[id] = append(procs[id], ProcMem{pid, b})
			}
		}
	}
	return procs, known, attr, errors.Join(errs...)
}

// NarrowNote is how status and top say where a tenant's memory-bound kernels run; "" when on its whole grant.
func (t Tenant) NarrowNote() string {
	if t.NarrowGroups == 0 {
		return ""
	}
	return fmt.Sprintf("memory-bound kernels on %d groups of its grant (beside a latency-critical tenant)", t.NarrowGroups)
}
