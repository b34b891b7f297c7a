package hook

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/table"
)

// inPrivateMountNS runs fn on a thread of its own in a new private mount namespace, as the runtime runs the
// standalone hook in the container's: whatever the hook mounts stays out of the host's namespace. The thread is
// never unlocked, so it dies with its namespace.
func inPrivateMountNS(t *testing.T, fn func() error) <-chan error {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the standalone hook bind-mounts into the rootfs")
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			done <- err
			return
		}
		if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return done
}

// createInNS runs the standalone hook for container c1 of bundle b in a private mount namespace, then inside (when
// set) in that namespace, and fails the test if they take more than 10 s.
func createInNS(t *testing.T, cfg Config, b string, inside func()) error {
	t.Helper()
	done := inPrivateMountNS(t, func() error {
		err := CreateContainer(context.Background(), cfg, State{ID: "c1", Bundle: b})
		if inside != nil {
			inside()
		}
		return err
	})
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("CreateContainer blocked")
		return nil
	}
}

// mountsUnder counts the mounts of the calling thread's namespace at or below dir.
func mountsUnder(dir string) int {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && strings.HasPrefix(fs[4], dir) {
			n++
		}
	}
	return n
}

// TestCreateContainerRefusesSpecialFilesAtTargets: a FIFO (or a device or socket) that a container image puts
// where a DetShare mount goes is refused at once with an error naming the path and its type; opening it blocked
// the hook forever while it held a table slot. Nothing is left registered or mounted.
func TestCreateContainerRefusesSpecialFilesAtTargets(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	for name, c := range map[string]struct {
		target string
		make   func(string) error
		kind   string
	}{
		"fifo at ld.so.preload": {table.ContainerLdPreloadPath, func(p string) error { return unix.Mkfifo(p, 0o644) }, "FIFO"},
		"fifo at quota":         {table.ContainerQuotaPath, func(p string) error { return unix.Mkfifo(p, 0o644) }, "FIFO"},
		"device at quota": {table.ContainerQuotaPath, func(p string) error {
			return unix.Mknod(p, unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3)))
		}, "device"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			b := writeBundle(t, `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`)
			rootfs := filepath.Join(b, "rootfs")
			special := filepath.Join(rootfs, c.target)
			if err := os.MkdirAll(filepath.Dir(special), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := c.make(special); err != nil {
				t.Fatal(err)
			}
			left := -1
			done := inPrivateMountNS(t, func() error {
				err := CreateContainer(context.Background(), cfg, State{ID: "c1", Bundle: b})
				left = mountsUnder(rootfs)
				return err
			})
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				// Unblock the hook's open (a writer appears) so the test binary can go on.
				if f, oerr := os.OpenFile(special, os.O_WRONLY|unix.O_NONBLOCK, 0); oerr == nil {
					f.Close()
				}
				t.Fatalf("the hook blocked on the %s at %s", c.kind, c.target)
			}
			if err == nil || !strings.Contains(err.Error(), c.target) || !strings.Contains(err.Error(), c.kind) {
				t.Fatalf("CreateContainer: %v; want a refusal naming %s and %q", err, c.target, c.kind)
			}
			if left != 0 {
				t.Errorf("%d mounts left under the rootfs", left)
			}
			if _, ok, _ := tenant.Lookup(cfg.RunDir, "c1"); ok {
				t.Error("the refused container is still registered")
			}
			for _, d := range []string{"clients", "tenants"} {
				if ents, _ := os.ReadDir(filepath.Join(cfg.RunDir, d)); len(ents) != 0 {
					t.Errorf("%s/ still holds %d entries", d, len(ents))
				}
			}
		})
	}
}

