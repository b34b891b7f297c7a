// Package cdi gives a DetShare tenant the GPU it was placed on, as a CDI (Container Device Interface) edit: the
// GPU's device node and the driver's control nodes, the driver's user-space libraries and tools, and a hook that
// makes the container's loader find them. hook/specmod applies the edit to an OCI spec (the shim and the runc
// wrapper); the Kubernetes device plugin and DRA driver hand the same edit to kubelet.
//
// The edit comes from NVIDIA's own CDI spec when the NVIDIA container toolkit wrote one (`nvidia-ctk cdi generate`,
// kind nvidia.com/gpu, in /etc/cdi or /var/run/cdi), so DetShare composes with NVIDIA's stack instead of guessing
// it; otherwise it is generated from the driver's files (Driver). The package reads only files: no NVML, so the
// NVML-free shim, wrapper and hook can use it.
package cdi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Version is the CDI spec version DetShare writes (the oldest that has every field it uses: hostPath of device
// nodes, hooks, mounts).
const Version = "0.6.0"

// NVIDIAKind is the kind of the NVIDIA container toolkit's GPU devices (names "<index>", "<uuid>", "all").
const NVIDIAKind = "nvidia.com/gpu"

// Kind is the kind of the devices DetShare itself describes (`detshare cdi spec`, the DRA driver's claims).
const Kind = "detshare.io/gpu"

// SpecDirs are the CDI spec directories, in the CDI default order (a later directory wins on a name clash).
var SpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// Spec is a CDI spec file (the fields DetShare reads and writes; github.com/cncf-tags/container-device-interface
// SPEC.md).
type Spec struct {
	Version        string         `json:"cdiVersion" yaml:"cdiVersion"`
	Kind           string         `json:"kind" yaml:"kind"`
	Devices        []Device       `json:"devices" yaml:"devices"`
	ContainerEdits ContainerEdits `json:"containerEdits,omitzero" yaml:"containerEdits,omitempty"`
}

// Device is one named device of a spec.
type Device struct {
	Name           string         `json:"name" yaml:"name"`
	ContainerEdits ContainerEdits `json:"containerEdits" yaml:"containerEdits"`
}

// ContainerEdits is what a device adds to a container.
type ContainerEdits struct {
	Env         []string     `json:"env,omitempty" yaml:"env,omitempty"`
	DeviceNodes []DeviceNode `json:"deviceNodes,omitempty" yaml:"deviceNodes,omitempty"`
	Hooks       []Hook       `json:"hooks,omitempty" yaml:"hooks,omitempty"`
	Mounts      []Mount      `json:"mounts,omitempty" yaml:"mounts,omitempty"`
}

// DeviceNode is a device node the container gets at Path (created by the runtime with Type, Major and Minor, and
// allowed in the device cgroup). HostPath is where the node is on the host (default Path).
type DeviceNode struct {
	Path        string  `json:"path" yaml:"path"`
	HostPath    string  `json:"hostPath,omitempty" yaml:"hostPath,omitempty"`
	Type        string  `json:"type,omitempty" yaml:"type,omitempty"`
	Major       int64   `json:"major,omitempty" yaml:"major,omitempty"`
	Minor       int64   `json:"minor,omitempty" yaml:"minor,omitempty"`
	FileMode    *uint32 `json:"fileMode,omitempty" yaml:"fileMode,omitempty"`
	Permissions string  `json:"permissions,omitempty" yaml:"permissions,omitempty"`
	UID         *uint32 `json:"uid,omitempty" yaml:"uid,omitempty"`
	GID         *uint32 `json:"gid,omitempty" yaml:"gid,omitempty"`
}

// Hook is an OCI hook; HookName is the OCI stage (createContainer, ...).
type Hook struct {
	HookName string   `json:"hookName" yaml:"hookName"`
	Path     string   `json:"path" yaml:"path"`
	Args     []string `json:"args,omitempty" yaml:"args,omitempty"`
	Env      []string `json:"env,omitempty" yaml:"env,omitempty"`
	Timeout  *int     `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// Mount is a mount of HostPath at ContainerPath.
type Mount struct {
	HostPath      string   `json:"hostPath" yaml:"hostPath"`
	ContainerPath string   `json:"containerPath" yaml:"containerPath"`
	Type          string   `json:"type,omitempty" yaml:"type,omitempty"`
	Options       []string `json:"options,omitempty" yaml:"options,omitempty"`
}

// IsEmpty tells whether e adds nothing.
func (e ContainerEdits) IsEmpty() bool {
	return len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Hooks) == 0 && len(e.Mounts) == 0
}

// Append returns e followed by o (the CDI order: spec-wide edits, then the device's).
func (e ContainerEdits) Append(o ContainerEdits) ContainerEdits {
	return ContainerEdits{
		Env:         append(append([]string(nil), e.Env...), o.Env...),
		DeviceNodes: append(append([]DeviceNode(nil), e.DeviceNodes...), o.DeviceNodes...),
		Hooks:       append(append([]Hook(nil), e.Hooks...), o.Hooks...),
		Mounts:      append(append([]Mount(nil), e.Mounts...), o.Mounts...),
	}
}

// Parse decodes a spec, YAML or JSON (JSON is read by the YAML decoder), and checks what DetShare relies on.
func Parse(data []byte) (*Spec, error) {
	var s Spec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("parse CDI spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Load reads the spec at path.
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CDI spec: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Validate checks the fields DetShare relies on: a version, a vendor/class kind, named devices and absolute paths.
func (s *Spec) Validate() error {
	if s.Version == "" {
		return errors.New("CDI spec: cdiVersion is empty")
	}
	vendor, class, ok := strings.Cut(s.Kind, "/")
	if !ok || vendor == "" || class == "" {
		return fmt.Errorf("CDI spec: kind %q: want <vendor>/<class>, e.g. %s", s.Kind, NVIDIAKind)
	}
	if err := s.ContainerEdits.validate("spec-wide containerEdits"); err != nil {
		return err
	}
	for i, d := range s.Devices {
		if d.Name == "" {
			return fmt.Errorf("CDI spec %s: device %d has no name", s.Kind, i)
		}
		if err := d.ContainerEdits.validate("device " + d.Name); err != nil {
			return fmt.Errorf("CDI spec %s: %w", s.Kind, err)
		}
	}
	return nil
}

func (e ContainerEdits) validate(what string) error {
	for _, n := range e.DeviceNodes {
		if !filepath.IsAbs(n.Path) {
			return fmt.Errorf("%s: device node path %q must be absolute", what, n.Path)
		}
		if n.Type != "" && n.Type != "c" && n.Type != "b" && n.Type != "u" && n.Type != "p" {
			return fmt.Errorf("%s: device node %s type %q: allowed are c, b, u, p", what, n.Path, n.Type)
		}
	}
	for _, m := range e.Mounts {
		if !filepath.IsAbs(m.ContainerPath) {
			return fmt.Errorf("%s: mount containerPath %q must be absolute", what, m.ContainerPath)
		}
	}
	for _, h := range e.Hooks {
		if !filepath.IsAbs(h.Path) {
			return fmt.Errorf("%s: hook path %q must be absolute", what, h.Path)
		}
	}
	return nil
}

// Device returns the edits of device name: the spec-wide edits followed by the device's own.
func (s *Spec) Device(name string) (ContainerEdits, bool) {
	for _, d := range s.Devices {
		if d.Name == name {
			return s.ContainerEdits.Append(d.ContainerEdits), true
		}
	}
	return ContainerEdits{}, false
}

// Names lists the device names of s.
func (s *Spec) Names() []string {
	out := make([]string, len(s.Devices))
	for i, d := range s.Devices {
		out[i] = d.Name
	}
	return out
}

// FoundSpec is a spec and the file it came from.
type FoundSpec struct {
	Path string
	Spec *Spec
}

// FindSpecs reads every spec of kind in dirs (under root; "" or "/" is the host), in CDI order: directories in the
// order given, files by name. Unreadable or malformed files of other kinds are skipped; a malformed file whose kind
// cannot be told is skipped too (CDI registries do the same), but reported in the returned error list.
func FindSpecs(root string, dirs []string, kind string) ([]FoundSpec, []error) {
	var out []FoundSpec
	var bad []error
	for _, d := range dirs {
		ents, err := os.ReadDir(Join(root, d))
		if err != nil {
			continue
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			ext := filepath.Ext(e.Name())
			if !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				names = append(names, e.Name())
			}
		}
		sort.Strings(names)
		for _, n := range names {
			p := filepath.Join(Join(root, d), n)
			s, err := Load(p)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			if s.Kind == kind {
				out = append(out, FoundSpec{Path: p, Spec: s})
			}
		}
	}
	return out, bad
}

// Join puts an absolute host path under root ("" or "/" leaves it as it is).
func Join(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	return filepath.Join(root, p)
}
