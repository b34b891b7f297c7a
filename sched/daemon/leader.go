package daemon

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
)

// ErrNotLeader is returned by New (and Acquire) when another scheduler holds the host lock.
var ErrNotLeader = errors.New("another scheduler is the leader on this host")

// Acquire takes the leader lock of runDir without blocking.
func Acquire(runDir string) (*os.File, error) {
	p := table.NewPaths(runDir)
	if err := os.MkdirAll(runDir, table.RunDirMode); err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	f, err := os.OpenFile(p.SchedLock(), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p.SchedLock(), err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrNotLeader
		}
		return nil, fmt.Errorf("flock %s: %w", p.SchedLock(), err)
	}
	return f, nil
}

// leadership is this process's claim on the host: the flock on sched.lock and the table file it leads. The claim
// ends when that file is removed, replaced or truncated: nothing can be scheduled through it any more, so the
// scheduler steps down rather than publish into a file no tenant reads (or fault on one that shrank).
type leadership struct {
	lock  *os.File
	table string // path of the table file
	ino   uint64 // its inode when opened; another one means the file was replaced
	// mu: the loop and the MPS watcher may both find the table lost.
	mu   sync.Mutex
	lost error
}

// takeLead locks opts.RunDir, opens (or creates) its table, finishes what a dead leader left half-done and records
// the GPUs discovered. On error nothing stays locked or mapped.
func takeLead(opts Options) (*table.Table, *leadership, error) {
	lock, err := Acquire(opts.RunDir)
	if err != nil {
		return nil, nil, err
	}
	t, err := table.Create(opts.RunDir)
	if err != nil {
		lock.Close()
		return nil, nil, fmt.Errorf("scheduler: %w", err)
	}
	l := &leadership{lock: lock, table: t.Paths().Table(), ino: inode(t.Paths().Table())}
	if _, err := t.Recover(); err != nil {
		_ = l.release(t)
		return nil, nil, fmt.Errorf("scheduler: %w", err)
	}
	if opts.Discover != nil {
		infos, err := opts.Discover()
		switch {
		case err != nil && len(t.GPUs()) == 0:
			logrus.WithError(err).Warn("no GPUs discovered; tenants run fail-static until a GPU is found")
		case err != nil:
			logrus.WithError(err).Warn("GPU discovery failed; keeping the GPUs recorded in the table")
		default:
			if err := t.SetGPUs(infos); err != nil {
				_ = l.release(t)
				return nil, nil, fmt.Errorf("scheduler: %w", err)
			}
		}
	}
	return t, l, nil
}

// release unmaps the table and lets another scheduler lead.
func (l *leadership) release(t *table.Table) error {
	err := t.Close()
	l.lock.Close()
	return err
}

// Close releases the leadership; grants, tokens and MPS daemons stay (fail-static).
func (s *Scheduler) Close() error {
	s.restoreComputeModes()
	_ = table.Guard("clear leader", func() { s.t.ClearLeader(os.Getpid()) }) // the table may have been truncated
	s.loop.closePages()
	return s.lead.release(s.t)
}

// guardedPass runs Pass, and steps down (an error, never a SIGBUS) when the table was truncated under the mapping:
// only root on the host can do that, and nothing can be scheduled through it any more. Tenants keep their last
// grant (libdetshare survives the truncation, docs/threat-model.md).
func (s *Scheduler) guardedPass() error {
	if err := table.Guard("scheduler pass", s.Pass); err != nil {
		s.lead.truncated(err)
	}
	return s.lead.err()
}

// truncated records that the table shrank under the mapping; the first cause found is the one reported.
func (l *leadership) truncated(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.lost = fmt.Errorf("scheduler: table %s was truncated (%w); stepping down", l.table, err)
	}
}

// stillOurs tells whether the table file is the one this leader opened. A run directory that was removed (tests,
// uninstall) or a table replaced by an operator is no longer ours: the scheduler steps down.
func (l *leadership) stillOurs() bool {
	if ino := inode(l.table); ino != 0 && ino == l.ino {
		return true
	}
	l.mu.Lock()
	l.lost = fmt.Errorf("scheduler: table %s was removed or replaced; stepping down", l.table)
	l.mu.Unlock()
	return false
}

// err is why the scheduler must step down; nil while it leads.
func (l *leadership) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}
