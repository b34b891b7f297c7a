package table

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// A full table with one slot freed in the middle: the next registration takes exactly that slot (a new generation)
// and the one after is refused as full; every slot freed again is reused before the table is full (issue 28:
// slot allocation must never refuse while a slot is free nor leak a freed slot).
func TestFreedSlotsAreReused(t *testing.T) {
	tb := newTable(t)
	for i := 0; i < MaxContainers; i++ {
		if _, err := tb.Register(RegisterRequest{ID: fmt.Sprintf("t%d", i), Weight: 1}); err != nil {
			t.Fatalf("register %d of %d: %v", i+1, MaxContainers, err)
		}
	}
	for _, victim := range []int{0, 100, MaxContainers - 1} {
		before, ok := tb.Lookup(fmt.Sprintf("t%d", victim))
		if !ok {
			t.Fatalf("t%d not registered", victim)
		}
		if err := tb.Deregister(before.ID); err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("new%d", victim)
		reg, err := tb.Register(RegisterRequest{ID: id, Weight: 1})
		if err != nil {
			t.Fatalf("slot %d is free but registering %s was refused: %v", before.Slot, id, err)
		}
		if reg.Slot != before.Slot || reg.Gen == before.Gen {
			t.Fatalf("%s got slot %d generation %d; want the freed slot %d with a generation after %d", id, reg.Slot,
				reg.Gen, before.Slot, before.Gen)
		}
		if _, err := tb.Register(RegisterRequest{ID: "one-more", Weight: 1}); !errors.Is(err, ErrFull) {
			t.Fatalf("table full again, yet registration gave %v", err)
		}
	}
	// Free several, register as many: all are taken back, no more.
	freed := map[int]bool{}
	for _, i := range []int{3, 7, 50, 51, 200} {
		r, ok := tb.Lookup(fmt.Sprintf("t%d", i))
		if !ok {
			t.Fatalf("t%d not registered", i)
		}
		freed[r.Slot] = true
		if err := tb.Deregister(r.ID); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := 0, len(freed); i < n; i++ {
		reg, err := tb.Register(RegisterRequest{ID: fmt.Sprintf("refill%d", i), Weight: 1})
		if err != nil {
			t.Fatalf("refill %d with %d slots freed: %v", i, len(freed), err)
		}
		if !freed[reg.Slot] {
			t.Fatalf("refill %d got slot %d, which was not free", i, reg.Slot)
		}
		delete(freed, reg.Slot)
	}
	if l := tb.List(); len(l) != MaxContainers {
		seen := map[int]bool{}
		for _, r := range l {
			seen[r.Slot] = true
		}
		for s := 0; s < MaxContainers; s++ {
			if !seen[s] {
				c := tb.Container(s)
				t.Logf("slot %d: state %d id %q", s, c.State, cString(c.ID[:]))
			}
		}
		t.Fatalf("%d active, want %d", len(l), MaxContainers)
	}
}

// Registrations and deregistrations from many registrars at once (each with its own handle, as separate processes
// have) never give one slot to two tenants: each registrar checks its slot still holds its own ID, generation
// unchanged, until it deregisters, and at the end the table is empty with every slot reusable.
func TestConcurrentRegistrationsGetDistinctSlots(t *testing.T) {
	tb := newTable(t)
	dir := tb.Paths().Dir
	const registrars, rounds, held = 8, 20, 24 // 8 × 24 = 192 held at the peak, below the 256 slots
	var wg sync.WaitGroup
	errs := make(chan error, registrars)
	for w := 0; w < registrars; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			h, err := Open(dir)
			if err != nil {
				errs <- err
				return
			}
			defer h.Close()
			for r := 0; r < rounds; r++ {
				var mine []Registration
				for k := 0; k < held; k++ {
					reg, err := h.Register(RegisterRequest{ID: fmt.Sprintf("w%d-r%d-%d", w, r, k), Weight: 1})
					if err != nil {
						errs <- fmt.Errorf("registrar %d round %d: %w", w, r, err)
						return
					}
					mine = append(mine, reg)
				}
				for _, reg := range mine {
					c := h.Container(reg.Slot)
					if got := cString(c.ID[:]); got != reg.ID || c.Gen != reg.Gen {
						errs <- fmt.Errorf("slot %d given to %s (generation %d) now holds %q (generation %d): two registrations got one slot",
							reg.Slot, reg.ID, reg.Gen, got, c.Gen)
						return
					}
					if err := h.Deregister(reg.ID); err != nil {
						errs <- err
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if l := tb.List(); len(l) != 0 {
		t.Fatalf("%d registrations left", len(l))
	}
	for i := 0; i < MaxContainers; i++ {
		if _, err := tb.Register(RegisterRequest{ID: fmt.Sprintf("after%d", i), Weight: 1}); err != nil {
			t.Fatalf("registration %d of %d after the churn: %v", i+1, MaxContainers, err)
		}
	}
}

// ReadClientPage copies what a mapped page shows, and refuses a truncated, foreign or linked page with an error
// (never a fault): placement reads every neighbour's page this way.
func TestReadClientPage(t *testing.T) {
	tb := newTable(t)
	reg, err := tb.Register(RegisterRequest{ID: "reader", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint64(&cl.Page().MemUsed, 12345)
	atomic.StoreUint64(&cl.Page().BusyNs, 678)
	cl.Close()
	var pg ClientPage
	if err := ReadClientPage(reg.ClientPagePath, &pg); err != nil {
		t.Fatal(err)
	}
	if pg.Slot != uint32(reg.Slot) || pg.SlotGen != reg.Gen || pg.MemUsed != 12345 || pg.BusyNs != 678 {
		t.Fatalf("read slot %d gen %d mem %d busy %d; want %d %d 12345 678", pg.Slot, pg.SlotGen, pg.MemUsed, pg.BusyNs,
			reg.Slot, reg.Gen)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(reg.ClientPagePath, link); err != nil {
		t.Fatal(err)
	}
	if err := ReadClientPage(link, &pg); err == nil {
		t.Error("a symbolic link was followed")
	}
	if err := os.Truncate(reg.ClientPagePath, 100); err != nil {
		t.Fatal(err)
	}
	if err := ReadClientPage(reg.ClientPagePath, &pg); !errors.Is(err, ErrCorrupt) {
		t.Errorf("truncated page: %v, want ErrCorrupt", err)
	}
	if err := os.WriteFile(reg.ClientPagePath, make([]byte, ClientPageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ReadClientPage(reg.ClientPagePath, &pg); !errors.Is(err, ErrCorrupt) {
		t.Errorf("page without its magic: %v, want ErrCorrupt", err)
	}
}
