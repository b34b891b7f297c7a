package table

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Client is a mapping of one tenant's client page. The tenant's processes write it; the scheduler reads it and
// the reaper credits dead processes in it.
type Client struct {
	path string
	mem  []byte
}

// ErrNoProcSlot is returned by AttachProcess when all MaxProcs process entries are in use.
var ErrNoProcSlot = errors.New("no free process entry in client page")

// OpenClientPage maps a client page read-write and checks its magic and ABI version.
func OpenClientPage(path string) (*Client, error) { return openClientPage(path, false) }

// OpenClientPageReadOnly maps a client page read-only (viewers such as `detshare top`); its writers fault.
func OpenClientPageReadOnly(path string) (*Client, error) { return openClientPage(path, true) }

func openClientPage(path string, ro bool) (*Client, error) {
	flags, prot := os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	if ro {
		flags, prot = os.O_RDONLY, unix.PROT_READ
	}
	mem, err := mapFile(path, flags, prot, ClientPageSize)
	if err != nil {
		return nil, err
	}
	cp := (*ClientPage)(unsafe.Pointer(&mem[0]))
	magic, version := cp.Magic, cp.ABIVersion // read before any unmap
	if magic != ClientMagic {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("%w: client page %s: magic %#x, want %#x", ErrCorrupt, path, magic, ClientMagic)
	}
	if version != ABIVersion {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("%w: client page %s has ABI version %d, this DetShare speaks %d",
			ErrVersionMismatch, path, version, ABIVersion)
	}
	return &Client{path: path, mem: mem}, nil
}

// ReadClientPage copies the client page at path into dst with one read (no mapping), and checks its magic and ABI
// version. For readers that look at many pages once (placement reads every neighbour's at a registration): mapping
// and unmapping a page costs ~0.3 ms on a small VM (the unmap's TLB shootdown), a read ~10 µs. The copy is not
// atomic: fields a process updates meanwhile may be torn between them (each 8-byte field is read whole); a
// truncated page is an error, never a fault.
func ReadClientPage(path string, dst *ClientPage) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := unsafe.Slice((*byte)(unsafe.Pointer(dst)), unsafe.Sizeof(*dst)) // ClientPageSize (abi_test.go)
	if n, err := f.ReadAt(buf, 0); n != len(buf) {
		return fmt.Errorf("%w: client page %s: read %d of %d bytes: %v", ErrCorrupt, path, n, len(buf), err)
	}
	if dst.Magic != ClientMagic {
		return fmt.Errorf("%w: client page %s: magic %#x, want %#x", ErrCorrupt, path, dst.Magic, ClientMagic)
	}
	if dst.ABIVersion != ABIVersion {
		return fmt.Errorf("%w: client page %s has ABI version %d, this DetShare speaks %d",
			ErrVersionMismatch, path, dst.ABIVersion, ABIVersion)
	}
	return nil
}

// Close unmaps the page.
func (c *Client) Close() error {
	if c.mem == nil {
		return nil
	}
	err := unix.Munmap(c.mem)
	c.mem = nil
	return err
}

// Page returns the mapped page.
func (c *Client) Page() *ClientPage { return (*ClientPage)(unsafe.Pointer(&c.mem[0])) }

// Path returns the page's file.
func (c *Client) Path() string { return c.path }

// AttachProcess claims a process entry for id: CAS FREE->CLAIMING, heartbeat, identity, then CAS
// CLAIMING->LIVE (a reaper may have taken a claim that looked stuck; then the next entry is tried).
func (c *Client) AttachProcess(id ProcIdentity) (int, error) {
	cp := c.Page()
	for i := range cp.Procs {
		p := &cp.Procs[i]
		if !atomic.CompareAndSwapUint32(&p.State, ProcFree, ProcClaiming) {
			continue
		}
		atomic.StoreUint64(&p.HeartbeatNs, MonotonicNs())
		atomic.StoreUint32(&p.NSPid, id.NSPid)
		atomic.StoreUint64(&p.PidNSIno, id.PidNSIno)
		atomic.StoreUint64(&p.StartTime, id.StartTime)
		atomic.StoreUint64(&p.HostPID, id.HostPID)
		atomic.StoreUint64(&p.MemUsed, 0)
		atomic.StoreUint64(&p.Launches, 0)
		atomic.StoreUint64(&p.BusyNs, 0)
		atomic.StoreUint64(&p.Queued, 0)
		atomic.StoreUint32(&p.Busy, 0)
		if atomic.CompareAndSwapUint32(&p.State, ProcClaiming, ProcLive) {
			return i, nil
		}
	}
	return -1, fmt.Errorf("attach to %s: %w (%d in use)", c.path, ErrNoProcSlot, MaxProcs)
}

// DetachProcess releases entry i at a clean exit: its memory is credited back and its demand withdrawn.
func (c *Client) DetachProcess(i int) error {
	if i < 0 || i >= MaxProcs {
		return fmt.Errorf("detach: process entry %d out of range 0..%d", i, MaxProcs-1)
	}
	p := &c.Page().Procs[i]
	if !atomic.CompareAndSwapUint32(&p.State, ProcLive, ProcReaping) {
		return fmt.Errorf("detach: process entry %d is not live (state %d)", i, atomic.LoadUint32(&p.State))
	}
	c.releaseProc(p)
	return nil
}

// releaseProc credits a REAPING entry's memory and demand to the page, adds its launches to the page total, and
// frees it.
func (c *Client) releaseProc(p *Proc) uint64 {
	cp := c.Page()
	mem := atomic.SwapUint64(&p.MemUsed, 0)
	if mem != 0 {
		subSaturating(&cp.MemUsed, mem)
	}
	atomic.AddUint64(&cp.Launches, atomic.SwapUint64(&p.Launches, 0))
	if atomic.SwapUint32(&p.Busy, 0) != 0 {
		c.adjustDemand(-1)
	}
	atomic.StoreUint64(&p.HeartbeatNs, MonotonicNs())
	atomic.StoreUint32(&p.State, ProcFree)
	return mem
}

