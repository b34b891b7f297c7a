package daemon

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/detshare/detshare/sched/table"
)

// ErrNotLeader is returned by Run when another scheduler holds the host lock.
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

// Close releases the leadership; grants, tokens and MPS daemons stay (fail-static).
func (s *Scheduler) Close() error {
	_ = table.Guard("clear leader", func() { s.t.ClearLeader(os.Getpid()) }) // the table may have been truncated
	for _, p := range s.pages {
		p.cl.Close()
	}
	s.pages = map[int]*page{}
	err := s.t.Close()
	s.lock.Close()
	return err
}

// guardedPass runs Pass, and steps down (an error, never a SIGBUS) when the table was truncated under the mapping:
// only root on the host can do that, and nothing can be scheduled through it any more. Tenants keep their last
// grant (libdetshare survives the truncation, docs/threat-model.md).
func (s *Scheduler) guardedPass() error {
	if err := table.Guard("scheduler pass", s.Pass); err != nil {
		s.tableLost(err)
	}
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	return s.lost
}

func (s *Scheduler) tableLost(err error) {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	if s.lost == nil {
		s.lost = fmt.Errorf("scheduler: table %s was truncated (%w); stepping down", s.t.Paths().Table(), err)
	}
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}
