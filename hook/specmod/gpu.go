package specmod

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/internal/quote"
)

// GPUAnnotation records which GPU edit DetShare gave the container (its CDI name or source, and device node).
const GPUAnnotation = "io.detshare.gpu"

// nvidiaHooks are the NVIDIA container toolkit's legacy prestart hooks, which inject the GPUs named by
// NVIDIA_VISIBLE_DEVICES themselves (docker --gpus without CDI, the nvidia runtime in legacy mode).
var nvidiaHooks = []string{"nvidia-container-runtime-hook", "nvidia-container-toolkit"}

// ForGPU gives the container the GPU of e, composing with NVIDIA's own mechanisms:
//
//   - the spec already has GPU nodes (docker --gpus through CDI, `--device nvidia.com/gpu=…`, the NVIDIA device
//     plugin, containerd's CDI injection of cdi.k8s.io/ annotations): the placed GPU's node must be one of them,
//     and only what is missing of e is added (entries are matched by device path, mount destination, hook); a
//     container holding other GPUs but not the placed one is an error naming both;
//   - the spec has NVIDIA's legacy prestart hook: that hook injects the GPUs of NVIDIA_VISIBLE_DEVICES later, so
//     nothing is added, and NVIDIA_VISIBLE_DEVICES must include the placed GPU (all, its index or UUID);
//   - otherwise e is applied (CDIEdits).
//
// It is idempotent: a retried create, or a spec that already carries the edit, is left as it is.
func ForGPU(e cdi.Edit) Modifier {
	return ModifierFunc(func(s *Spec) error {
		if e.Node == "" || !cdi.IsGPUNode(e.Node) {
			return fmt.Errorf("GPU edit from %s: no GPU device node (want /dev/nvidia<N>)", e.From)
		}
		var have []string
		for _, d := range s.Devices() {
			if cdi.IsGPUNode(d.Path) {
				have = append(have, d.Path)
			}
		}
		ann := e.Node
		if e.Name != "" {
			ann = e.Name + " " + e.Node
		}
		if len(have) > 0 && !contains(have, e.Node) {
			return fmt.Errorf("the container already has GPU device(s) %s from another mechanism (docker --gpus, CDI, a "+
				"device plugin) but DetShare placed it on GPU %d (%s, %s): set detshare.io/gpu to one of its GPUs or drop "+
				"the other GPU request", strings.Join(have, ", "), e.GPU.Index, e.GPU.UUID, e.Node)
		}
		if len(have) == 0 && hasNVIDIAHook(s) {
			if !visibleIncludes(envValue(s.Env(), "NVIDIA_VISIBLE_DEVICES"), e.GPU) {
				return fmt.Errorf("NVIDIA's runtime hook gives this container NVIDIA_VISIBLE_DEVICES=%s, which is not "+
					"the GPU DetShare placed it on (%d, %s): set detshare.io/gpu to that GPU or NVIDIA_VISIBLE_DEVICES to %d",
					quote.Q(envValue(s.Env(), "NVIDIA_VISIBLE_DEVICES")), e.GPU.Index, e.GPU.UUID, e.GPU.Index)
			}
			return SetAnnotations(map[string]string{GPUAnnotation: "nvidia-container-runtime-hook " + e.Node}).Modify(s)
		}
		return Chain(CDIEdits(e.Edits), SetAnnotations(map[string]string{GPUAnnotation: ann})).Modify(s)
	})
}

