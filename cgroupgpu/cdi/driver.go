package cdi

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Driver generates a GPU's edit from the NVIDIA driver's files, for hosts without the NVIDIA container toolkit.
// Everything is looked up under Root ("" is the host), so tests can point it at a fixture tree.
type Driver struct {
	Root string
	// HookPath is the host path of detshare-hook, run as a createContainer hook that adds the library directories
	// to the container's loader cache (`detshare-hook ldcache`). Empty: no hook; the libraries are still mounted at
	// their sonames, which the loader finds in its default directories.
	HookPath string
	// LdconfigP lists the loader cache (`ldconfig -p`); nil runs ldconfig when Root is the host. Tests set it.
	LdconfigP func() (string, error)
	// CacheDir keeps the generated common edit between container starts (CacheFile; a root-owned directory such as
	// the run directory); "" generates it every time.
	CacheDir string
}

// Control nodes every GPU container needs; the first two are required.
var controlNodes = []struct {
	path     string
	required bool
}{{"/dev/nvidiactl", true}, {"/dev/nvidia-uvm", true}, {"/dev/nvidia-uvm-tools", false}, {"/dev/nvidia-modeset", false}}

// DriverLibraries are the driver's user-space libraries (compute and utility: what CUDA, NVML and nvidia-smi load),
// as the NVIDIA container toolkit lists them.
var DriverLibraries = []string{
	"libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
	"libnvidia-gpucomp.so", "libnvidia-opencl.so", "libnvidia-allocator.so", "libnvidia-cfg.so",
	"libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so", "libnvidia-nscq.so", "libnvidia-fatbinaryloader.so",
	"libnvidia-compiler.so",
}

// DriverBinaries are the driver's tools a GPU container may use.
var DriverBinaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
	"nvidia-cuda-mps-server"}

// libDirs are searched in order, 64-bit first; the first directory holding a library wins.
var libDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/lib64",
	"/usr/lib64/nvidia", "/usr/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu/nvidia/current",
	"/lib/x86_64-linux-gnu", "/lib64", "/usr/local/nvidia/lib64", "/usr/lib", "/lib"}

var binDirs = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/nvidia/bin"}

// MountOptions are the options of every mount DetShare adds (read-only, as the NVIDIA container toolkit does).
var MountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// GPU identifies one GPU: its index (NVML order) and UUID. UUID wins when both are known.
type GPU struct {
	Index int
	UUID  string
}

// DriverGPU is a GPU as the driver's /proc files describe it.
type DriverGPU struct {
	BusID string // directory name under /proc/driver/nvidia/gpus
	UUID  string
	Minor int
}

// GPUs lists the driver's GPUs in PCI bus order (NVML's index order) from /proc/driver/nvidia/gpus/*/information.
func (d Driver) GPUs() ([]DriverGPU, error) {
	dir := Join(d.Root, "/proc/driver/nvidia/gpus")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list the driver's GPUs: %w (is the NVIDIA driver loaded?)", err)
	}
	var out []DriverGPU
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "information"))
		if err != nil {
			continue
		}
		g := DriverGPU{BusID: e.Name(), Minor: -1}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "GPU UUID":
				g.UUID = v
			case "Device Minor":
				if n, err := strconv.Atoi(v); err == nil {
					g.Minor = n
				}
			}
		}
		if g.Minor >= 0 {
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].BusID < out[j].BusID })
	return out, nil
}

// Minor is the device minor of gpu (/dev/nvidia<minor>): by UUID from the driver's /proc files, else by index in
// PCI order, else (no /proc files under Root) the index itself when /dev/nvidia<index> exists.
func (d Driver) Minor(gpu GPU) (int, error) {
	gs, err := d.GPUs()
	if err == nil && len(gs) > 0 {
		if gpu.UUID != "" {
			for _, g := range gs {
				if strings.EqualFold(g.UUID, gpu.UUID) {
					return g.Minor, nil
				}
			}
			return -1, fmt.Errorf("GPU %s: not among the driver's GPUs (%s)", gpu.UUID, describe(gs))
		}
		if gpu.Index < 0 || gpu.Index >= len(gs) {
			return -1, fmt.Errorf("GPU index %d: the driver has %d GPU(s) (%s)", gpu.Index, len(gs), describe(gs))
		}
		return gs[gpu.Index].Minor, nil
	}
	if _, serr := os.Stat(Join(d.Root, fmt.Sprintf("/dev/nvidia%d", gpu.Index))); serr == nil {
		return gpu.Index, nil
	}
	if err == nil {
		err = errors.New("no GPUs listed")
	}
	return -1, fmt.Errorf("GPU %d (%s): no minor number: %w", gpu.Index, gpu.UUID, err)
}

func describe(gs []DriverGPU) string {
	var s []string
	for i, g := range gs {
		s = append(s, fmt.Sprintf("%d: %s minor %d", i, g.UUID, g.Minor))
	}
	return strings.Join(s, "; ")
}

