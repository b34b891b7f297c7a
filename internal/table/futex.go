package table

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Futex operations on shared words. The words live in MAP_SHARED file mappings used by several processes, so the
// non-private futex ops are used.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// FutexWait blocks while *addr == val, at most timeout (which must be > 0: waits are never unbounded). It returns
// true when woken or when the word already differs, false on timeout. Spurious wake-ups return true; callers
// re-check their condition.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) (bool, error) {
	if timeout <= 0 {
		return false, fmt.Errorf("futex wait: timeout %v must be > 0", timeout)
	}
	if atomic.LoadUint32(addr) != val {
		return true, nil
	}
	ts := unix.NsecToTimespec(int64(timeout))
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	switch e {
	case 0, unix.EAGAIN, unix.EINTR:
		return true, nil
	case unix.ETIMEDOUT:
		return false, nil
	default:
		return false, fmt.Errorf("futex wait: %w", e)
	}
}

// FutexWake wakes up to n waiters on addr and returns how many were woken.
func FutexWake(addr *uint32, n int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("futex wake: %w", e)
	}
	return int(r), nil
}

const wakeAll = int(^uint32(0) >> 1)

// waitChange blocks until *addr != seen or timeout passes, riding out spurious wake-ups (EINTR from the Go
// runtime's preemption signals, wakes meant for other values). It returns whether the word changed.
func waitChange(addr *uint32, seen uint32, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		if atomic.LoadUint32(addr) != seen {
			return true, nil
		}
		rem := time.Until(deadline)
		if rem <= 0 {
			return false, nil
		}
		if _, err := FutexWait(addr, seen, rem); err != nil {
			return false, err
		}
	}
}

// RingDoorbell tells the scheduler that some demand changed: it bumps doorbell.seq and wakes its waiters. A
// table mapped without a doorbell does nothing.
func (t *Table) RingDoorbell() {
	if d := t.Doorbell(); d != nil {
		RingDoorbell(d)
	}
}

// RingDoorbell bumps d.seq and wakes every waiter. A doorbell truncated by a tenant is not rung (Guard).
func RingDoorbell(d *Doorbell) {
	// Everything touching d stays inside Guard: even taking &d.Seq probes d (the compiler's nil check reads it).
	_ = Guard("ring doorbell", func() {
		atomic.AddUint32(&d.Seq, 1)
		_, _ = FutexWake(&d.Seq, wakeAll)
	})
}

// DoorbellSeq returns the current doorbell sequence (0 when there is no doorbell or it was truncated).
func (t *Table) DoorbellSeq() uint32 {
	var seq uint32
	if d := t.Doorbell(); d != nil {
		_ = Guard("read doorbell", func() { seq = atomic.LoadUint32(&d.Seq) })
	}
	return seq
}

// WaitDoorbell waits (scheduler side) until the doorbell sequence differs from seen or timeout passes, and returns
// the new sequence and whether it changed.
func (t *Table) WaitDoorbell(seen uint32, timeout time.Duration) (uint32, bool, error) {
	d := t.Doorbell()
	if d == nil {
		time.Sleep(timeout)
		return seen, false, nil
	}
	var changed bool
	var err error
	if gerr := Guard("wait on doorbell", func() { changed, err = waitChange(&d.Seq, seen, timeout) }); gerr != nil ||
		errors.Is(err, unix.EFAULT) {
		// A tenant truncated the doorbell (the read faulted, or the kernel could not reach the word): give it its
		// size back and sleep out this wait; the caller's timeout-driven pass still runs (fail-static).
		if _, rerr := t.RepairDoorbell(); rerr != nil {
			logrus.WithError(rerr).Warn("doorbell damaged and not repaired; waiting by timeout")
		} else {
			logrus.WithField("path", t.paths.Doorbell()).Warn("doorbell was truncated by a tenant; repaired")
		}
		time.Sleep(timeout)
		return seen, false, nil
	}
	return t.DoorbellSeq(), changed, err
}