// GPUProvided tells whether the spec already gets a GPU by NVIDIA's mechanisms: a GPU device node in linux.devices,
// or NVIDIA's legacy runtime hook.
func GPUProvided(s *Spec) bool {
	for _, d := range s.Devices() {
		if cdi.IsGPUNode(d.Path) {
			return true
		}
	}
	return hasNVIDIAHook(s)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func hasNVIDIAHook(s *Spec) bool {
	for _, st := range Stages {
		for _, h := range s.Hooks(st) {
			for _, n := range nvidiaHooks {
				if filepath.Base(h.Path) == n {
					return true
				}
			}
		}
	}
	return false
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// visibleIncludes tells whether an NVIDIA_VISIBLE_DEVICES value selects gpu.
func visibleIncludes(v string, gpu cdi.GPU) bool {
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "all" || f == fmt.Sprint(gpu.Index) || (gpu.UUID != "" && strings.EqualFold(f, gpu.UUID)) {
			return true
		}
	}
	return false
}

// LinuxDevice is an entry of linux.devices.
type LinuxDevice struct {
	Path  string
	Type  string
	Major int64
	Minor int64
}

// Devices returns linux.devices (known fields only).
func (s *Spec) Devices() []LinuxDevice {
	l, _ := s.m["linux"].(map[string]any)
	a, _ := l["devices"].([]any)
	var out []LinuxDevice
	for _, v := range a {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		out = append(out, LinuxDevice{Path: str(m, "path"), Type: str(m, "type"), Major: num(m["major"]),
			Minor: num(m["minor"])})
	}
	return out
}

func num(v any) int64 {
	switch n := v.(type) {
	case json.Number:
		i, _ := n.Int64()
		return i
	case float64:
		return int64(n)
	case int64:
		return n
	}
	return 0
}

// CDIEdits applies CDI container edits the way a CDI-aware runtime does, idempotently: each device node goes into
// linux.devices (unless one is already at its path) with an allow rule in linux.resources.devices; each mount is
// added unless its destination is already mounted (what NVIDIA's injection put there stays); each hook is added
// unless present; env entries replace the same key.
func CDIEdits(e cdi.ContainerEdits) Modifier {
	return ModifierFunc(func(s *Spec) error {
		for _, n := range e.DeviceNodes {
			if err := addDevice(s, n); err != nil {
				return err
			}
		}
		var mounts []Mount
		for _, m := range e.Mounts {
			if mounted(s, m.ContainerPath) {
				continue
			}
			typ := m.Type
			if typ == "" {
				typ = "bind"
			}
			mounts = append(mounts, Mount{Destination: m.ContainerPath, Type: typ, Source: m.HostPath, Options: m.Options})
		}
		mods := []Modifier{AddMounts(mounts...)}
		for _, h := range e.Hooks {
			hk := Hook{Path: h.Path, Args: h.Args, Env: h.Env}
			if h.Timeout != nil {
				hk.Timeout = *h.Timeout
			}
			mods = append(mods, AddHook(h.HookName, hk))
		}
		for _, kv := range e.Env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("CDI env entry %s: want KEY=VALUE", quote.Q(kv))
			}
			mods = append(mods, SetEnv(k, v))
		}
		return Chain(mods...).Modify(s)
	})
}

func mounted(s *Spec, dest string) bool {
	for _, m := range s.Mounts() {
		if filepath.Clean(m.Destination) == filepath.Clean(dest) {
			return true
		}
	}
	return false
}

// addDevice puts node n into linux.devices and allows it in linux.resources.devices, each once.
func addDevice(s *Spec, n cdi.DeviceNode) error {
	if !filepath.IsAbs(n.Path) {
		return fmt.Errorf("device node path %s: must be absolute", quote.Q(n.Path))
	}
	typ := n.Type
	if typ == "" {
		typ = "c"
	}
	if typ != "c" && typ != "b" {
		return fmt.Errorf("device node %s: type %q: DetShare adds character (c) or block (b) devices only", n.Path, typ)
	}
	if n.Major == 0 && n.Minor == 0 {
		// A CDI spec may leave them to the runtime, which stats the host node.
		hp := n.HostPath
		if hp == "" {
			hp = n.Path
		}
		st, err := cdi.NodeFor(n.Path, hp)
		if err != nil {
			return err
		}
		n.Major, n.Minor = st.Major, st.Minor
		if n.FileMode == nil {
			n.FileMode = st.FileMode
		}
	}
	linux, err := object(s.m, "linux")
	if err != nil {
		return err
	}
	devs, err := array(linux, "devices")
	if err != nil {
		return err
	}
	present := false
	for _, v := range devs {
		if m, ok := v.(map[string]any); ok && filepath.Clean(str(m, "path")) == filepath.Clean(n.Path) {
			present = true
			// The node already there (NVIDIA's injection, a retried create) decides the numbers to allow.
			n.Major, n.Minor, typ = num(m["major"]), num(m["minor"]), str(m, "type")
		}
	}
	if !present {
		d := map[string]any{"path": n.Path, "type": typ, "major": json.Number(fmt.Sprint(n.Major)),
			"minor": json.Number(fmt.Sprint(n.Minor))}
		if n.FileMode != nil {
			d["fileMode"] = json.Number(fmt.Sprint(*n.FileMode))
		}
		for k, p := range map[string]*uint32{"uid": n.UID, "gid": n.GID} {
			if p != nil {
				d[k] = json.Number(fmt.Sprint(*p))
			}
		}
		linux["devices"] = append(devs, d)
	}
	access := n.Permissions
	if access == "" {
		access = "rwm"
	}
	access = normAccess(access)
	res, err := object(linux, "resources")
	if err != nil {
		return err
	}
	rules, err := array(res, "devices")
	if err != nil {
		return err
	}
	for _, v := range rules {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		if allow, _ := m["allow"].(bool); allow && str(m, "type") == typ && num(m["major"]) == n.Major &&
			num(m["minor"]) == n.Minor && normAccess(str(m, "access")) == access {
			return nil
		}
	}
	res["devices"] = append(rules, map[string]any{"allow": true, "type": typ,
		"major": json.Number(fmt.Sprint(n.Major)), "minor": json.Number(fmt.Sprint(n.Minor)), "access": access})
	return nil
}

// normAccess sorts an access string into r, w, m order ("mrw" and "rwm" are one rule).
func normAccess(a string) string {
	b := []byte(a)
	order := map[byte]int{'r': 0, 'w': 1, 'm': 2}
	sort.Slice(b, func(i, j int) bool { return order[b[i]] < order[b[j]] })
	return string(b)
}
