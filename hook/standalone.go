package hook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/hook/specmod"
)

// CreateContainer is the standalone hook (hooks.d, stage createContainer). The runtime runs it in the container's
// mount namespace after its mounts are set up and before pivot_root, so bind mounts made under the rootfs are seen
// by the container alone and vanish with it. A spec already edited by the shim or the wrapper is left alone.
func CreateContainer(ctx context.Context, cfg Config, st State) error {
	spec, err := specmod.Load(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		// Whether it asked for DetShare cannot be told; the runtime reads the same spec and reports the problem.
		logrus.WithError(err).WithField("id", st.ID).Warn("spec unreadable; container left alone")
		return nil
	}
	if _, managed := spec.Annotations()[specmod.TenantIDAnnotation]; managed {
		return nil
	}
	rootfs := rootOf(spec, st)
	// The container's init process owns the registration: if runc fails after this hook (no poststop runs then)
	// or the container dies without a delete, the table's reaper deregisters it once that process is gone.
	p, err := attach(ctx, cfg, container{id: st.ID, spec: spec, ownerPID: containerInitPID()},
		func(t specmod.Tenant) error { return bindAll(rootfs, specmod.TenantMounts(t)) })
	if err != nil || p.FailedOpen == nil {
		return err
	}
	noticeToInit(p.FailedOpen)
	return nil
}

// RootFS is the host path of the root filesystem of the container whose state a hook got (its spec's root.path,
// relative to the bundle unless absolute).
func RootFS(st State) (string, error) {
	spec, err := specmod.Load(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return "", err
	}
	return rootOf(spec, st), nil
}

func rootOf(spec *specmod.Spec, st State) string {
	rootfs := spec.RootPath()
	if !filepath.IsAbs(rootfs) {
		rootfs = filepath.Join(st.Bundle, rootfs)
	}
	return rootfs
}

// bindAll is the standalone applier: it bind-mounts every mount under rootfs, or none (undoing what it did).
func bindAll(rootfs string, mounts []specmod.Mount) error {
	root, err := os.OpenFile(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("container rootfs: %w", err)
	}
	defer root.Close()
	var undo []func()
	for _, m := range mounts {
		u, err := bindInto(root, m)
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			return err
		}
		undo = append(undo, u)
	}
	return nil
}

// noticeToInit writes Notice on the container's stderr under fail-open: that is the stderr of the container's init
// process, this hook's parent.
func noticeToInit(err error) {
	if pid := containerInitPID(); pid > 0 {
		if f, ferr := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", pid), os.O_WRONLY|os.O_APPEND, 0); ferr == nil {
			_, _ = f.WriteString(Notice(err))
			f.Close()
		}
	}
}

// containerInitPID returns the host PID of the process that runs this hook — the runtime's container init, which
// becomes the container's first process — or 0 when it cannot be told. The runtime runs createContainer hooks before
// pivot_root, where /proc is still the host's procfs, so /proc/self/stat names host PIDs; the init must share this
// hook's mount namespace, which guards against a procfs of another PID namespace.
func containerInitPID() int {
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil || ppid <= 1 {
		return 0
	}
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", ppid))
	if err1 != nil || err2 != nil || self != parent {
		return 0
	}
	return ppid
}

