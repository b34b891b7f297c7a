package table

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Header.Flags bits of the page mounts (issue 27). HeaderFlagPageMounts: every client page registered from now on
// lives on a tmpfs of its own, the page's size. HeaderFlagPageMountsSet: a scheduler decided (tenants.page_mounts);
// until one has, a registrar applies the default itself (PageMountsByDefault), so a tenant registered in the instant
// between a scheduler's start and its decision is not left without the bound.
const (
	HeaderFlagPageMounts    uint32 = 1 << 0
	HeaderFlagPageMountsSet uint32 = 1 << 1
)

// PageMountsByDefault is tenants.page_mounts = "auto": on for the default run directory (on the host's /run), off
// for any other (a test's, a custom location).
func PageMountsByDefault(runDir string) bool { return filepath.Clean(runDir) == DefaultRunDir }

// pageMountSize is the size of a page's own tmpfs: the page rounded up to whole memory pages. The kernel refuses
// (ENOSPC) every byte a tenant writes past that, and a truncate past it allocates nothing.
var pageMountSize = (ClientPageSize + os.Getpagesize() - 1) / os.Getpagesize() * os.Getpagesize()

// SetPageMounts records whether client pages are created on a tmpfs of their own (HeaderFlagPageMounts). Pages
// already registered keep what they were created on.
func (t *Table) SetPageMounts(on bool) {
	h := t.Header()
	for {
		old := atomic.LoadUint32(&h.Flags)
		nw := old&^HeaderFlagPageMounts | HeaderFlagPageMountsSet
		if on {
			nw |= HeaderFlagPageMounts
		}
		if old == nw || atomic.CompareAndSwapUint32(&h.Flags, old, nw) {
			return
		}
	}
}

// PageMounts tells whether client pages are created on a tmpfs of their own: as a scheduler decided, else by default.
func (t *Table) PageMounts() bool {
	f := atomic.LoadUint32(&t.Header().Flags)
	if f&HeaderFlagPageMountsSet == 0 {
		return PageMountsByDefault(t.paths.Dir)
	}
	return f&HeaderFlagPageMounts != 0
}

// errNoMountPrivilege: this process may not mount (not root, or a user namespace without it).
var errNoMountPrivilege = errors.New("no privilege to mount")

// createMountedPage writes the client page b at path on a tmpfs of its own (pageMountSize bytes, two inodes: its
// root and the page): a tmpfs is mounted on a staging directory beside the page, the page written into it, bound
// over path (an empty file made for it), and the staging mount detached, so one mount per page remains, at path,
// and nothing else. A tenant writing past its page's end, however fast, fills only that tmpfs: no byte of the run
// directory's filesystem or more of the host's memory. The staging directory's name matches the temporaries that
// recoverLocked removes after a registrar that died.
func createMountedPage(path string, mode os.FileMode, b []byte) (err error) {
	stage, err := os.MkdirTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-mnt")
	if err != nil {
		return fmt.Errorf("page mount: staging directory: %w", err)
	}
	defer func() {
		_ = unix.Unmount(stage, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		_ = os.Remove(stage)
	}()
	opts := fmt.Sprintf("size=%d,nr_inodes=2,mode=0700", pageMountSize)
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("page mount: tmpfs on %s: %w: %w", stage, errNoMountPrivilege, err)
		}
		return fmt.Errorf("page mount: tmpfs (%s) on %s: %w", opts, stage, err)
	}
	f, err := os.OpenFile(filepath.Join(stage, "page"), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, mode)
	if err != nil {
		return fmt.Errorf("page mount: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(mode) // the umask must not decide who may write the page
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("page mount: write the page: %w", err)
	}
	unmountPage(path) // a mount left by a registration whose removal failed is never stacked upon
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("page mount: remove the old %s: %w", path, err)
	}
	mp, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, mode)
	if err != nil {
		return fmt.Errorf("page mount: mount point: %w", err)
	}
	mp.Close()
	if err := unix.Mount(filepath.Join(stage, "page"), path, "", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("page mount: bind the page at %s: %w", path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		""); err != nil {
		unmountPage(path)
		_ = os.Remove(path)
		return fmt.Errorf("page mount: remount %s nosuid,nodev,noexec: %w", path, err)
	}
	return nil
}

// unmountPage detaches the page mounts at path, if any (a page created without one has none).
func unmountPage(path string) {
	for i := 0; i < 4; i++ { // a mount stacked by hand under another is detached too, within reason
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err == nil {
			continue
		}
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			logrus.WithError(err).WithField("path", path).Warn("client page mount not detached")
		}
		return
	}
}

// writePage creates reg's client page: on a tmpfs of its own when the table says so (HeaderFlagPageMounts), else
// as a file of the run directory. A registrar that may not mount (not root) falls back to the file, with a
// warning: its page is then bounded only by the scheduler's housekeeping (RepairClientPages).
func (t *Table) writePage(path string, b []byte) error {
	if !t.PageMounts() {
		return atomicfile.Write(path, b, ClientPageMode, false)
	}
	err := createMountedPage(path, ClientPageMode, b)
	if errors.Is(err, errNoMountPrivilege) {
		logrus.WithError(err).WithField("path", path).Warn(
			"client page on the run directory's filesystem: a tenant writing past its end is cut back only at the " +
				"next housekeeping round")
		return atomicfile.Write(path, b, ClientPageMode, false)
	}
	return err
}
