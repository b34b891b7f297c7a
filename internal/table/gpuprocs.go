package table

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Attributor tells which tenant a host process works for, from what the kernel says about it, never from what a
// tenant wrote (issue 27): a process is a tenant's if it maps the tenant's client page (every process that loaded
// libdetshare does, bypassing it for its allocations or not); a container tenant's also if it is in the cgroup of
// one of those (a container's processes share the cgroup runc made, which they cannot leave); a host tenant's
// (`detshare run`) also if it descends from the tenant's owner. It is what `detshare status` needs to set the GPU
// memory NVML reports per process against what the library charged: memory taken past the library.
type Attributor struct {
	pages   map[[2]uint64]string // client page (device, inode) -> tenant
	cgroups map[string]string    // cgroup of a container tenant's process mapping its page -> tenant
	owners  map[int]ownerOf      // host tenant owner PID -> tenant
}

type ownerOf struct {
	id    string
	start uint64
}

// NewAttributor prepares an Attributor for regs: one stat per page, and for container tenants the cgroups of the
// live processes of their pages' entries that really map the page (ps resolves the entries' identities; nil: a
// walk of /proc is taken here).
func (t *Table) NewAttributor(regs []Registration, ps *ProcSet) *Attributor {
	a := &Attributor{pages: map[[2]uint64]string{}, cgroups: map[string]string{}, owners: map[int]ownerOf{}}
	for _, r := range regs {
		var st unix.Stat_t
		if unix.Stat(r.ClientPagePath, &st) != nil {
			continue
		}
		a.pages[[2]uint64{uint64(st.Dev), st.Ino}] = r.ID
		if r.HostTenant() {
			a.owners[r.OwnerPID] = ownerOf{r.ID, r.OwnerStart}
			continue
		}
		cl, err := OpenClientPageReadOnly(r.ClientPagePath)
		if err != nil {
			continue
		}
		var entries []ProcIdentity
		_ = Guard("processes of "+r.ID, func() {
			pg := cl.Page()
			if pg.Slot != uint32(r.Slot) || pg.SlotGen != r.Gen {
				return
			}
			for i := range pg.Procs {
				p := &pg.Procs[i]
				if atomic.LoadUint32(&p.State) == ProcLive {
					entries = append(entries, ProcIdentity{NSPid: atomic.LoadUint32(&p.NSPid),
						PidNSIno: atomic.LoadUint64(&p.PidNSIno), StartTime: atomic.LoadUint64(&p.StartTime),
						HostPID: atomic.LoadUint64(&p.HostPID)})
				}
			}
		})
		cl.Close()
		for _, e := range entries {
			if ps == nil {
				if ps, err = ScanProcesses(); err != nil {
					return a
				}
			}
			pid, ok := ps.HostPID(e)
			if !ok || !MapsFile(pid, uint64(st.Dev), st.Ino) {
				continue // an entry names a process that is not the tenant's: the tenant wrote it
			}
			if cg := processCgroup(pid); cg != "" && cg != "/" {
				a.cgroups[cg] = r.ID
			}
		}
	}
	return a
}

// Tenant returns the tenant host process pid works for, if any.
func (a *Attributor) Tenant(pid int) (string, bool) {
	if pid <= 0 {
		return "", false
	}
	if b, err := os.ReadFile(fmt.Sprintf("%s/%d/maps", procRoot, pid)); err == nil {
		for _, line := range bytes.Split(b, []byte("\n")) {
			f := strings.Fields(string(line))
			if len(f) < 6 || f[4] == "0" {
				continue
			}
			maj, min, ok := strings.Cut(f[3], ":")
			ino, err := strconv.ParseUint(f[4], 10, 64)
			mj, err1 := strconv.ParseUint(maj, 16, 32)
			mn, err2 := strconv.ParseUint(min, 16, 32)
			if !ok || err != nil || err1 != nil || err2 != nil {
				continue
			}
			if id, ok := a.pages[[2]uint64{unix.Mkdev(uint32(mj), uint32(mn)), ino}]; ok {
				return id, true
			}
		}
	}
	if cg := processCgroup(pid); cg != "" {
		if id, ok := a.cgroups[cg]; ok {
			return id, true
		}
	}
	// A host tenant's: a descendant of its owner (the owner itself runs no CUDA work). 64 generations at most.
	for p, n := pid, 0; p > 1 && n < 64; n++ {
		ppid, ok := parentOf(p)
		if !ok {
			break
		}
		if o, ok := a.owners[ppid]; ok {
			if start, err := ProcStartTime(ppid); err == nil && start == o.start {
				return o.id, true
			}
		}
		p = ppid
	}
	return "", false
}

// processCgroup is pid's cgroup v2 path (the "0::" line of /proc/<pid>/cgroup), "" when unknown.
func processCgroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/cgroup", procRoot, pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if cg, ok := strings.CutPrefix(l, "0::"); ok {
			return cg
		}
	}
	return ""
}

// parentOf is pid's parent (field 4 of /proc/<pid>/stat).
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}
