package table

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ProcIdentity identifies a process without trusting a PID seen inside a namespace: the inode of its PID
// namespace, its PID in that namespace and its start time (docs/internals.md "Process identity").
type ProcIdentity struct {
	NSPid     uint32
	PidNSIno  uint64
	StartTime uint64 // clock ticks since boot (/proc/<pid>/stat field 22)
	HostPID   uint64 // known for host tenants, else 0
}

// procRoot is /proc; a variable so tests can point it elsewhere.
var procRoot = "/proc"

// readProcDir lists procRoot; a variable so that a test can start a process while the listing is taken.
var readProcDir = os.ReadDir

// ProcStartTime returns field 22 (starttime) of /proc/<pid>/stat.
func ProcStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, fmt.Errorf("read start time of pid %d: %w", pid, err)
	}
	return parseStatStartTime(b)
}

func parseStatStartTime(b []byte) (uint64, error) {
	// comm may contain spaces and parentheses: fields restart after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc stat: no ')' in %q", b)
	}
	// Field 3 (state) is the first after comm; starttime is field 22, the 20th. Fields are counted in place
	// (the reaper parses every process of the host four times a second).
	rest := b[i+1:]
	n := 0
	for len(rest) > 0 {
		rest = bytes.TrimLeft(rest, " \t\n")
		if len(rest) == 0 {
			break
		}
		end := bytes.IndexAny(rest, " \t\n")
		if end < 0 {
			end = len(rest)
		}
		if n++; n == 20 {
			v, err := strconv.ParseUint(string(rest[:end]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse /proc stat starttime %q: %w", rest[:end], err)
			}
			return v, nil
		}
		rest = rest[end:]
	}
	return 0, fmt.Errorf("parse /proc stat: %d fields after comm, want >= 20", n)
}

// HostProcessAlive tells whether host PID pid is alive and is the process that started at startTime (not a
// later process that reused the PID). Zombies count as dead: they run nothing.
func HostProcessAlive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	st, alive, err := procStat(pid)
	return err == nil && alive && st == startTime
}

// procStat reads /proc/<pid>/stat once: the start time, and whether the process is running (not a zombie).
func procStat(pid int) (uint64, bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, false, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	st, err := parseStatStartTime(b)
	if err != nil {
		return 0, false, err
	}
	i := bytes.LastIndexByte(b, ')')
	alive := i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
	return st, alive, nil
}

// SelfIdentity returns the identity of the calling process as it would record itself in its client page.
func SelfIdentity() (ProcIdentity, error) { return PidIdentity(os.Getpid()) }

// PidIdentity returns the identity of host process pid.
func PidIdentity(pid int) (ProcIdentity, error) {
	id, _, err := pidIdentity(pid)
	return id, err
}

func pidIdentity(pid int) (ProcIdentity, bool, error) { return pidIdentityIn(pid, 0) }

// pidIdentityIn is pidIdentity knowing that procRoot's own PID namespace has inode ownNS (0: unknown): a process in
// it has its innermost PID equal to pid, so its status file need not be read (most of a host's processes, which
// ScanProcesses walks every reap period).
func pidIdentityIn(pid int, ownNS uint64) (ProcIdentity, bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("%s/%d/ns/pid", procRoot, pid), &st); err != nil {
		return ProcIdentity{}, false, fmt.Errorf("stat pid namespace of %d: %w", pid, err)
	}
	nspid := uint32(pid)
	if ownNS == 0 || st.Ino != ownNS {
		var err error
		if nspid, err = innermostNSPid(pid); err != nil {
			return ProcIdentity{}, false, err
		}
	}
	start, alive, err := procStat(pid)
	if err != nil {
		return ProcIdentity{}, false, err
	}
	return ProcIdentity{NSPid: nspid, PidNSIno: st.Ino, StartTime: start, HostPID: uint64(pid)}, alive, nil
}

func innermostNSPid(pid int) (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/status", procRoot, pid))
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			v, err := strconv.ParseUint(f[len(f)-1], 10, 32)
			if err != nil {
				return 0, fmt.Errorf("parse NSpid of pid %d: %w", pid, err)
			}
			return uint32(v), nil
		}
	}
	return uint32(pid), nil // kernels without NSpid have a single PID namespace
}

type procKey struct {
	ino   uint64
	nspid uint32
}

// procSeen is what a scan saw of one process: its start time and its host PID.
type procSeen struct {
	start uint64
	pid   int
}

// ProcSet is a snapshot of the live processes of the host, keyed by identity; build it once per reaping pass.
type ProcSet struct {
	byKey map[procKey]procSeen
	// byHostPID: host PID -> start time, for the liveness of host tenants' owners (no read per owner).
	byHostPID map[uint64]uint64
	// startedBefore is the clock tick (since boot, /proc/uptime x USER_HZ) in which the walk began: a process
	// missing from the set is dead only if it started in an earlier tick. One that started later was simply not
	// there to be seen, which matters once a scan is applied some time after it was taken (the scheduler scans
	// beside its decision loop). 0: unknown, every missing process counts as dead.
	startedBefore uint64
}

