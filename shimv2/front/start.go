package front

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"github.com/moby/sys/userns"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/internal/atomicfile"
)

// SocketDir is where containerd's shims create their sockets (containerd's defaults.DefaultStateDir + "/s"), so
// that shims started by the front and by containerd's own shim library find each other's sockets.
const SocketDir = "/run/containerd/s"

// groupAnnotations select the shim a container joins (containerd's runc manager groupLabels, in its order): CRI
// puts every container of a pod into its sandbox's shim.
var groupAnnotations = []string{"io.containerd.runc.v2.group", "io.kubernetes.cri.sandbox-id"}

// SocketAddress is containerd's shim.SocketAddress: unix://<socketDir>/<sha256 of containerdAddress/ns/id>.
func SocketAddress(socketDir, containerdAddress, ns, id string) string {
	d := sha256.Sum256([]byte(filepath.Join(containerdAddress, ns, id)))
	return fmt.Sprintf("unix://%s/%x", socketDir, d)
}

// socketPath is the filesystem path of a unix:// address.
func socketPath(address string) string { return strings.TrimPrefix(address, "unix://") }

// StartConfig is one `start` action.
type StartConfig struct {
	Namespace, ID, Address string // containerd's -namespace, -id, -address
	Debug                  bool
	Serve                  string    // the serving shim's path (ServePath)
	Dir                    string    // the bundle: containerd runs start there (config.json, the address file)
	Env                    []string  // the serving shim's environment before GOMAXPROCS (containerd's: os.Environ())
	Stdin                  io.Reader // the runtime options containerd sends (a protobuf Any), may be nil
	SocketDir              string    // SocketDir unless a test says otherwise
	CgroupRoot             string    // /sys/fs/cgroup unless a test says otherwise
}

// Started is what Start did: the address containerd connects to, and the serving shim's pid (0 when an existing
// shim serves the group).
type Started struct {
	Address string
	Pid     int
}

// Start does what containerd 1.7's runc manager Start does: it picks the shim socket of the container's group,
// reuses a shim that serves it already, else listens on it and spawns the serving shim with the socket as fd 3.
// On failure it leaves no socket, address file or process behind.
func Start(c StartConfig) (_ Started, retErr error) {
	if c.Namespace == "" {
		return Started{}, ErrNoNamespace
	}
	if c.SocketDir == "" {
		c.SocketDir = SocketDir
	}
	grouping, err := groupID(c.Dir, c.ID)
	if err != nil {
		return Started{}, err
	}
	address := SocketAddress(c.SocketDir, c.Address, c.Namespace, grouping)
	addressFile := filepath.Join(c.Dir, "address")

	fd, err := newSocket(address)
	if err != nil {
		// A socket of this group exists: a shim serves the group already (CRI's second container of a pod), or
		// one died without removing it.
		if !errors.Is(err, unix.EADDRINUSE) {
			return Started{}, fmt.Errorf("create new shim socket: %w", err)
		}
		if canConnect(address) {
			if err := writeAddress(addressFile, address); err != nil {
				return Started{}, fmt.Errorf("write existing socket for shim: %w", err)
			}
			return Started{Address: address}, nil
		}
		if err := os.Remove(socketPath(address)); err != nil {
			return Started{}, fmt.Errorf("remove pre-existing socket: %w", err)
		}
		if fd, err = newSocket(address); err != nil {
			return Started{}, fmt.Errorf("try create new shim socket 2x: %w", err)
		}
	}
	sock := os.NewFile(uintptr(fd), socketPath(address))
	defer sock.Close() // the serving shim has its own copy
	defer func() {
		if retErr != nil {
			_ = os.Remove(socketPath(address))
		}
	}()

	if err := writeAddress(addressFile, address); err != nil {
		return Started{}, err
	}
	defer func() {
		if retErr != nil {
			_ = os.Remove(addressFile)
		}
	}()

	proc, err := spawn(c, sock)
	if err != nil {
		return Started{}, err
	}
	defer func() {
		if retErr != nil {
			_ = proc.Kill()
			_, _ = proc.Wait()
		}
	}()

	if c.Stdin != nil {
		data, err := io.ReadAll(c.Stdin)
		if err != nil {
			return Started{}, fmt.Errorf("failed to read config bytes from stdin: %w", err)
		}
		// containerd ignores options it cannot decode as runc options here (the serving shim's Create reports
		// bad options); so does the front.
		if cg, ok := ShimCgroup(data); ok && cg != "" {
			if err := joinCgroup(c.CgroupRoot, cg, proc.Pid); err != nil {
				return Started{}, err
			}
		}
	}
	if err := adjustOOMScore(os.Getppid(), proc.Pid); err != nil {
		return Started{}, fmt.Errorf("failed to adjust OOM score for shim: %w", err)
	}
	return Started{Address: address, Pid: proc.Pid}, nil
}

