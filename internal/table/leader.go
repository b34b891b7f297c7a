package table

import (
	"fmt"
	"sync/atomic"
	"time"
)

// LeaderInfo is the scheduler leader recorded in the header.
type LeaderInfo struct {
	PID         int
	StartTime   uint64 // /proc/<pid>/stat starttime
	HeartbeatNs uint64 // CLOCK_MONOTONIC
	Epoch       uint64 // leader takeovers so far
}

// Leader returns the recorded leader (PID 0 when none).
func (t *Table) Leader() LeaderInfo {
	h := t.Header()
	return LeaderInfo{PID: int(atomic.LoadUint64(&h.SchedPID)), StartTime: atomic.LoadUint64(&h.SchedStartTime),
		HeartbeatNs: atomic.LoadUint64(&h.SchedHeartbeatNs), Epoch: atomic.LoadUint64(&h.SchedEpoch)}
}

// SetLeader records pid as the leader and bumps sched_epoch. The caller must hold sched.lock (Paths.SchedLock);
// the table does not arbitrate leadership, the flock does. A split left half-published by a dead leader is reset
// so that it can be published again.
func (t *Table) SetLeader(pid int) (LeaderInfo, error) {
	if err := t.mustWrite("set leader"); err != nil {
		return LeaderInfo{}, err
	}
	start, err := ProcStartTime(pid)
	if err != nil {
		return LeaderInfo{}, fmt.Errorf("set leader: %w", err)
	}
	// Splits and grants are published only by the leader: a split left half-published belongs to a dead one.
	for i := 0; i < MaxGPUs; i++ {
		atomic.CompareAndSwapUint32(&t.GPU(i).SplitState, SplitPublishing, SplitUnknown)
	}
	h := t.Header()
	atomic.StoreUint64(&h.SchedPID, 0)
	atomic.StoreUint64(&h.SchedStartTime, start)
	atomic.StoreUint64(&h.SchedHeartbeatNs, MonotonicNs())
	atomic.AddUint64(&h.SchedEpoch, 1)
	atomic.StoreUint64(&h.SchedPID, uint64(pid))
	return t.Leader(), nil
}

// Heartbeat refreshes the leader's heartbeat.
func (t *Table) Heartbeat() {
	atomic.StoreUint64(&t.Header().SchedHeartbeatNs, MonotonicNs())
}

// ClearLeader removes pid as leader (at clean shutdown); it does nothing if another process leads.
func (t *Table) ClearLeader(pid int) {
	atomic.CompareAndSwapUint64(&t.Header().SchedPID, uint64(pid), 0)
}

// LeaderAlive tells whether a leader is recorded, its process is alive and its heartbeat is younger than maxAge.
func (t *Table) LeaderAlive(maxAge time.Duration) bool {
	l := t.Leader()
	if l.PID == 0 || !HostProcessAlive(l.PID, l.StartTime) {
		return false
	}
	now := MonotonicNs()
	return now < l.HeartbeatNs || now-l.HeartbeatNs <= uint64(maxAge)
}

// SetPolicy records the scheduler policy id (informational, for viewers).
func (t *Table) SetPolicy(id uint32) { atomic.StoreUint32(&t.Header().Policy, id) }