// userHZ is the unit of /proc/<pid>/stat's starttime: USER_HZ, 100 on every Linux architecture DetShare runs on.
const userHZ = 100

// uptimeTicks reads /proc/uptime in USER_HZ ticks; 0 when it cannot.
func uptimeTicks() uint64 {
	b, err := os.ReadFile(procRoot + "/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	ticks, ok := parseUptimeTicks(f[0])
	if !ok {
		return 0
	}
	return ticks
}

// parseUptimeTicks turns /proc/uptime's seconds ("81166.47") into USER_HZ ticks, in integers: through a float,
// 80000.01 s came out as 7999999.99... and so one tick short (6 % of values), which made a process that started in
// the tick before a scan look as if it might have started after it, and a pass did not reap it.
func parseUptimeTicks(s string) (uint64, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || sec > 1<<40 {
		return 0, false
	}
	var sub, scale uint64 = 0, 1
	for _, c := range frac {
		if c < '0' || c > '9' {
			return 0, false
		}
		if scale < 1e9 { // digits past a nanosecond change no tick
			sub, scale = sub*10+uint64(c-'0'), scale*10
		}
	}
	ticks := sec*userHZ + sub*userHZ/scale
	return ticks, ticks > 0
}

// ScanProcesses walks /proc once. Processes that vanish during the walk are skipped.
func ScanProcesses() (*ProcSet, error) {
	// The scan's time comes before the listing: a process that starts while /proc is listed may be missing from it,
	// and must not count as one that started before the scan (Dead). Taken after, on a loaded host where the walk
	// spans ticks, it made such a process dead.
	startedBefore := uptimeTicks()
	ents, err := readProcDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", procRoot, err)
	}
	var ownNS uint64 // the PID namespace procRoot shows PIDs of (the scanner's own)
	var self unix.Stat_t
	if unix.Stat(procRoot+"/self/ns/pid", &self) == nil {
		ownNS = self.Ino
	}
	ps := &ProcSet{byKey: make(map[procKey]procSeen, len(ents)), byHostPID: make(map[uint64]uint64, len(ents)),
		startedBefore: startedBefore}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		id, alive, err := pidIdentityIn(pid, ownNS)
		if err != nil || !alive {
			continue
		}
		ps.byKey[procKey{id.PidNSIno, id.NSPid}] = procSeen{id.StartTime, pid}
		ps.byHostPID[uint64(pid)] = id.StartTime
	}
	return ps, nil
}

// HostDead tells whether host process pid that started at startTime is gone for sure: not in the scan (or another
// process has its PID now) although it had started before the scan began. Zombies count as dead (ScanProcesses
// leaves them out), as in HostProcessAlive.
func (ps *ProcSet) HostDead(pid int, startTime uint64) bool {
	if pid <= 0 {
		return true
	}
	if st, ok := ps.byHostPID[uint64(pid)]; ok && st == startTime {
		return false
	}
	return ps.startedBefore == 0 || startTime < ps.startedBefore
}

// Dead tells whether the process with this identity is gone for sure: missing from the scan although it had
// started before the scan began.
func (ps *ProcSet) Dead(id ProcIdentity) bool {
	if ps.Alive(id) {
		return false
	}
	return ps.startedBefore == 0 || id.StartTime < ps.startedBefore
}

// Alive tells whether the process with this identity was alive at the scan.
func (ps *ProcSet) Alive(id ProcIdentity) bool {
	st, ok := ps.byKey[procKey{id.PidNSIno, id.NSPid}]
	return ok && st.start == id.StartTime
}

// HostPID returns the host PID of the process with this identity, when it was alive at the scan.
func (ps *ProcSet) HostPID(id ProcIdentity) (int, bool) {
	st, ok := ps.byKey[procKey{id.PidNSIno, id.NSPid}]
	if !ok || st.start != id.StartTime {
		return 0, false
	}
	return st.pid, true
}

// MapsFile tells whether host process pid has a mapping of the file with device dev and inode ino, as the kernel
// reports it in /proc/<pid>/maps (a process that cannot be read, or is gone, maps nothing). Every process of a tenant
// that took a process entry in its client page has the page mapped (libdetshare maps it before it claims an entry),
// so this is how the reaper tells a real process of the tenant from an entry that names some other process: the
// entries are written by the tenant, the mappings by the kernel (issue 27).
func MapsFile(pid int, dev, ino uint64) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/maps", procRoot, pid))
	if err != nil {
		return false
	}
	want := fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
	inode := strconv.FormatUint(ino, 10)
	for _, line := range strings.Split(string(b), "\n") {
		// address perms offset dev inode [path]
		f := strings.Fields(line)
		if len(f) >= 5 && f[4] == inode && strings.EqualFold(f[3], want) {
			return true
		}
	}
	return false
}

// IsProcessAlive resolves one identity through /proc. When the host PID is known that is one read; otherwise it
// scans /proc (use ScanProcesses for many).
func IsProcessAlive(id ProcIdentity) bool {
	if id.HostPID != 0 {
		return HostProcessAlive(int(id.HostPID), id.StartTime)
	}
	ps, err := ScanProcesses()
	if err != nil {
		return true // cannot tell: never reap on doubt
	}
	return ps.Alive(id)
}
