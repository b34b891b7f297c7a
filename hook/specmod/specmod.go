// Package specmod is DetShare's one implementation of OCI spec (config.json) mutation, used by the containerd
// shim, the runc wrapper and the OCI hook. It edits the spec as generic JSON, so fields this package (or the
// runtime-spec version it was built with) does not know survive a round trip untouched, and it writes the file
// atomically so runc never reads a half-written spec.
//
// Edits are Modifiers composed with Chain; every modifier is idempotent, so applying the same edit twice (a retried
// create, a hook that runs after the shim already edited the spec) leaves one copy.
package specmod

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/quote"
)

// Spec is an OCI runtime spec held as generic JSON.
type Spec struct {
	m map[string]any
}

// Parse decodes a spec. Numbers keep their exact text (json.Number), so large IDs and masks are not rounded.
func Parse(data []byte) (*Spec, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("parse OCI spec: %w", err)
	}
	if m == nil {
		return nil, errors.New("parse OCI spec: document is null, want a JSON object")
	}
	return &Spec{m: m}, nil
}

// Load reads and parses the spec at path (a bundle's config.json).
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Bytes encodes the spec.
func (s *Spec) Bytes() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s.m); err != nil {
		return nil, fmt.Errorf("encode OCI spec: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteFile writes the spec to path atomically: a temporary file in the same directory, then rename, so a reader
// sees the old or the new spec, never a partial one. No fsync: a bundle does not outlive a reboot, and the sync
// would cost container start latency. The file keeps the mode of the file it replaces (0644 when new).
func (s *Spec) WriteFile(path string) error {
	data, err := s.Bytes()
	if err != nil {
		return err
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	if err := atomicfile.Write(path, data, mode, false); err != nil {
		return fmt.Errorf("OCI spec: %w", err)
	}
	return nil
}

// Modifier is one edit of a spec.
type Modifier interface {
	Modify(s *Spec) error
}

// ModifierFunc adapts a function to Modifier.
type ModifierFunc func(s *Spec) error

// Modify implements Modifier.
func (f ModifierFunc) Modify(s *Spec) error { return f(s) }

// Chain applies modifiers in order and stops at the first error.
func Chain(mods ...Modifier) Modifier {
	return ModifierFunc(func(s *Spec) error {
		for _, m := range mods {
			if m == nil {
				continue
			}
			if err := m.Modify(s); err != nil {
				return err
			}
		}
		return nil
	})
}

// ModifyFile loads the spec at path, applies mods and writes it back atomically. On error the file is unchanged.
func ModifyFile(path string, mods ...Modifier) error {
	s, err := Load(path)
	if err != nil {
		return err
	}
	if err := Chain(mods...).Modify(s); err != nil {
		return fmt.Errorf("modify OCI spec %s: %w", path, err)
	}
	return s.WriteFile(path)
}

// object returns the JSON object at key of parent, creating it when absent. A non-object value is an error
// (a malformed spec must not be silently rewritten).
func object(parent map[string]any, key string) (map[string]any, error) {
	v, ok := parent[key]
	if !ok || v == nil {
		m := map[string]any{}
		parent[key] = m
		return m, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("spec field %q is %T, want a JSON object", key, v)
	}
	return m, nil
}

func array(parent map[string]any, key string) ([]any, error) {
	v, ok := parent[key]
	if !ok || v == nil {
		return nil, nil
	}
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("spec field %q is %T, want a JSON array", key, v)
	}
	return a, nil
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

// Env returns process.env (KEY=VALUE).
func (s *Spec) Env() []string {
	p, _ := s.m["process"].(map[string]any)
	if p == nil {
		return nil
	}
	a, _ := p["env"].([]any)
	out := make([]string, 0, len(a))
	for _, v := range a {
		if e, ok := v.(string); ok {
			out = append(out, e)
		}
	}
	return out
}

// Annotations returns a copy of the spec's annotations.
func (s *Spec) Annotations() map[string]string {
	out := map[string]string{}
	a, _ := s.m["annotations"].(map[string]any)
	for k, v := range a {
		if sv, ok := v.(string); ok {
			out[k] = sv
		}
	}
	return out
}

// RootPath returns root.path (relative to the bundle or absolute).
func (s *Spec) RootPath() string {
	r, _ := s.m["root"].(map[string]any)
	if r == nil {
		return ""
	}
	return str(r, "path")
}

// CgroupsPath returns linux.cgroupsPath.
func (s *Spec) CgroupsPath() string {
	l, _ := s.m["linux"].(map[string]any)
	if l == nil {
		return ""
	}
	return str(l, "cgroupsPath")
}

// Mount is an OCI mount.
type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

// Mounts returns the spec's mounts (known fields only).
func (s *Spec) Mounts() []Mount {
	a, _ := s.m["mounts"].([]any)
	var out []Mount
	for _, v := range a {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		mt := Mount{Destination: str(m, "destination"), Type: str(m, "type"), Source: str(m, "source")}
		if opts, ok := m["options"].([]any); ok {
			for _, o := range opts {
				if os, ok := o.(string); ok {
					mt.Options = append(mt.Options, os)
				}
			}
		}
		out = append(out, mt)
	}
	return out
}

// BindMount returns a bind mount of source at destination, read-only unless rw.
func BindMount(source, destination string, rw bool) Mount {
	mode := "ro"
	if rw {
		mode = "rw"
	}
	return Mount{Destination: destination, Type: "bind", Source: source,
		Options: []string{"rbind", "rprivate", "nosuid", "nodev", mode}}
}

// AddMounts appends mounts; a mount whose destination is already mounted by the spec replaces that entry (the
// container must see DetShare's file, not one an earlier edit put there).
func AddMounts(mounts ...Mount) Modifier {
	return ModifierFunc(func(s *Spec) error {
		for _, mt := range mounts {
			if !filepath.IsAbs(mt.Destination) {
				return fmt.Errorf("mount destination %s: must be an absolute path", quote.Q(mt.Destination))
			}
		}
		a, err := array(s.m, "mounts")
		if err != nil {
			return err
		}
		for _, mt := range mounts {
			entry := map[string]any{"destination": mt.Destination}
			if mt.Type != "" {
				entry["type"] = mt.Type
			}
			if mt.Source != "" {
				entry["source"] = mt.Source
			}
			if len(mt.Options) > 0 {
				opts := make([]any, len(mt.Options))
				for i, o := range mt.Options {
					opts[i] = o
				}
				entry["options"] = opts
			}
			replaced := false
			kept := a[:0]
			for _, v := range a {
				if m, ok := v.(map[string]any); ok && filepath.Clean(str(m, "destination")) == filepath.Clean(mt.Destination) {
					if replaced {
						continue // a later mount at the same place would hide ours
					}
					v, replaced = entry, true
				}
				kept = append(kept, v)
			}
			a = kept
			if !replaced {
				a = append(a, entry)
			}
		}
		s.m["mounts"] = a
		return nil
	})
}

// Hook is an OCI hook.
type Hook struct {
	Path    string   `json:"path"`
	Args    []string `json:"args,omitempty"`
	Env     []string `json:"env,omitempty"`
	Timeout int      `json:"timeout,omitempty"`
}

// Stages an OCI hook can run at (runtime-spec config.md "POSIX-platform Hooks").
var Stages = []string{"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}

// Hooks returns the hooks of one stage (known fields only).
func (s *Spec) Hooks(stage string) []Hook {
	hs, _ := s.m["hooks"].(map[string]any)
	a, _ := hs[stage].([]any)
	var out []Hook
	for _, v := range a {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		h := Hook{Path: str(m, "path")}
		for _, key := range []string{"args", "env"} {
			l, _ := m[key].([]any)
			for _, x := range l {
				if xs, ok := x.(string); ok {
					if key == "args" {
						h.Args = append(h.Args, xs)
					} else {
						h.Env = append(h.Env, xs)
					}
				}
			}
		}
		if n, ok := m["timeout"].(json.Number); ok {
			t, _ := n.Int64()
			h.Timeout = int(t)
		}
		out = append(out, h)
	}
	return out
}

// AddHook appends h to stage unless a hook with the same path and arguments is already there.
func AddHook(stage string, h Hook) Modifier {
	return ModifierFunc(func(s *Spec) error {
		if !validStage(stage) {
			return fmt.Errorf("hook stage %q: allowed stages are %s", stage, strings.Join(Stages, ", "))
		}
		if !filepath.IsAbs(h.Path) {
			return fmt.Errorf("hook path %q: must be an absolute path", h.Path)
		}
		for _, old := range s.Hooks(stage) {
			if old.Path == h.Path && strings.Join(old.Args, "\x00") == strings.Join(h.Args, "\x00") {
				return nil
			}
		}
		hs, err := object(s.m, "hooks")
		if err != nil {
			return err
		}
		a, err := array(hs, stage)
		if err != nil {
			return err
		}
		entry := map[string]any{"path": h.Path}
		if len(h.Args) > 0 {
			entry["args"] = toAny(h.Args)
		}
		if len(h.Env) > 0 {
			entry["env"] = toAny(h.Env)
		}
		if h.Timeout > 0 {
			entry["timeout"] = json.Number(fmt.Sprint(h.Timeout))
		}
		hs[stage] = append(a, entry)
		return nil
	})
}

func validStage(stage string) bool {
	for _, s := range Stages {
		if s == stage {
			return true
		}
	}
	return false
}

func toAny(l []string) []any {
	out := make([]any, len(l))
	for i, v := range l {
		out[i] = v
	}
	return out
}

// SetAnnotations sets annotations (bookkeeping: what DetShare did to this container).
func SetAnnotations(kv map[string]string) Modifier {
	return ModifierFunc(func(s *Spec) error {
		a, err := object(s.m, "annotations")
		if err != nil {
			return err
		}
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			a[k] = kv[k]
		}
		return nil
	})
}

// SetEnv sets KEY=VALUE in process.env, replacing an existing KEY.
func SetEnv(key, value string) Modifier {
	return ModifierFunc(func(s *Spec) error {
		if key == "" || strings.Contains(key, "=") {
			return fmt.Errorf("env key %s: must be non-empty and contain no '='", quote.Q(key))
		}
		p, err := object(s.m, "process")
		if err != nil {
			return err
		}
		a, err := array(p, "env")
		if err != nil {
			return err
		}
		kv := key + "=" + value
		for i, v := range a {
			if e, ok := v.(string); ok && strings.HasPrefix(e, key+"=") {
				a[i] = kv
				p["env"] = a
				return nil
			}
		}
		p["env"] = append(a, kv)
		return nil
	})
}
