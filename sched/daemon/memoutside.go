package daemon

import (
	"sort"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/view"
)

// Memory past the library (issue 27): the library charges every allocation it sees against the tenant's quota, but a
// process may call the driver around it, or run without it. NVML reports what every process holds on the device, so
// a tenant whose processes together hold more than its quota plus the driver's own context memory per process
// (view.ContextAllowance) allocated past the library. With tenants.memory_outside = kill the reaper kills the largest
// of those processes each round, as a memory cgroup's OOM killer would; the next round looks again. The processes
// are the tenant's by what the kernel says (table.Attributor), never by what the tenant wrote, and the kill goes
// through a pidfd opened before the process is attributed again, so a PID reused meanwhile is never signalled.

// killProcess sends SIGKILL through pidfd; a variable so that a test can see whom the reaper would kill.
var killProcess = func(pidfd int) error { return unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0) }

// overQuota is one tenant past its quota: its processes on the GPU (largest first) and what they hold.
type overQuota struct {
	id           string
	limit, total uint64
	procs        []view.ProcMem
}

// tenantsOverQuota reads every GPU's per-process memory once and returns the tenants with a memory quota whose
// processes hold more than it plus ContextAllowance each.
func tenantsOverQuota(t *table.Table, read func(int) (map[int]uint64, error)) ([]overQuota, *table.Attributor, error) {
	regs := t.List()
	limits, gpuSet := map[string]uint64{}, map[int]bool{}
	for _, r := range regs {
		if r.MemLimit > 0 {
			limits[r.ID] = r.MemLimit
			gpuSet[r.GPU] = true
		}
	}
	if len(limits) == 0 {
		return nil, nil, nil
	}
	gpus := make([]int, 0, len(gpuSet))
	for g := range gpuSet {
		gpus = append(gpus, g)
	}
	per, _, attr, err := view.TenantProcesses(t, regs, gpus, read)
	var over []overQuota
	for id, ps := range per {
		if limits[id] == 0 {
			continue
		}
		var total uint64
		for _, p := range ps {
			total += p.Bytes
		}
		if total <= limits[id]+uint64(len(ps))*view.ContextAllowance {
			continue
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i].Bytes > ps[j].Bytes })
		over = append(over, overQuota{id: id, limit: limits[id], total: total, procs: ps})
	}
	sort.Slice(over, func(i, j int) bool { return over[i].id < over[j].id })
	return over, attr, err
}

// enforceMemoryOutside is the reaper's memory round; it returns how many processes it killed.
func (s *Scheduler) enforceMemoryOutside() int {
	read := s.opts.ProcessMemory
	mode := s.Config().Tenants.MemoryOutside
	if read == nil || (mode != config.MemoryOutsideKill && mode != config.MemoryOutsideReport) {
		return 0
	}
	over, attr, err := tenantsOverQuota(s.t, read)
	if err != nil {
		logrus.WithError(err).Debug("per-process GPU memory not read")
	}
	killed := 0
	for _, o := range over {
		p := o.procs[0]
		f := logrus.Fields{"id": o.id, "pid": p.PID, "held": p.Bytes, "tenant_total": o.total, "quota": o.limit}
		if mode != config.MemoryOutsideKill {
			logrus.WithFields(f).Warn("tenant holds device memory past the library beyond its quota (memory_outside = report)")
			continue
		}
		fd, err := unix.PidfdOpen(p.PID, 0)
		if err != nil {
			continue // gone already
		}
		// attributed again with the pidfd held: the PID cannot be reused for another process until it is closed
		if id, ok := attr.Tenant(p.PID); !ok || id != o.id {
			unix.Close(fd)
			continue
		}
		if err := killProcess(fd); err != nil {
			logrus.WithFields(f).WithError(err).Warn("tenant over its memory quota past the library: kill failed")
		} else {
			killed++
			logrus.WithFields(f).Warn("tenant over its memory quota past the library: its largest process killed")
		}
		unix.Close(fd)
	}
	return killed
}
