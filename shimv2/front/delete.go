package front

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/cgroupgpu/tenant"
)

// runcRoot is containerd's default runc state root (pkg/process.RuncRoot).
const runcRoot = "/run/containerd/runc"

// DeleteConfig is one `delete` action.
type DeleteConfig struct {
	Namespace, ID string
	Dir           string // containerd runs delete in the bundle; the container's bundle is <parent of Dir>/<ID>
	RunDir        string // DetShare's run directory (table.RunDir), for the deregistration
	Log           *logrus.Entry
}

// Stopped is the `delete` action's result (containerd's shim.StopStatus).
type Stopped struct {
	Pid        int
	ExitStatus int
	ExitedAt   time.Time
}

// Delete does what containerd 1.7's runc manager Stop does after a shim went away (runc delete --force, unmount
// the rootfs, read the init pid), then deregisters the container from DetShare (a no-op for a container that was
// never registered), so a container whose shim died is deregistered too. Failures after the bundle was read are
// logged, as containerd logs them.
func Delete(c DeleteConfig) (Stopped, error) {
	if c.Namespace == "" {
		return Stopped{}, ErrNoNamespace
	}
	path := filepath.Join(filepath.Dir(c.Dir), c.ID)
	runtimeBin, err := os.ReadFile(filepath.Join(path, "runtime"))
	if err != nil {
		return Stopped{}, err
	}
	root, err := runcRootOf(path)
	if err != nil {
		return Stopped{}, err
	}
	if err := runcDelete(string(runtimeBin), root, path, c.Namespace, c.ID); err != nil {
		c.Log.WithError(err).Warn("failed to remove runc container")
	}
	if err := unmountRecursive(filepath.Join(path, "rootfs")); err != nil {
		c.Log.WithError(err).Warn("failed to cleanup rootfs mount")
	}
	pid, err := readPid(filepath.Join(path, "init.pid"))
	if err != nil {
		c.Log.WithError(err).Warn("failed to read init pid file")
	}
	// The serving shim deregisters at Delete; a container still registered here lost its shim (killed, crashed).
	if ok, err := tenant.DeregisterIfRegistered(c.RunDir, c.ID); err != nil {
		c.Log.WithError(err).WithField("id", c.ID).Warn("deregistration at shim delete failed")
	} else if ok {
		c.Log.WithField("id", c.ID).Info("deregistered from DetShare at shim delete (its shim went away without deleting it)")
	}
	return Stopped{Pid: pid, ExitStatus: 128 + int(unix.SIGKILL), ExitedAt: time.Now()}, nil
}

// runcRootOf is the runc root of the bundle's options.json (the runc options the serving shim stored at create),
// else containerd's default.
func runcRootOf(bundle string) (string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "options.json"))
	if errors.Is(err, os.ErrNotExist) {
		return runcRoot, nil
	}
	if err != nil {
		return "", err
	}
	var o struct {
		Root string `json:"root,omitempty"`
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return "", fmt.Errorf("read %s: %w", filepath.Join(bundle, "options.json"), err)
	}
	if o.Root == "" {
		return runcRoot, nil
	}
	return o.Root, nil
}

// runcDelete runs `runc delete --force` as containerd's go-runc does for the manager (process.NewRunc): the
// runtime binary of the bundle (runc when empty), root <root>/<namespace>, the bundle's log.json, SIGKILL when the
// shim dies, NOTIFY_SOCKET removed from the environment.
func runcDelete(bin, root, bundle, ns, id string) error {
	if bin == "" {
		bin = "runc"
	}
	cmd := exec.Command(bin, "--root", filepath.Join(root, ns), "--log", filepath.Join(bundle, "log.json"),
		"--log-format", "json", "delete", "--force", id)
	cmd.Env = filterEnv(os.Environ(), "NOTIFY_SOCKET")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %s", err, out)
	}
	return nil
}

func readPid(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(string(data))
}

// unmountRecursive unmounts every mount at or under target, deepest first (containerd's mount.UnmountRecursive
// with flags 0): a FUSE mount through fusermount, others until the kernel says there is none (EINVAL), retrying
// while busy. An error is returned only for target itself (the last one), as containerd does.
func unmountRecursive(target string) error {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(target))
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var targets []string
	for _, m := range ms {
		if !seen[m.Mountpoint] {
			seen[m.Mountpoint] = true
			targets = append(targets, m.Mountpoint)
		}
	}
	sort.SliceStable(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	for i, t := range targets {
		if err := unmountAll(t); err != nil && i == len(targets)-1 {
			return err
		}
	}
	return nil
}

func unmountAll(target string) error {
	if _, err := os.Stat(target); os.IsNotExist(err) {
		return nil
	}
	for {
		if err := unmount(target); err != nil {
			if err == unix.EINVAL {
				return nil
			}
			return err
		}
	}
}

func unmount(target string) error {
	var st unix.Statfs_t
	if unix.Statfs(target, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC {
		for _, h := range []string{"fusermount3", "fusermount"} {
			if exec.Command(h, "-u", target).Run() == nil {
				return nil
			}
		}
	}
	for i := 0; i < 50; i++ {
		err := unix.Unmount(target, 0)
		if err == unix.EBUSY {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		return err
	}
	return fmt.Errorf("failed to unmount target %s: %w", target, unix.EBUSY)
}
