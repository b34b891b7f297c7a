package table

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// ErrVersionMismatch is returned by Open when the table was made by a DetShare of another ABI version. Nothing is
// written to such a table; its users run unshared until an operator replaces it.
var ErrVersionMismatch = errors.New("detshare table ABI version mismatch")

// ErrCorrupt is returned by Open when the file is not a DetShare table or its geometry is wrong.
var ErrCorrupt = errors.New("detshare table corrupt")

// File modes of the run directory (only root on the host writes the table; tenants ring the doorbell).
const (
	RunDirMode   os.FileMode = 0o755
	TableMode    os.FileMode = 0o644
	DoorbellMode os.FileMode = 0o666
	// A client page is writable by every user (a container's processes may drop to any user and must keep their
	// tenant's page), and reachable on the host only by root: ClientsDirMode. A container sees only its own page,
	// through its bind mount, which needs no access to the host directory.
	ClientPageMode os.FileMode = 0o666
	ClientsDirMode os.FileMode = 0o700
	QuotaFileMode  os.FileMode = 0o644
)

// Table is a mapping of the global table (and the doorbell, when it could be mapped).
type Table struct {
	paths    Paths
	mem      []byte
	bell     []byte
	readOnly bool
}

// Create makes the run directory, the table and the doorbell if they do not exist yet and opens them read-write.
// An existing table is opened (and validated) as Open does; it is never overwritten.
func Create(runDir string) (*Table, error) {
	p := NewPaths(runDir)
	for _, d := range []string{p.Dir, p.ClientsDir(), p.TenantsDir()} {
		if err := os.MkdirAll(d, RunDirMode); err != nil {
			return nil, fmt.Errorf("create run directory %s: %w", d, err)
		}
	}
	// Also for a run directory made by an older DetShare (clients/ 0755 and pages 0644 then).
	if err := os.Chmod(p.ClientsDir(), ClientsDirMode); err != nil {
		return nil, fmt.Errorf("create run directory %s: %w", p.ClientsDir(), err)
	}
	unlock, err := lockFile(p.Lock())
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeStaleTemporaries(p)
	if _, err := os.Stat(p.Table()); errors.Is(err, os.ErrNotExist) {
		if err := atomicfile.Write(p.Table(), initialTable(), TableMode, false); err != nil {
			return nil, fmt.Errorf("create table: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("stat table: %w", err)
	}
	if _, err := os.Stat(p.Doorbell()); errors.Is(err, os.ErrNotExist) {
		if err := atomicfile.Write(p.Doorbell(), initialDoorbell(), DoorbellMode, false); err != nil {
			return nil, fmt.Errorf("create doorbell: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("stat doorbell: %w", err)
	} else if _, err := repairDoorbellFile(p.Doorbell()); err != nil {
		// A doorbell a tenant damaged while no scheduler ran is put right before it is mapped; one that cannot be
		// is left out (waits by timeout) rather than refusing the table.
		logrus.WithError(err).Warn("doorbell damaged and not repaired; waiting by timeout")
	}
	return Open(runDir)
}

// Open maps an existing table (and its doorbell) read-write. It checks magic, ABI version and geometry first and
// returns ErrVersionMismatch or ErrCorrupt (wrapped, with the details) without writing anything.
func Open(runDir string) (*Table, error) { return open(NewPaths(runDir), false) }

// OpenReadOnly maps the table read-only, as a container or a viewer (`detshare top`) does. Writes through it fault.
func OpenReadOnly(runDir string) (*Table, error) { return open(NewPaths(runDir), true) }

func open(p Paths, ro bool) (*Table, error) {
	flags, prot := os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	if ro {
		flags, prot = os.O_RDONLY, unix.PROT_READ
	}
	mem, err := mapFile(p.Table(), flags, prot, TableSize)
	if err != nil {
		return nil, err
	}
	if err := validateTable(p.Table(), mem); err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	t := &Table{paths: p, mem: mem, readOnly: ro}
	// The doorbell is every tenant's to ring (0666), so even a read-only view maps it writable when it can. It is
	// optional: without one nobody can be woken, and waits fall back to their timeouts.
	bell, err := mapFile(p.Doorbell(), os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE, DoorbellSize)
	if err == nil && (*Doorbell)(unsafe.Pointer(&bell[0])).Magic != DoorbellMagic {
		_ = unix.Munmap(bell)
		bell, err = nil, ErrCorrupt
	}
	if err == nil {
		t.bell = bell
	}
	return t, nil
}

// mapFile maps the first size bytes of path; the file must be at least that long.
func mapFile(path string, flags, prot, size int) ([]byte, error) {
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Size() < int64(size) {
		return nil, fmt.Errorf("%w: %s is %d bytes, want at least %d (not a DetShare file of this version, or truncated)",
			ErrCorrupt, path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return mem, nil
}

func validateTable(path string, mem []byte) error {
	h := (*Header)(unsafe.Pointer(&mem[0]))
	if atomic.LoadUint64(&h.Magic) != TableMagic {
		return fmt.Errorf("%w: %s: magic %#x, want %#x", ErrCorrupt, path, h.Magic, TableMagic)
	}
	if v := atomic.LoadUint32(&h.ABIVersion); v != ABIVersion {
		return fmt.Errorf("%w: %s has ABI version %d, this DetShare speaks version %d; "+
			"stop the tenants using it and remove the run directory, or run the matching DetShare",
			ErrVersionMismatch, path, v, ABIVersion)
	}
	type geom struct {
		name      string
		got, want uint64
	}
	for _, g := range []geom{
		{"header_size", uint64(h.HeaderSize), HeaderSize},
		{"table_size", h.TableSize, TableSize},
		{"max_gpus", uint64(h.MaxGPUs), MaxGPUs},
		{"max_containers", uint64(h.MaxContainers), MaxContainers},
		{"gpu_entry_size", uint64(h.GPUEntrySize), GPUSize},
		{"container_entry_size", uint64(h.ContainerEntrySize), ContainerSize},
		{"gpus_offset", h.GPUsOffset, GPUsOffset},
		{"containers_offset", h.ContainersOffset, ContainersOffset},
	} {
		if g.got != g.want {
			return fmt.Errorf("%w: %s: header field %s is %d, want %d", ErrCorrupt, path, g.name, g.got, g.want)
		}
	}
	if s := atomic.LoadUint32(&h.State); s != TableReady {
		return fmt.Errorf("%w: %s: state %d, want %d (ready)", ErrCorrupt, path, s, TableReady)
	}
	return nil
}

func initialTable() []byte {
	b := make([]byte, TableSize)
	h := (*Header)(unsafe.Pointer(&b[0]))
	h.Magic = TableMagic
	h.ABIVersion = ABIVersion
	h.HeaderSize = HeaderSize
	h.TableSize = TableSize
	h.MaxGPUs = MaxGPUs
	h.MaxContainers = MaxContainers
	h.GPUEntrySize = GPUSize
	h.ContainerEntrySize = ContainerSize
	h.GPUsOffset = GPUsOffset
	h.ContainersOffset = ContainersOffset
	h.CreatedNs = uint64(time.Now().UnixNano())
	h.State = TableReady
	return b
}

func initialDoorbell() []byte {
	b := make([]byte, DoorbellSize)
	(*Doorbell)(unsafe.Pointer(&b[0])).Magic = DoorbellMagic
	return b
}

// staleTemporaryAge: a temporary of an atomic write (atomicfile) older than this in the run directory was left by a
// writer that died; a live write renames its temporary within microseconds.
const staleTemporaryAge = time.Minute

// removeStaleTemporaries removes, under the table lock, the table's and the doorbell's temporaries (written only under
// that lock, so any found were left by a creator that died) and any other temporary of the run directory older than
// staleTemporaryAge. Not a younger one: the run directory's other files (the containers' preload list, CDI cache,
// workload files) are written atomically by processes that do not take this lock, and removing a temporary in flight
// fails its writer's rename (CI: one of fifty containers starting at once was refused so).
func removeStaleTemporaries(p Paths) {
	tmps, err := filepath.Glob(atomicfile.TemporaryPattern(p.Dir))
	if err != nil {
		return
	}
	for _, tmp := range tmps {
		target, _ := atomicfile.TargetOf(filepath.Base(tmp))
		if target != filepath.Base(p.Table()) && target != filepath.Base(p.Doorbell()) {
			fi, err := os.Lstat(tmp)
			if err != nil || !fi.Mode().IsRegular() || time.Since(fi.ModTime()) < staleTemporaryAge {
				continue
			}
		}
		_ = os.Remove(tmp)
	}
}

// lockFile takes an exclusive flock on path (created if needed); the kernel drops it if the holder dies.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// Close unmaps the table.
func (t *Table) Close() error {
	var err error
	if t.mem != nil {
		err = unix.Munmap(t.mem)
		t.mem = nil
	}
	if t.bell != nil {
		if e := unix.Munmap(t.bell); err == nil {
			err = e
		}
		t.bell = nil
	}
	return err
}

// Paths returns the paths of this table's run directory.
func (t *Table) Paths() Paths { return t.paths }

// ReadOnly tells whether the table is mapped read-only.
func (t *Table) ReadOnly() bool { return t.readOnly }

// Header returns the mapped header. Fields read concurrently must be accessed with sync/atomic.
func (t *Table) Header() *Header { return (*Header)(unsafe.Pointer(&t.mem[0])) }

// GPU returns the mapped entry of GPU i (0 <= i < MaxGPUs).
func (t *Table) GPU(i int) *GPU {
	return (*GPU)(unsafe.Pointer(&t.mem[GPUsOffset+i*GPUSize]))
}

// Container returns the mapped entry of slot (0 <= slot < MaxContainers).
func (t *Table) Container(slot int) *Container {
	return (*Container)(unsafe.Pointer(&t.mem[ContainersOffset+slot*ContainerSize]))
}

// Doorbell returns the mapped doorbell, or nil when the run directory has none.
func (t *Table) Doorbell() *Doorbell {
	if t.bell == nil {
		return nil
	}
	return (*Doorbell)(unsafe.Pointer(&t.bell[0]))
}

// Generation returns the table generation (bumped by every register/deregister).
func (t *Table) Generation() uint64 { return atomic.LoadUint64(&t.Header().Generation) }

func (t *Table) mustWrite(op string) error {
	if t.readOnly {
		return fmt.Errorf("%s: table %s is mapped read-only", op, t.paths.Table())
	}
	return nil
}

// MonotonicNs is CLOCK_MONOTONIC in nanoseconds, the clock of every *_ns field except created/registered. It is the
// runtime's clock (CLOCK_MONOTONIC through the vDSO on Linux, TestMonotonicNsIsClockMonotonic): unix.ClockGettime
// is a real system call, and the scheduler reads the clock for every grant it publishes.
func MonotonicNs() uint64 { return uint64(nanotime()) }

//go:linkname nanotime runtime.nanotime
func nanotime() int64
