// Package hostleft finds what engine tests and the demo leave on the host outside their private directories:
// containerd's shim sockets in /run/containerd/s, runc state roots, ctr's fifo directories and other empty
// directories under /run/containerd,
// podman's /dev/shm/libpod_lock, an empty /run/runc, and DetShare's own temporary files in /tmp. Take a Snapshot
// before starting engines; after stopping them, Clean removes what appeared and is provably unused (a socket nobody
// listens on, an empty directory, a lock no podman holds), and Left lists what still appeared, for the test to fail
// on.
package hostleft

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Watched are the host paths looked at; globs are expanded.
var Watched = []string{
	"/run/containerd", "/run/containerd/s", "/run/containerd/s/*", "/run/containerd/runc", "/run/containerd/runc/*",
	"/run/containerd/io.containerd.runtime.v2.task", "/run/containerd/io.containerd.runtime.v2.task/*",
	"/run/containerd/fifo", "/run/containerd/fifo/*", // ctr's stdio fifos, one directory per task
	"/dev/shm/libpod_lock", "/run/runc", "/tmp/detshare-demo-build.err", "/tmp/detshare-demo.*", "/tmp/dse2e-*",
	"/tmp/dsinst-*", "/tmp/dsdeb-*",
}

// Snapshot is the set of watched paths that existed.
type Snapshot map[string]bool

// Take records the watched paths present now.
func Take() Snapshot {
	s := Snapshot{}
	for _, p := range expand() {
		s[p] = true
	}
	return s
}

func expand() []string {
	var out []string
	for _, w := range Watched {
		if strings.ContainsAny(w, "*?[") {
			m, _ := filepath.Glob(w)
			out = append(out, m...)
			continue
		}
		if _, err := os.Lstat(w); err == nil {
			out = append(out, w)
		}
	}
	return out
}

// New lists watched paths that were not in before, deepest first.
func New(before Snapshot) []string {
	var out []string
	for _, p := range expand() {
		if !before[p] {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		di, dj := strings.Count(out[i], "/"), strings.Count(out[j], "/")
		if di != dj {
			return di > dj
		}
		return out[i] > out[j]
	})
	return out
}

// Clean removes the new paths that nothing uses: unix sockets nobody accepts on, empty directories, ctr fifo
// directories whose fifos nobody holds open, and /dev/shm/libpod_lock when no podman process runs. It returns what it removed.
func Clean(before Snapshot) []string {
	var removed []string
	for _, p := range New(before) {
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		switch {
		case st.Mode()&os.ModeSocket != 0:
			if deadSocket(p) && os.Remove(p) == nil {
				removed = append(removed, p)
			}
		case st.IsDir():
			if filepath.Dir(p) == "/run/containerd/fifo" {
				// ctr's stdio fifos of a task whose shim died (ctr removes them only through a live shim)
				fifos, _ := filepath.Glob(filepath.Join(p, "*"))
				for _, f := range fifos {
					if fs, err := os.Lstat(f); err == nil && fs.Mode()&os.ModeNamedPipe != 0 && !openedByAnyone(f) {
						os.Remove(f)
					}
				}
			}
			if os.Remove(p) == nil { // only when empty
				removed = append(removed, p)
			}
		case p == "/dev/shm/libpod_lock":
			if !podmanRunning() && os.Remove(p) == nil {
				removed = append(removed, p)
			}
		}
	}
	return removed
}

// Left is New after Clean: what the run left behind.
func Left(before Snapshot) []string { return New(before) }

func deadSocket(p string) bool {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: p})
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// openedByAnyone tells whether a process has p open (scans /proc/*/fd).
func openedByAnyone(p string) bool {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == p {
			return true
		}
	}
	return false
}

func podmanRunning() bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.HasPrefix(string(comm), "podman") {
			return true
		}
	}
	return false
}

// LockPath serialises the suites that start engines (containerd, dockerd, podman, kubelet): `go test ./...` runs
// packages in parallel, and one suite's leftover check would otherwise see another suite's live shims and fifos.
// Not the lock developers wrap whole commands in: a test taking that one would wait for its own parent.
const LockPath = "/run/lock/detshare-engine-tests.lock"

// Exclusive blocks until no other engine suite runs on this host and returns the function that lets the next one
// in. The lock is an flock: a suite killed mid-run releases it with its process.
func Exclusive() (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(LockPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// Suite is an engine suite's TestMain frame: it takes the engine-suite lock and a Snapshot, and returns the function
// to call with the tests' exit code once the engines are stopped. That function removes what the engines provably
// left unused, releases the lock and returns the exit code, 1 when something else stayed on the host (unless
// DETSHARE_E2E_KEEP=1 asks to keep everything). extra are further paths (globs) this suite watches.
func Suite(name string, extra ...string) (finish func(code int) int, err error) {
	release, err := Exclusive()
	if err != nil {
		return nil, fmt.Errorf("take the engine-suite lock %s: %w", LockPath, err)
	}
	Watched = append(Watched, extra...)
	before := Take()
	return func(code int) int {
		defer release()
		if os.Getenv("DETSHARE_E2E_KEEP") == "1" {
			return code
		}
		if removed := Clean(before); len(removed) > 0 {
			fmt.Printf("removed what the engines left on the host: %v\n", removed)
		}
		if left := Left(before); len(left) > 0 {
			fmt.Printf("FAIL: the %s left on the host: %v\n", name, left)
			return 1
		}
		return code
	}, nil
}
