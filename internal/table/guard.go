package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"syscall"
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

// RepairDoorbell gives the doorbell back its size, mode and magic after a tenant truncated, chmodded or scribbled
// over it, so that waits and rings work again (the scheduler's mapping and every tenant's that is still mapped see
// the same pages again). It reports whether anything had to be repaired. It works on the file, not the mapping, so
// it never faults and is cheap enough for every housekeeping round: an open, an fstat and an 8-byte read when
// nothing is wrong. Only the host (root) can do this; tenants cannot undo a repair except by damaging it again,
// which costs them nothing but their own wake-ups.
func (t *Table) RepairDoorbell() (bool, error) {
	if t.readOnly {
		return false, nil
	}
	return repairDoorbellFile(t.paths.Doorbell())
}

// repairDoorbellFile puts an existing doorbell file right in place (a new file would not be the one every tenant
// and the scheduler have mapped). A doorbell whose magic is wrong has its sequence reset too: nothing it held can be
// trusted, and a changed sequence only wakes waiters once.
func repairDoorbellFile(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Errorf("repair doorbell: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("repair doorbell: %w", err)
	}
	if !st.Mode().IsRegular() {
		return false, fmt.Errorf("repair doorbell %s: not a regular file (%s)", path, st.Mode())
	}
	repaired := false
	if st.Size() != DoorbellSize {
		if err := f.Truncate(DoorbellSize); err != nil {
			return false, fmt.Errorf("repair doorbell %s (%d bytes): %w", path, st.Size(), err)
		}
		repaired = true
	}
	if st.Mode().Perm() != DoorbellMode {
		if err := f.Chmod(DoorbellMode); err != nil {
			return false, fmt.Errorf("repair doorbell %s (mode %s): %w", path, st.Mode().Perm(), err)
		}
		repaired = true
	}
	var magic [8]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil {
		return false, fmt.Errorf("repair doorbell %s: read magic: %w", path, err)
	}
	if binary.NativeEndian.Uint64(magic[:]) != DoorbellMagic {
		if _, err := f.WriteAt(initialDoorbell()[:16], 0); err != nil {
			return false, fmt.Errorf("repair doorbell %s: write magic: %w", path, err)
		}
		repaired = true
	}
	return repaired, nil
}