// bindInto bind-mounts m.Source at m.Destination under the rootfs root, creating the target (a file for a file, a
// directory for a directory), makes it read-only unless the options say rw, and returns how to undo it.
//
// The rootfs belongs to the container (and to any container sharing it): it can hold symlinks, FIFOs or devices
// anywhere and swap them while the hook works. So no path under it is used twice. The target's directory is
// resolved and created inside the root (pathrs: openat2 RESOLVE_IN_ROOT, or a checked O_PATH walk where openat2 is
// missing) into a descriptor; the target itself is created and opened relative to that descriptor with
// O_NOFOLLOW, and with O_PATH, which neither waits for a FIFO's writer nor calls a device's driver; its type is
// checked on the descriptor; and the bind, the read-only remount and the undo go through /proc/self/fd. A swap
// after the lookup changes nothing: the descriptors keep naming what was checked, inside the rootfs.
func bindInto(root *os.File, m specmod.Mount) (func(), error) {
	// The source is DetShare's own host file; a symlink there (a versioned library) is followed.
	src, srcType, err := openPath(unix.AT_FDCWD, m.Source, true)
	if err != nil {
		return nil, fmt.Errorf("mount source: %w", err)
	}
	defer unix.Close(src)
	if srcType != unix.S_IFREG && srcType != unix.S_IFDIR {
		return nil, fmt.Errorf("mount source %s is a %s: only regular files and directories are bound", m.Source,
			fileKind(srcType))
	}
	dest := filepath.Clean("/" + m.Destination)
	name := filepath.Base(dest)
	if dest == "/" {
		return nil, fmt.Errorf("mount destination %q: the container's root cannot be a DetShare mount point", m.Destination)
	}
	parent, err := pathrs.MkdirAllHandle(root, filepath.Dir(dest), 0o755)
	if err != nil {
		return nil, fmt.Errorf("mount point %s in the container: directory: %w", m.Destination, err)
	}
	defer parent.Close()
	if testAfterResolve != nil {
		testAfterResolve(m.Destination)
	}
	pfd := int(parent.Fd())
	dst, dstType, err := openPath(pfd, name, false)
	if errors.Is(err, unix.ENOENT) {
		if err = createMountPoint(pfd, name, srcType == unix.S_IFDIR); err == nil {
			dst, dstType, err = openPath(pfd, name, false)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mount point %s in the container: %w", m.Destination, err)
	}
	defer unix.Close(dst)
	if dstType != srcType {
		return nil, fmt.Errorf("mount point %s in the container is a %s, want a %s: refusing to mount over it",
			m.Destination, fileKind(dstType), fileKind(srcType))
	}
	if err := unix.Mount(procFD(src), procFD(dst), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return nil, fmt.Errorf("bind %s at %s in the container: %w", m.Source, m.Destination, err)
	}
	// dst still names the covered file; the new mount is what the name leads to now, looked up again in the
	// same directory and checked to be a bind of the source (same device and inode).
	mnt, _, err := openPath(pfd, name, false)
	if err == nil && !sameFile(mnt, src) {
		unix.Close(mnt)
		err = fmt.Errorf("%s changed under the hook", m.Destination)
	}
	if err != nil {
		unix.Unmount(procFD(dst), unix.MNT_DETACH)
		return nil, fmt.Errorf("mount point %s in the container after the bind: %w", m.Destination, err)
	}
	undo := func() {
		unix.Unmount(procFD(mnt), unix.MNT_DETACH)
		unix.Close(mnt)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
	ro := true
	for _, o := range m.Options {
		if o == "rw" {
			ro = false
		}
	}
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", procFD(mnt), "", flags, ""); err != nil {
		undo()
		return nil, fmt.Errorf("remount %s in the container: %w", m.Destination, err)
	}
	return undo, nil
}

// createMountPoint creates a missing mount point name in directory dir: a directory, or an empty file.
// O_EXCL|O_NOFOLLOW: the file is new or the call fails; whatever appeared there meanwhile is never opened, and the
// caller's O_PATH open checks what is there.
func createMountPoint(dir int, name string, isDir bool) error {
	if isDir {
		if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %s: %w", name, err)
		}
		return nil
	}
	fd, err := unix.Openat(dir, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		return fmt.Errorf("create %s: %w", name, err)
	}
	return unix.Close(fd)
}

func sameFile(a, b int) bool {
	var sa, sb unix.Stat_t
	return unix.Fstat(a, &sa) == nil && unix.Fstat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// openPath opens p (relative to dir) with O_PATH (no I/O, so no FIFO or device semantics) and returns the fd and
// its file type.
func openPath(dir int, p string, follow bool) (int, uint32, error) {
	flags := unix.O_PATH | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Openat(dir, p, flags, 0)
	if err != nil {
		return -1, 0, &os.PathError{Op: "open", Path: p, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	return fd, st.Mode & unix.S_IFMT, nil
}

// testAfterResolve, set by tests only, runs between the resolution of a mount's destination and its use: the moment
// a container that shares the rootfs could swap a directory for a symlink.
var testAfterResolve func(dest string)

func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func fileKind(t uint32) string {
	switch t {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symlink"
	}
	return fmt.Sprintf("file of type %#o", t)
}
