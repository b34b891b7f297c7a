package cdi

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
)

// Edit is the edit that gives a container one GPU, and where it came from.
type Edit struct {
	GPU GPU
	// Name is the qualified CDI device name (vendor/class=name) when the edit is a device of a CDI spec on disk,
	// which a CDI-aware runtime can inject by that name; "" for a generated edit.
	Name string
	// From says where the edit came from: the spec file, or "driver files under <root>".
	From  string
	Edits ContainerEdits
	// Node is the container path of the GPU's own device node (/dev/nvidia<minor>), which tells this GPU from the
	// host's others.
	Node string
}

// Source gives the edit of one GPU. The shim, the runc wrapper and the Kubernetes plugins take one from their
// main: the host's (Host) or the simulated GPU's (Simulated, a test double).
type Source interface {
	Edit(gpu GPU) (Edit, error)
}

// Host is the host's source: the NVIDIA container toolkit's CDI spec (kind nvidia.com/gpu in SpecDirs under
// Root) when it has the GPU, else an edit generated from the driver's files.
type Host struct {
	Root     string   // "" is the host
	SpecDirs []string // nil: SpecDirs
	HookPath string   // detshare-hook, for the generated edit's loader hook ("" none)
	// StripRoot: Root is where the host's / is mounted (a Kubernetes plugin's pod mounts it at /host); files are
	// looked up under Root but the edit names them by their host paths, which is what kubelet and the runtime see.
	StripRoot bool
	// CacheDir keeps the edit generated from the driver's files between calls (Driver.CacheDir); "" regenerates it.
	CacheDir string
}

// Edit implements Source.
func (h Host) Edit(gpu GPU) (Edit, error) {
	e, err := h.edit(gpu)
	if err != nil || !h.StripRoot || h.Root == "" || h.Root == "/" {
		return e, err
	}
	strip := func(p string) string {
		if rest, ok := strings.CutPrefix(p, filepath.Clean(h.Root)+"/"); ok {
			return "/" + rest
		}
		return p
	}
	nodes := make([]DeviceNode, len(e.Edits.DeviceNodes))
	for i, n := range e.Edits.DeviceNodes {
		n.HostPath = strip(n.HostPath)
		if n.HostPath == n.Path {
			n.HostPath = ""
		}
		nodes[i] = n
	}
	mounts := make([]Mount, len(e.Edits.Mounts))
	for i, m := range e.Edits.Mounts {
		m.HostPath = strip(m.HostPath)
		mounts[i] = m
	}
	e.Edits.DeviceNodes, e.Edits.Mounts = nodes, mounts
	return e, nil
}

func (h Host) edit(gpu GPU) (Edit, error) {
	dirs := h.SpecDirs
	if dirs == nil {
		dirs = SpecDirs
	}
	specs, bad := FindSpecs(h.Root, dirs, NVIDIAKind)
	for _, err := range bad {
		logrus.WithError(err).Debug("CDI spec skipped")
	}
	// A later spec wins on a name clash (CDI registry order), so search from the last.
	for i := len(specs) - 1; i >= 0; i-- {
		s := specs[i]
		for _, name := range names(gpu) {
			if e, ok := s.Spec.Device(name); ok {
				e, err := h.resolveNodes(e, s.Path)
				if err != nil {
					return Edit{}, err
				}
				ed := Edit{GPU: gpu, Name: NVIDIAKind + "=" + name, From: s.Path, Edits: e, Node: GPUNode(e)}
				if ed.Node == "" {
					return Edit{}, fmt.Errorf("CDI spec %s: device %s has no /dev/nvidia<N> node", s.Path, name)
				}
				return ed, nil
			}
		}
	}
	if len(specs) > 0 {
		logrus.WithFields(logrus.Fields{"uuid": gpu.UUID, "index": gpu.Index}).
			Warn("the NVIDIA CDI spec does not name this GPU; generating its edit from the driver's files")
	}
	d := Driver{Root: h.Root, HookPath: h.HookPath, CacheDir: h.CacheDir}
	e, err := d.Edits(gpu)
	if err != nil {
		return Edit{}, fmt.Errorf("GPU device edit: %w", err)
	}
	return Edit{GPU: gpu, From: "driver files under " + rootName(h.Root), Edits: e, Node: GPUNode(e)}, nil
}

// resolveNodes fills in the type and numbers of nodes a spec leaves to the runtime (nvidia-ctk writes paths only),
// from the host's node, so every consumer (OCI spec, device plugin, DRA) gets the same complete edit.
func (h Host) resolveNodes(e ContainerEdits, from string) (ContainerEdits, error) {
	nodes := make([]DeviceNode, len(e.DeviceNodes))
	for i, n := range e.DeviceNodes {
		if n.Major != 0 || n.Minor != 0 {
			nodes[i] = n
			continue
		}
		hp := n.HostPath
		if hp == "" {
			hp = n.Path
		}
		r, err := NodeFor(n.Path, Join(h.Root, hp))
		if err != nil {
			return ContainerEdits{}, fmt.Errorf("CDI spec %s lists %w (regenerate it: nvidia-ctk cdi generate)", from, err)
		}
		r.Permissions, r.UID, r.GID = n.Permissions, n.UID, n.GID
		if n.FileMode != nil {
			r.FileMode = n.FileMode
		}
		nodes[i] = r
	}
	e.DeviceNodes = nodes
	return e, nil
}