// Node stats the character device at the host path path (under Root) and returns its edit at path.
func (d Driver) Node(path string) (DeviceNode, error) {
	return NodeFor(path, Join(d.Root, path))
}

// NodeFor describes the character device at hostPath (following symlinks) as a node the container gets at path.
func NodeFor(path, hostPath string) (DeviceNode, error) {
	var st unix.Stat_t
	if err := unix.Stat(hostPath, &st); err != nil {
		return DeviceNode{}, fmt.Errorf("device node %s: %w", hostPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return DeviceNode{}, fmt.Errorf("device node %s: not a character device", hostPath)
	}
	mode := st.Mode & 0o777
	n := DeviceNode{Path: path, Type: "c", Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)),
		FileMode: &mode}
	if hostPath != path {
		n.HostPath = hostPath
	}
	return n, nil
}

// Edits generates the edit of gpu: its node, the control nodes, the libraries, the tools and the loader hook.
func (d Driver) Edits(gpu GPU) (ContainerEdits, error) {
	minor, err := d.Minor(gpu)
	if err != nil {
		return ContainerEdits{}, err
	}
	n, err := d.Node(fmt.Sprintf("/dev/nvidia%d", minor))
	if err != nil {
		return ContainerEdits{}, fmt.Errorf("GPU %d (%s): %w", gpu.Index, gpu.UUID, err)
	}
	e, err := d.Common()
	if err != nil {
		return ContainerEdits{}, err
	}
	e.DeviceNodes = append([]DeviceNode{n}, e.DeviceNodes...)
	return e, nil
}

// Common is the edit every GPU of the host shares: control nodes, libraries, tools, loader hook. With CacheDir set
// it is generated once per driver installation (CacheFile).
func (d Driver) Common() (ContainerEdits, error) {
	if d.CacheDir == "" {
		return d.common()
	}
	key := d.cacheKey()
	if key != "" {
		if e, ok := d.cachedCommon(key); ok {
			return e, nil
		}
	}
	e, err := d.common()
	if err == nil && key != "" {
		d.storeCommon(key, e)
	}
	return e, err
}