// groupID is the container's shim group: the first group annotation of the bundle's config.json, else the ID.
func groupID(bundle, id string) (string, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var spec struct {
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	if err := json.NewDecoder(f).Decode(&spec); err != nil {
		return "", fmt.Errorf("read %s: %w", f.Name(), err)
	}
	for _, a := range groupAnnotations {
		if g, ok := spec.Annotations[a]; ok {
			return g, nil
		}
	}
	return id, nil
}

// newSocket listens on the unix socket of address (mode 0600, its directory created as containerd does) and
// returns the listening descriptor (close-on-exec). An existing socket file gives an error wrapping EADDRINUSE.
func newSocket(address string) (int, error) {
	path := socketPath(address)
	if err := os.MkdirAll(filepath.Dir(path), 0o600); err != nil {
		return -1, fmt.Errorf("mkdir failed for %s: %w", path, err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen unix %s: %w", path, os.NewSyscallError("bind", err))
	}
	if err := unix.Listen(fd, listenBacklog()); err != nil {
		unix.Close(fd)
		os.Remove(path)
		return -1, fmt.Errorf("listen unix %s: %w", path, os.NewSyscallError("listen", err))
	}
	if err := os.Chmod(path, 0o600); err != nil {
		unix.Close(fd)
		os.Remove(path)
		return -1, fmt.Errorf("chmod failed for %s: %w", path, err)
	}
	return fd, nil
}

// listenBacklog is Go's net.Listen backlog: net.core.somaxconn, capped as the kernel's field.
func listenBacklog() int {
	b, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if n, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && n > 0 {
		if n > 1<<16-1 {
			n = 1<<16 - 1
		}
		return n
	}
	return unix.SOMAXCONN
}

// canConnect tells whether a shim accepts connections on address (containerd's shim.CanConnect; a unix socket
// connect does not wait, so no timeout is needed).
func canConnect(address string) bool {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: socketPath(address)}) == nil
}

// writeAddress replaces path with address atomically (rename), as containerd's shim.WriteAddress; not fsynced:
// the file lives under containerd's state directory, which does not outlive a reboot.
func writeAddress(path, address string) error {
	return atomicfile.Write(path, []byte(address), 0o644, false)
}

// spawn starts the serving shim as containerd's runc manager does: its flags, GOMAXPROCS=4, the bundle as working
// directory, its own process group, /dev/null as stdio and the listening socket as fd 3.
func spawn(c StartConfig, sock *os.File) (*os.Process, error) {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	env := append(append([]string(nil), c.Env...), "GOMAXPROCS=4")
	argv := append([]string{c.Serve}, serveArgs(c.Namespace, c.ID, c.Address, c.Debug)...)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if os.Getenv("SCHED_CORE") != "" {
		// containerd's schedcore.Create(ProcessGroup): a core-scheduling domain for the shim's process group.
		if err := unix.Prctl(unix.PR_SCHED_CORE, unix.PR_SCHED_CORE_CREATE, 0, 2, 0); err != nil {
			return nil, fmt.Errorf("enable sched core support: %w", err)
		}
	}
	p, err := os.StartProcess(c.Serve, argv, &os.ProcAttr{Dir: c.Dir, Env: env,
		Files: []*os.File{null, null, null, sock}, Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		return nil, fmt.Errorf("start serving shim: %w", err)
	}
	return p, nil
}

// joinCgroup moves pid into the shim cgroup cg (the runtime options' ShimCgroup), on the unified hierarchy or on
// every cgroup v1 hierarchy that has it, as containerd's runc manager does.
func joinCgroup(root, cg string, pid int) error {
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	if !strings.HasPrefix(cg, "/") {
		return fmt.Errorf("failed to load cgroup %s: invalid group path: must be an absolute path starting with /", cg)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fmt.Errorf("failed to load cgroup %s: %w", cg, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		if err := writePid(filepath.Join(root, cg, "cgroup.procs"), pid); err != nil {
			return fmt.Errorf("failed to join cgroup %s: %w", cg, err)
		}
		return nil
	}
	mounts, err := cgroupV1Mounts()
	if err != nil {
		return fmt.Errorf("failed to load cgroup %s: %w", cg, err)
	}
	joined := 0
	for _, m := range mounts {
		dir := filepath.Join(m, cg)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if err := writePid(filepath.Join(dir, "cgroup.procs"), pid); err != nil {
			return fmt.Errorf("failed to join cgroup %s: %w", cg, err)
		}
		joined++
	}
	if joined == 0 {
		return fmt.Errorf("failed to load cgroup %s: cgroup deleted (on no cgroup v1 hierarchy)", cg)
	}
	return nil
}

func writePid(path string, pid int) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(pid))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cgroupV1Mounts lists the mount points of the cgroup v1 hierarchies.
func cgroupV1Mounts() ([]string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup"))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out, nil
}

// adjustOOMScore gives the serving shim its parent's (containerd's) OOM score adjustment + 1 (containerd's
// shim.AdjustOOMScore), so that the kernel kills a shim before containerd.
func adjustOOMScore(parent, pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", parent))
	if err != nil {
		return fmt.Errorf("get parent OOM score: %w", err)
	}
	score, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("get parent OOM score: %w", err)
	}
	score = min(max(score+1, -1000), 1000)
	if err := writePid(fmt.Sprintf("/proc/%d/oom_score_adj", pid), score); err != nil {
		if errors.Is(err, os.ErrPermission) && (os.Geteuid() != 0 || userns.RunningInUserNS()) {
			return nil
		}
		return fmt.Errorf("set shim OOM score: %w", err)
	}
	return nil
}
