package table

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"unsafe"
)

// ErrFault is returned (wrapped) by Guard when the function touched a mapping whose file was shrunk under it: a
// tenant can truncate the files it may write (its client page, the doorbell), and reading such a mapping raises
// SIGBUS. Guard turns that into this error so that no host component dies of it (docs/threat-model.md).
var ErrFault = errors.New("mapped file was truncated under its reader")

// Guard runs f, which reads or writes mappings of files a tenant can resize, and returns ErrFault (wrapped, naming
// what) instead of crashing when f faults on one of them. f must not start goroutines: the runtime turns faults
// into panics only on the goroutine that asked for it (debug.SetPanicOnFault).
func Guard(what string, f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if re, ok := r.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("%s: %w (fault at %#x)", what, ErrFault, re.Addr())
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}

// RepairDoorbell gives the doorbell back its size and magic after a tenant truncated or scribbled over it, so that
// waits and rings work again (the scheduler's mapping and every tenant's that is still mapped see the same pages
// again). It reports whether anything had to be repaired. Only the host (root) can do this; tenants cannot undo a
// repair except by truncating again, which costs them nothing but their own wake-ups.
func (t *Table) RepairDoorbell() (bool, error) {
	if t.bell == nil || t.readOnly {
		return false, nil
	}
	path := t.paths.Doorbell()
	st, err := os.Stat(path)
	if err != nil {
		return false, fmt.Errorf("repair doorbell: %w", err)
	}
	repaired := false
	if st.Size() != DoorbellSize {
		if err := os.Truncate(path, DoorbellSize); err != nil {
			return false, fmt.Errorf("repair doorbell %s (%d bytes): %w", path, st.Size(), err)
		}
		repaired = true
	}
	err = Guard("repair doorbell", func() {
		d := (*Doorbell)(unsafe.Pointer(&t.bell[0]))
		if atomic.LoadUint64(&d.Magic) != DoorbellMagic {
			atomic.StoreUint64(&d.Magic, DoorbellMagic)
			repaired = true
		}
	})
	return repaired, err
}