func (d Driver) common() (ContainerEdits, error) {
	var e ContainerEdits
	for _, c := range controlNodes {
		n, err := d.Node(c.path)
		if err != nil {
			if c.required {
				hint := ""
				if c.path == "/dev/nvidia-uvm" {
					hint = " (the driver creates it on first CUDA use on the host: run `nvidia-modprobe -u -c=0` or start nvidia-persistenced)"
				}
				return ContainerEdits{}, fmt.Errorf("%w%s", err, hint)
			}
			continue
		}
		e.DeviceNodes = append(e.DeviceNodes, n)
	}
	libs, dirs, err := d.Libraries()
	if err != nil {
		return ContainerEdits{}, err
	}
	for _, l := range libs {
		e.Mounts = append(e.Mounts, Mount{HostPath: Join(d.Root, l.Source), ContainerPath: l.Path, Type: "bind",
			Options: MountOptions})
	}
	for _, b := range d.Binaries() {
		e.Mounts = append(e.Mounts, Mount{HostPath: Join(d.Root, b), ContainerPath: b, Type: "bind", Options: MountOptions})
	}
	if sock := "/run/nvidia-persistenced/socket"; exists(Join(d.Root, sock)) {
		e.Mounts = append(e.Mounts, Mount{HostPath: Join(d.Root, sock), ContainerPath: sock, Type: "bind",
			Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate", "noexec"}})
	}
	if d.HookPath != "" && len(dirs) > 0 {
		args := []string{"detshare-hook", "ldcache"}
		for _, dir := range dirs {
			args = append(args, "--folder", dir)
		}
		e.Hooks = append(e.Hooks, Hook{HookName: "createContainer", Path: d.HookPath, Args: args})
	}
	return e, nil
}

// Library is one file to mount: Source (the real file, a host path without Root) at Path (its own path or one of
// its symlinks: the soname and development names).
type Library struct {
	Path   string
	Source string
}

var versioned = regexp.MustCompile(`^(lib[A-Za-z0-9_+-]+\.so)\.([0-9][0-9.]*)$`)

// DriverVersion is the kernel module's version (/proc/driver/nvidia/version), "" when unknown.
func (d Driver) DriverVersion() string {
	data, err := os.ReadFile(Join(d.Root, "/proc/driver/nvidia/version"))
	if err != nil {
		return ""
	}
	m := regexp.MustCompile(`Kernel Module(?: for [^ ]+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)`).FindSubmatch(data)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// Libraries finds the driver's libraries: for each of DriverLibraries, in the first directory that has it, the real
// file <name>.<driver version> and every name in that directory that resolves to it (libcuda.so.1, libcuda.so). The
// version is the kernel module's, else libcuda's. It returns the mounts and the directories they are in; no
// libcuda is an error.
func (d Driver) Libraries() ([]Library, []string, error) {
	dirs := append([]string(nil), libDirs...)
	if d.Root == "" || d.Root == "/" {
		dirs = append(d.ldcacheDirs(), dirs...)
	}
	version := d.DriverVersion()
	dirs = d.canonical(uniq(dirs))
	var out []Library
	var used []string
	for _, lib := range DriverLibraries {
		for _, dir := range dirs {
			real := d.realFile(dir, lib, version)
			if real == "" {
				continue
			}
			if version == "" && lib == "libcuda.so" {
				version = strings.TrimPrefix(filepath.Base(real), lib+".")
			}
			out = append(out, Library{Path: real, Source: real})
			// Its links in every searched directory: a driver installed outside the loader's default directories
			// (/usr/local/nvidia/lib64) is usually linked from one of them (/usr/lib/libcuda.so.1), and the
			// container's loader finds it there even without its cache.
			for _, other := range dirs {
				out = append(out, d.aliases(other, real)...)
			}
			used = append(used, dir)
			break
		}
		if lib == "libcuda.so" && len(out) == 0 {
			return nil, nil, fmt.Errorf("libcuda.so.<version> of the NVIDIA driver not found under %s in %s",
				rootName(d.Root), strings.Join(uniq(dirs), ", "))
		}
	}
	return out, uniq(used), nil
}

// canonical drops the directories that are another one reached through a link (/lib -> /usr/lib on merged-/usr
// hosts), keeping the first, so each file is mounted once.
func (d Driver) canonical(dirs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, dir := range dirs {
		real, err := filepath.EvalSymlinks(Join(d.Root, dir))
		if err != nil {
			continue
		}
		if !seen[real] {
			seen[real] = true
			out = append(out, dir)
		}
	}
	return out
}

// realFile is the regular file <lib>.<version> in dir ("" when absent); with no version known, the one with the
// longest version suffix.
func (d Driver) realFile(dir, lib, version string) string {
	ents, err := os.ReadDir(Join(d.Root, dir))
	if err != nil {
		return ""
	}
	best := ""
	for _, e := range ents {
		m := versioned.FindStringSubmatch(e.Name())
		if m == nil || m[1] != lib || !e.Type().IsRegular() {
			continue
		}
		if version != "" && m[2] != version {
			continue
		}
		if best == "" || len(m[2]) > len(best) {
			best = m[2]
		}
	}
	if best == "" {
		return ""
	}
	return filepath.Join(dir, lib+"."+best)
}

// aliases are the symlinks in dir (relative or absolute, chained) that resolve to real.
func (d Driver) aliases(dir, real string) []Library {
	ents, err := os.ReadDir(Join(d.Root, dir))
	if err != nil {
		return nil
	}
	base := strings.SplitN(filepath.Base(real), ".so", 2)[0] + ".so"
	var out []Library
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 || !strings.HasPrefix(e.Name(), base) {
			continue
		}
		if target := d.resolve(filepath.Join(dir, e.Name())); target == real {
			out = append(out, Library{Path: filepath.Join(dir, e.Name()), Source: real})
		}
	}
	return out
}

// resolve follows the symlink chain of the host path p under Root, returning the final host path (without Root).
func (d Driver) resolve(p string) string {
	for i := 0; i < 16; i++ {
		t, err := os.Readlink(Join(d.Root, p))
		if err != nil {
			return p
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		p = filepath.Clean(t)
	}
	return ""
}

// ldcacheDirs are the directories the host's loader cache lists driver libraries in (a distribution may install
// them outside the standard directories).
func (d Driver) ldcacheDirs() []string {
	list := d.LdconfigP
	if list == nil {
		list = func() (string, error) {
			for _, p := range []string{"/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig"} {
				if exists(p) {
					out, err := exec.Command(p, "-p").Output()
					return string(out), err
				}
			}
			return "", errors.New("ldconfig not found")
		}
	}
	out, err := list()
	if err != nil {
		return nil
	}
	var dirs []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, path, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=>")
		if !ok || !strings.Contains(name, "x86-64") && !strings.Contains(name, "AArch64") {
			continue
		}
		for _, lib := range DriverLibraries {
			if strings.HasPrefix(strings.TrimSpace(name), lib) {
				dirs = append(dirs, filepath.Dir(strings.TrimSpace(path)))
			}
		}
	}
	return uniq(dirs)
}

// Binaries are the driver's tools present under Root (host paths): every copy in the searched directories, since
// one may be a wrapper script that runs another (a /usr/bin/nvidia-smi that execs /usr/local/nvidia/bin/nvidia-smi).
func (d Driver) Binaries() []string {
	var out []string
	dirs := d.canonical(binDirs)
	for _, b := range DriverBinaries {
		for _, dir := range dirs {
			p := filepath.Join(dir, b)
			if st, err := os.Stat(Join(d.Root, p)); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				out = append(out, p)
			}
		}
	}
	return uniq(out)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func uniq(l []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range l {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func rootName(root string) string {
	if root == "" {
		return "/"
	}
	return root
}
