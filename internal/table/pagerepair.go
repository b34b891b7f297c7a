package table

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/sirupsen/logrus"
)

// clientPageHeaderSize is the part of a client page that says whose it is: magic, ABI version, slot, generation,
// process-entry count and ID. The tenant can write all of it; only registration (and RepairClientPages) decide it.
const clientPageHeaderSize = int(unsafe.Offsetof(ClientPage{}.MemUsed))

// clientPageHeader is the header registration writes for reg (createClientPage) and RepairClientPages restores.
func clientPageHeader(reg Registration) []byte {
	b := make([]byte, clientPageHeaderSize)
	var cp ClientPage
	cp.Magic, cp.ABIVersion, cp.Slot, cp.SlotGen, cp.MaxProcs = ClientMagic, ABIVersion, uint32(reg.Slot), reg.Gen,
		MaxProcs
	putCString(cp.ID[:], reg.ID)
	copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&cp)), clientPageHeaderSize))
	return b
}

// PageRepair says what RepairClientPages put right in one tenant's client page.
type PageRepair struct {
	ID     string
	Size   int64 // the size found, when it was not ClientPageSize (grown past its end or truncated); else 0
	Mode   bool  // its mode had been changed
	Header bool  // its magic, ABI version, slot, generation, entry count or ID had been overwritten
}

func (r PageRepair) any() bool { return r.Size != 0 || r.Mode || r.Header }

// RepairClientPages checks every active tenant's client page against the table's own copy of its identity and puts
// back what a tenant damaged (issue 27): a page written past its end is cut back to ClientPageSize (a tenant could
// otherwise fill the run directory's filesystem with it), a truncated one is given its size again, its mode is
// restored, and an overwritten header (magic, ABI version, slot, generation, entry count, ID) is rewritten from the
// table. libdetshare refuses the CUDA work of a process that starts while its page is damaged (fail-closed), so a
// tenant that damages its page only stops its own new processes until the next housekeeping round.
//
// The check works on the files (open, fstat, one 152-byte read), so it never faults and costs little per round. A
// repair is made under the registration lock, after the slot was checked to still hold the same registration, so a
// page is never given the identity of the tenant that held its slot before.
func (t *Table) RepairClientPages() ([]PageRepair, error) {
	if t.readOnly {
		return nil, nil
	}
	var need []Registration
	for _, reg := range t.List() {
		r, err := checkClientPage(reg, false)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				logrus.WithError(err).WithField("id", reg.ID).Warn("client page cannot be checked")
			}
			continue
		}
		if r.any() {
			need = append(need, reg)
		}
	}
	if len(need) == 0 {
		return nil, nil
	}
	unlock, err := lockFile(t.paths.Lock())
	if err != nil {
		return nil, fmt.Errorf("repair client pages: %w", err)
	}
	defer unlock()
	var out []PageRepair
	var errs []error
	for _, reg := range need {
		c := t.Container(reg.Slot)
		if atomic.LoadUint32(&c.State) != SlotActive || atomic.LoadUint32(&c.Gen) != reg.Gen ||
			cString(c.ID[:]) != reg.ID {
			continue // deregistered meanwhile: its page is gone or another tenant's
		}
		r, err := checkClientPage(reg, true)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.any() {
			out = append(out, r)
		}
	}
	return out, errors.Join(errs...)
}

// checkClientPage compares reg's page file with what it must be, and with fix puts it right.
func checkClientPage(reg Registration, fix bool) (PageRepair, error) {
	r := PageRepair{ID: reg.ID}
	flags := os.O_RDONLY
	if fix {
		flags = os.O_RDWR
	}
	f, err := os.OpenFile(reg.ClientPagePath, flags|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return r, fmt.Errorf("client page of %s: %w", reg.ID, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return r, fmt.Errorf("client page of %s: %w", reg.ID, err)
	}
	if !st.Mode().IsRegular() {
		return r, fmt.Errorf("client page of %s: %s is not a regular file (%s)", reg.ID, reg.ClientPagePath, st.Mode())
	}
	if st.Size() != ClientPageSize {
		r.Size = st.Size()
		if st.Size() == 0 {
			r.Size = -1 // found empty: still a repair (Size 0 means "right size")
		}
		if fix {
			if err := f.Truncate(ClientPageSize); err != nil {
				return r, fmt.Errorf("client page of %s: cut %d bytes back to %d: %w", reg.ID, st.Size(),
					ClientPageSize, err)
			}
		}
	}
	if st.Mode().Perm() != ClientPageMode {
		r.Mode = true
		if fix {
			if err := f.Chmod(ClientPageMode); err != nil {
				return r, fmt.Errorf("client page of %s: mode %s: %w", reg.ID, st.Mode().Perm(), err)
			}
		}
	}
	want := clientPageHeader(reg)
	got := make([]byte, len(want))
	if n, _ := f.ReadAt(got, 0); n != len(got) || !bytes.Equal(got, want) {
		r.Header = true
		if fix {
			if _, err := f.WriteAt(want, 0); err != nil {
				return r, fmt.Errorf("client page of %s: rewrite its header: %w", reg.ID, err)
			}
		}
	}
	return r, nil
}