// names are the device names that may denote gpu in NVIDIA's spec: its UUID when known (an index in a spec
// written before a GPU was added or removed may name another GPU), else its index.
func names(gpu GPU) []string {
	if gpu.UUID != "" {
		return []string{gpu.UUID}
	}
	return []string{strconv.Itoa(gpu.Index)}
}

// GPUNode is the container path of the first per-GPU node of e (/dev/nvidia<N>, or the simulated GPU's
// /dev/detshare-simgpu<N>), "" when none.
func GPUNode(e ContainerEdits) string {
	for _, n := range e.DeviceNodes {
		if IsGPUNode(n.Path) {
			return n.Path
		}
	}
	return ""
}

// IsGPUNode tells whether path is one GPU's own node: /dev/nvidia<N> or the simulated GPU's
// /dev/detshare-simgpu<N> (not nvidiactl, nvidia-uvm, ...).
func IsGPUNode(path string) bool {
	for _, p := range []string{"/dev/nvidia", SimNodePrefix} {
		if rest, ok := strings.CutPrefix(path, p); ok && rest != "" {
			if _, err := strconv.Atoi(rest); err == nil {
				return true
			}
		}
	}
	return false
}

// SimNodePrefix is the path prefix of the simulated GPU's device nodes (/dev/detshare-simgpu<N>); the simulated
// libcuda.so.1 (a test double, integration/simgpu) looks for them.
const SimNodePrefix = "/dev/detshare-simgpu"

// SimNodeHostPath is the host node whose numbers the simulated GPU's device nodes take (/dev/null's): the runtime
// creates /dev/detshare-simgpu<N> in the container as a character device, as it creates /dev/nvidia<N> for a GPU.
const SimNodeHostPath = "/dev/null"

// Simulated is the simulated GPU's device source (a test double of Host): GPU N's edit is its device node
// /dev/detshare-simgpu<N>, numbered as SimNodeHostPath. The shim, the runc wrapper and the Kubernetes plugins take
// it when the environment selects the simulated GPU (internal/simgpu.Selected), and apply it through the same
// modifier as a real GPU's edit.
type Simulated struct{}

// Edit implements Source.
func (Simulated) Edit(gpu GPU) (Edit, error) {
	if gpu.Index < 0 {
		return Edit{}, fmt.Errorf("simulated GPU (test double): index %d", gpu.Index)
	}
	path := fmt.Sprintf("%s%d", SimNodePrefix, gpu.Index)
	n, err := NodeFor(path, SimNodeHostPath)
	if err != nil {
		return Edit{}, fmt.Errorf("simulated GPU (test double): %w", err)
	}
	return Edit{GPU: gpu, From: "simulated GPU (test double)", Node: path,
		Edits: ContainerEdits{DeviceNodes: []DeviceNode{n}}}, nil
}

// SpecFor writes the CDI spec (kind Kind) of the given GPUs' edits: one device per GPU, named by its index and by
// its UUID, and "all" — the shape `nvidia-ctk cdi generate` writes, for `detshare cdi spec`.
func SpecFor(edits []Edit) *Spec {
	s := &Spec{Version: Version, Kind: Kind}
	var all ContainerEdits
	seen := map[string]bool{}
	for _, e := range edits {
		s.Devices = append(s.Devices, Device{Name: strconv.Itoa(e.GPU.Index), ContainerEdits: e.Edits})
		if e.GPU.UUID != "" {
			s.Devices = append(s.Devices, Device{Name: e.GPU.UUID, ContainerEdits: e.Edits})
		}
		all = merge(all, e.Edits, seen)
	}
	if len(edits) > 1 {
		s.Devices = append(s.Devices, Device{Name: "all", ContainerEdits: all})
	}
	return s
}

// merge appends the entries of o that a are missing (by device path, mount destination, hook path and args, env).
func merge(a, o ContainerEdits, seen map[string]bool) ContainerEdits {
	for _, n := range o.DeviceNodes {
		if k := "dev:" + n.Path; !seen[k] {
			seen[k] = true
			a.DeviceNodes = append(a.DeviceNodes, n)
		}
	}
	for _, m := range o.Mounts {
		if k := "mnt:" + m.ContainerPath; !seen[k] {
			seen[k] = true
			a.Mounts = append(a.Mounts, m)
		}
	}
	for _, h := range o.Hooks {
		if k := "hook:" + h.HookName + h.Path + strings.Join(h.Args, "\x00"); !seen[k] {
			seen[k] = true
			a.Hooks = append(a.Hooks, h)
		}
	}
	for _, v := range o.Env {
		if k := "env:" + v; !seen[k] {
			seen[k] = true
			a.Env = append(a.Env, v)
		}
	}
	return a
}