// TestCreateContainerBindsThroughFDs: on a clean rootfs every DetShare mount lands, read-only unless it is meant to
// be written (the client page), and shows the host file's content; the mounts go through /proc/self/fd.
func TestCreateContainerBindsThroughFDs(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	b := writeBundle(t, `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`)
	rootfs := filepath.Join(b, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	var lib []byte
	var libErr, preloadWrite, pageWrite error
	err := createInNS(t, cfg, b, func() {
		lib, libErr = os.ReadFile(filepath.Join(rootfs, table.ContainerLibPath))
		preloadWrite = os.WriteFile(filepath.Join(rootfs, table.ContainerLdPreloadPath), []byte("x"), 0o644)
		f, err := os.OpenFile(filepath.Join(rootfs, table.ContainerClientPagePath), os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		pageWrite = err
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	defer tenant.Deregister(cfg.RunDir, "c1")
	if libErr != nil || string(lib) != "x" {
		t.Errorf("library in the container: %q, %v; want the host file's content", lib, libErr)
	}
	if !errors.Is(preloadWrite, unix.EROFS) {
		t.Errorf("writing /etc/ld.so.preload: %v; want EROFS (read-only bind)", preloadWrite)
	}
	if pageWrite != nil {
		t.Errorf("opening the client page for writing: %v; want it writable", pageWrite)
	}
}

// TestCreateContainerSwappedDirectoryStaysInRoot: /run/detshare is swapped for a symlink to a host directory between
// the resolution of a mount target and its use (the race a container sharing the rootfs can run). The hook created
// root-owned files in that host directory; now it works on descriptors, so whatever it creates stays in the rootfs.
func TestCreateContainerSwappedDirectoryStaysInRoot(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	b := writeBundle(t, `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`)
	rootfs := filepath.Join(b, "rootfs")
	host := t.TempDir() // stands for any host directory
	runDir := filepath.Join(rootfs, "run", "detshare")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	swapped := false
	testAfterResolve = func(dest string) {
		if swapped || !strings.HasPrefix(dest, "/run/detshare/") {
			return
		}
		swapped = true
		if err := os.Rename(runDir, runDir+".old"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(host, runDir); err != nil {
			t.Error(err)
		}
	}
	defer func() { testAfterResolve = nil }()
	err := createInNS(t, cfg, b, nil)
	if err == nil {
		defer tenant.Deregister(cfg.RunDir, "c1")
	}
	if !swapped {
		t.Fatal("the swap never ran: no mount under /run/detshare was resolved")
	}
	ents, _ := os.ReadDir(host)
	for _, e := range ents {
		t.Errorf("the hook created %s in the host directory (CreateContainer: %v)", filepath.Join(host, e.Name()), err)
	}
}

// TestCreateContainerSymlinkOutOfRootStaysInRoot: an image whose /run is a symlink to a host directory never gets
// DetShare files created in that directory: the symlink is resolved inside the root, where its target is missing, and
// the hook refuses to create directories through a dangling symlink (pathrs), leaving nothing registered.
func TestCreateContainerSymlinkOutOfRootStaysInRoot(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	b := writeBundle(t, `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`)
	rootfs := filepath.Join(b, "rootfs")
	host := t.TempDir()
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(rootfs, "run")); err != nil {
		t.Fatal(err)
	}
	err := createInNS(t, cfg, b, nil)
	if ents, _ := os.ReadDir(host); len(ents) != 0 {
		t.Errorf("the hook created %d entries in the host directory the image's /run points to", len(ents))
	}
	if err == nil || !strings.Contains(err.Error(), table.ContainerQuotaPath) {
		t.Errorf("CreateContainer: %v; want a refusal naming %s", err, table.ContainerQuotaPath)
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "c1"); ok {
		t.Error("the refused container is still registered")
	}
}

// TestCreateContainerBindsAMountedPage: with the table asking for pages on a tmpfs of their own (the scheduler's
// tenants.page_mounts, issue 27), the hook's bind by descriptor carries that mount into the container: the
// container's /run/detshare/client.page is the very page (device and inode), writable, and a write past its end is
// refused by the kernel (ENOSPC), not stored in the host's run directory.
func TestCreateContainerBindsAMountedPage(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	cfg := testConfig(t)
	tb, err := table.Create(cfg.RunDir)
	if err != nil {
		t.Fatal(err)
	}
	tb.SetPageMounts(true)
	tb.Close()
	b := writeBundle(t, `{"process":{"env":["DETSHARE_TIER=burstable","DETSHARE_SMS=8"]},"root":{"path":"rootfs"}}`)
	rootfs := filepath.Join(b, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	var same bool
	var hostErr, pastEnd error
	var hostMounted bool
	err = createInNS(t, cfg, b, func() {
		host := table.NewPaths(cfg.RunDir).ClientPage("c1")
		var hs, cs unix.Stat_t
		hostErr = unix.Stat(host, &hs)
		if unix.Stat(filepath.Join(rootfs, table.ContainerClientPagePath), &cs) == nil && hostErr == nil {
			same = hs.Dev == cs.Dev && hs.Ino == cs.Ino
		}
		var ds unix.Stat_t
		hostMounted = unix.Stat(filepath.Dir(host), &ds) == nil && ds.Dev != hs.Dev
		f, err := os.OpenFile(filepath.Join(rootfs, table.ContainerClientPagePath), os.O_RDWR, 0)
		if err != nil {
			pastEnd = err
			return
		}
		defer f.Close()
		chunk := make([]byte, 1<<20)
		for off := int64(table.ClientPageSize); off < 16<<20 && pastEnd == nil; off += int64(len(chunk)) {
			_, pastEnd = f.WriteAt(chunk, off)
		}
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	defer tenant.Deregister(cfg.RunDir, "c1")
	if hostErr != nil || !hostMounted {
		t.Fatalf("the host's page is not on a filesystem of its own (%v)", hostErr)
	}
	if !same {
		t.Error("the container's client page is not the host's page")
	}
	if !errors.Is(pastEnd, unix.ENOSPC) {
		t.Errorf("16 MiB written past the page's end in the container: %v, want ENOSPC", pastEnd)
	}
}
