package daemon

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
)

// fsUsed is how many bytes of dir's filesystem are in use.
func fsUsed(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// TestPageGrowthIsRefusedByTheKernel is issue 27's page size bound: a tenant writes 64 MiB past the end of its
// client page as fast as it can, on a run directory of its own tmpfs (as /run is on a host). Before, each write
// succeeded and the run directory's filesystem grew by the 64 MiB until the next housekeeping round cut the page back
// (a faster writer filled /run in between). Now the page lives on a tmpfs of its own, the page's size, which the
// scheduler's configuration asks registrars for (tenants.page_mounts): the kernel refuses the write (ENOSPC) with no
// more than the page's last memory page taken, and the run directory does not grow. When the tenant goes
// (deregistered, or a host tenant reaped because its owner died), nothing stays mounted.
func TestPageGrowthIsRefusedByTheKernel(t *testing.T) {
	dir, tb := runDirOnTmpfs(t, "256m")
	c := testConfig()
	c.Tenants.PageMounts = config.PageMountsOn // auto: on for /run/detshare only
	if d := config.Default().Tenants; !d.PageMountsFor(table.DefaultRunDir) || d.PageMountsFor(dir) {
		t.Fatalf("tenants.page_mounts default %q: want on for %s, off for %s", d.PageMounts, table.DefaultRunDir, dir)
	}
	startSched(t, dir, c, nil)
	hostile := register(t, tb, "hostile", table.TierBestEffort, table.RoleNone, 0, false, 0)
	f, err := os.OpenFile(hostile.ClientPagePath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	used := fsUsed(t, dir)
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 0xAB
	}
	var written int64
	var werr error
	for written < 64<<20 {
		n, err := f.WriteAt(chunk, table.ClientPageSize+written)
		written += int64(n)
		if err != nil {
			werr = err
			break
		}
	}
	// ftruncate far past the end: a size, never memory.
	_ = f.Truncate(1 << 30)
	grew := fsUsed(t, dir) - used
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if grew > 1<<20 {
		t.Errorf("the run directory's filesystem grew by %d bytes while the tenant wrote %d bytes past its page's "+
			"end (error %v): not bounded by the kernel", grew, written, werr)
	}
	if !errors.Is(werr, syscall.ENOSPC) || written >= int64(os.Getpagesize()) {
		t.Errorf("writing past the page's end: %d bytes taken, stopped by %v; want ENOSPC within the page's last "+
			"memory page", written, werr)
	}
	if alloc := st.Blocks * 512; alloc > table.ClientPageSize+int64(os.Getpagesize()) {
		t.Errorf("the page holds %d bytes of memory, want at most its size rounded up", alloc)
	}
	if m := testenv.MountsUnder(dir); len(m) != 1 || m[0] != hostile.ClientPagePath {
		t.Errorf("mounts under the run directory %v, want only the page's own", m)
	}
	// The scheduler's housekeeping still cuts the size back (a page read by the host is ClientPageSize).
	deadline := time.Now().Add(3 * time.Second)
	for {
		fi, err := os.Stat(hostile.ClientPagePath)
		if err == nil && fi.Size() == table.ClientPageSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("page not cut back to its size: %v %v", fi.Size(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := tb.Deregister("hostile"); err != nil {
		t.Fatal(err)
	}
	if m := testenv.MountsUnder(dir); len(m) != 0 {
		t.Errorf("after the tenant was deregistered, still mounted: %v", m)
	}
	if _, err := os.Lstat(hostile.ClientPagePath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("page of a deregistered tenant still there: %v", err)
	}

	// A host tenant whose owner dies is reaped by the scheduler: its page mount goes with it.
	owner := exec.Command("sleep", "60")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	host := register(t, tb, "host", table.TierBestEffort, table.RoleNone, 0, false, owner.Process.Pid)
	if m := testenv.MountsUnder(dir); len(m) != 1 || m[0] != host.ClientPagePath {
		t.Fatalf("host tenant's page: mounts %v, want %s", m, host.ClientPagePath)
	}
	_ = owner.Process.Kill()
	_ = owner.Wait()
	deadline = time.Now().Add(5 * time.Second)
	for {
		if _, ok := tb.Lookup("host"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("host tenant whose owner died was not reaped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := testenv.MountsUnder(dir); len(m) != 0 {
		t.Errorf("after the host tenant was reaped, still mounted: %v", m)
	}
}