func subSaturating(addr *uint64, v uint64) {
	for {
		old := atomic.LoadUint64(addr)
		n := uint64(0)
		if old > v {
			n = old - v
		}
		if atomic.CompareAndSwapUint64(addr, old, n) {
			return
		}
	}
}

// ChargeMemory accounts size bytes allocated by process entry i against limit (0 = unlimited), as libdetshare
// does: a CAS loop on the page total so concurrent processes of one tenant can never exceed the limit together.
// It returns false (and counts an OOM refusal) when the allocation does not fit.
func (c *Client) ChargeMemory(i int, size, limit uint64) bool {
	cp := c.Page()
	for {
		old := atomic.LoadUint64(&cp.MemUsed)
		n := old + size
		if limit != 0 && (n > limit || n < old) {
			atomic.AddUint64(&cp.OOMRefusals, 1)
			return false
		}
		if atomic.CompareAndSwapUint64(&cp.MemUsed, old, n) {
			for {
				pk := atomic.LoadUint64(&cp.MemPeak)
				if n <= pk || atomic.CompareAndSwapUint64(&cp.MemPeak, pk, n) {
					break
				}
			}
			atomic.AddUint64(&cp.Procs[i].MemUsed, size)
			return true
		}
	}
}

// UnchargeMemory credits size bytes freed by process entry i.
func (c *Client) UnchargeMemory(i int, size uint64) {
	cp := c.Page()
	subSaturating(&cp.Procs[i].MemUsed, size)
	subSaturating(&cp.MemUsed, size)
}

// SetBusy records whether process entry i has queued work and updates the tenant's demand (demand, demand_seq,
// demand_since_ns). It returns true when the tenant's demand crossed idle<->busy, when the caller should ring the
// doorbell.
func (c *Client) SetBusy(i int, busy bool) bool {
	p := &c.Page().Procs[i]
	var v uint32
	if busy {
		v = 1
	}
	if atomic.SwapUint32(&p.Busy, v) == v {
		return false
	}
	if busy {
		// as in the library, a process turns busy at a launch, which it counts: the scheduler believes demand only
		// while these counters move (sched/daemon trust.go)
		atomic.AddUint64(&p.Launches, 1)
		atomic.AddUint64(&p.Queued, 1)
		return c.adjustDemand(+1)
	}
	return c.adjustDemand(-1)
}

func (c *Client) adjustDemand(delta int32) bool {
	cp := c.Page()
	var old, n uint32
	for {
		old = atomic.LoadUint32(&cp.Demand)
		if delta < 0 && old == 0 {
			return false
		}
		n = uint32(int32(old) + delta)
		if atomic.CompareAndSwapUint32(&cp.Demand, old, n) {
			break
		}
	}
	if old == 0 && n > 0 {
		atomic.StoreUint64(&cp.DemandSinceNs, MonotonicNs())
	}
	atomic.AddUint32(&cp.DemandSeq, 1)
	return (old == 0) != (n == 0)
}

// Heartbeat refreshes process entry i's heartbeat.
func (c *Client) Heartbeat(i int) { atomic.StoreUint64(&c.Page().Procs[i].HeartbeatNs, MonotonicNs()) }

// ClaimTimeout is how long a CLAIMING entry may stay so before the reaper takes it back (a claim takes
// microseconds; one this old belongs to a process killed mid-claim).
const ClaimTimeout = 10 * time.Second

// ReapDeadProcesses frees the entries of processes that are no longer alive (per ps, from ScanProcesses),
// crediting their memory and demand back to the page (CAS LIVE->REAPING, subtract ds_proc.mem_used, FREE). It also
// takes back claims stuck longer than ClaimTimeout. It returns the entries reaped and the bytes credited.
func (c *Client) ReapDeadProcesses(ps *ProcSet) (int, uint64) {
	cp := c.Page()
	n, bytes := 0, uint64(0)
	now := MonotonicNs()
	for i := range cp.Procs {
		p := &cp.Procs[i]
		switch atomic.LoadUint32(&p.State) {
		case ProcLive:
			id := ProcIdentity{NSPid: atomic.LoadUint32(&p.NSPid), PidNSIno: atomic.LoadUint64(&p.PidNSIno),
				StartTime: atomic.LoadUint64(&p.StartTime), HostPID: atomic.LoadUint64(&p.HostPID)}
			if !ps.Dead(id) {
				continue
			}
			if !atomic.CompareAndSwapUint32(&p.State, ProcLive, ProcReaping) {
				continue
			}
			bytes += c.releaseProc(p)
			n++
		case ProcClaiming:
			hb := atomic.LoadUint64(&p.HeartbeatNs)
			if now > hb && now-hb > uint64(ClaimTimeout) &&
				atomic.CompareAndSwapUint32(&p.State, ProcClaiming, ProcReaping) {
				bytes += c.releaseProc(p)
				n++
			}
		case ProcReaping:
			// A reaper died mid-release: finish it once it is clearly not in progress.
			hb := atomic.LoadUint64(&p.HeartbeatNs)
			if now > hb && now-hb > uint64(ClaimTimeout) {
				bytes += c.releaseProc(p)
				n++
			}
		}
	}
	return n, bytes
}

// LiveProcesses returns the number of LIVE process entries.
func (c *Client) LiveProcesses() int {
	n := 0
	for i := range c.Page().Procs {
		if atomic.LoadUint32(&c.Page().Procs[i].State) == ProcLive {
			n++
		}
	}
	return n
}
