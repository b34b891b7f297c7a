package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// TestPageWrittenPastItsEndCannotFillTheRunDirectory is issue 27's "writing past the end of the client page fills
// the run directory's filesystem": on a run directory of its own small tmpfs (as /run is on a real host), a tenant
// writes past the end of its page until the filesystem is full, and its identity too. Before the fix every new
// tenant was refused until that container exited, and the page stayed damaged. Now the scheduler's housekeeping cuts
// the page back to its size (the memory is given back to the host), rewrites its header from the table, and a new
// tenant is admitted.
func TestPageWrittenPastItsEndCannotFillTheRunDirectory(t *testing.T) {
	dir, tb := runDirOnTmpfs(t, "8m")
	hostile := register(t, tb, "hostile", table.TierBestEffort, table.RoleNone, 0, false, 0)
	f, err := os.OpenFile(hostile.ClientPagePath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 0xAB
	}
	var werr error
	for off := int64(table.ClientPageSize); werr == nil; off += int64(len(chunk)) {
		_, werr = f.WriteAt(chunk, off)
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing past the end stopped with %v, want ENOSPC (a full filesystem)", werr)
	}
	if _, err := f.WriteAt([]byte("garbage!"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Register(table.RegisterRequest{ID: "before", Tier: table.TierBestEffort, GPU: 0, Weight: 1}); err == nil {
		t.Fatal("the filesystem was full but a tenant registered: the attack did not take")
	}

	startSched(t, dir, testConfig(), nil) // housekeeping every 50 ms
	// one repair cuts the page back and then rewrites its header: wait for both (checking the header as soon as the
	// size is right raced the rewrite in CI)
	deadline := time.Now().Add(3 * time.Second)
	var cl *table.Client
	for {
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		blocks := st.Sys().(*syscall.Stat_t).Blocks * 512
		cut := st.Size() == table.ClientPageSize && blocks <= 2*table.ClientPageSize
		var herr error
		if cut {
			if cl, herr = table.OpenClientPageReadOnly(hostile.ClientPagePath); herr == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			if !cut {
				t.Fatalf("page not cut back: size %d, %d bytes allocated", st.Size(), blocks)
			}
			t.Fatalf("the page's header was not rewritten: %v", herr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pg := cl.Page()
	if pg.Slot != uint32(hostile.Slot) || pg.SlotGen != hostile.Gen {
		t.Errorf("repaired page names slot %d generation %d, want %d %d", pg.Slot, pg.SlotGen, hostile.Slot, hostile.Gen)
	}
	cl.Close()
	if _, err := tb.Register(table.RegisterRequest{ID: "newcomer", Tier: table.TierBestEffort, GPU: 0, Weight: 1}); err != nil {
		t.Fatalf("a new tenant is still refused after the repair: %v", err)
	}
}

// runDirOnTmpfs makes a run directory on a tmpfs of its own of the given size (as /run is on a host), with a table
// recording the simulated GPU. Needs root (skipped otherwise).
func runDirOnTmpfs(t *testing.T, size string) (string, *table.Table) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs of its own")
	}
	base := t.TempDir()
	if err := syscall.Mount("tmpfs", base, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs of %s: %v", size, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(base, syscall.MNT_DETACH) })
	dir := filepath.Join(base, "run")
	tb, err := table.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	if err := tb.SetGPUs([]table.GPUInfo{simGPU}); err != nil {
		t.Fatal(err)
	}
	return dir, tb
}
