// Package kubeletdevices reads what kubelet's device manager records on the node: the healthy devices every device
// plugin registered with it advertises (its checkpoint, kubelet_internal_checkpoint in its device-plugin directory),
// and the DRA drivers registered with it (plugins_registry). DetShare's device plugin reads it to leave alone a GPU
// another plugin (NVIDIA's) advertises, `detshare doctor` to report the node's Kubernetes platform.
package kubeletdevices

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// CheckpointFile is kubelet's device-manager checkpoint, in its device-plugin directory.
const CheckpointFile = "kubelet_internal_checkpoint"

// DefaultDevicePluginDir is kubelet's device-plugin directory (fixed, whatever its --root-dir); DefaultPluginsRegistry
// the directory where kubelet plugins (DRA drivers, CSI) register.
const (
	DefaultDevicePluginDir = "/var/lib/kubelet/device-plugins"
	DefaultPluginsRegistry = "/var/lib/kubelet/plugins_registry"
)

// Registered reads the checkpoint in dir: each resource's healthy devices as kubelet last recorded them (kubelet
// 1.34–1.36: Data.RegisteredDevices). No checkpoint (no kubelet, or none yet) is nil and no error.
func Registered(dir string) (map[string][]string, error) {
	path := filepath.Join(dir, CheckpointFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read kubelet's device checkpoint: %w", err)
	}
	var cp struct {
		Data struct {
			RegisteredDevices map[string][]string
		}
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("kubelet's device checkpoint %s: %w", path, err)
	}
	return cp.Data.RegisteredDevices, nil
}

// NamesGPU tells whether a device ID names the GPU with uuid as NVIDIA's device plugin names it: the UUID itself,
// or UUID::<n> for one of its time-sliced replicas.
func NamesGPU(id, uuid string) bool {
	return uuid != "" && (id == uuid || strings.HasPrefix(id, uuid+"::"))
}

// Claimants are the resources in reg, other than those for which skip is true, with a device naming the GPU uuid;
// sorted.
func Claimants(reg map[string][]string, uuid string, skip func(resource string) bool) []string {
	var out []string
	for res, ids := range reg {
		if skip != nil && skip(res) {
			continue
		}
		if slices.ContainsFunc(ids, func(id string) bool { return NamesGPU(id, uuid) }) {
			out = append(out, res)
		}
	}
	slices.Sort(out)
	return out
}

// DRADrivers lists the DRA drivers (and other kubelet plugins) registered in kubelet's plugins registry dir: the
// names of its <name>-reg.sock sockets, sorted. A missing directory is none.
func DRADrivers(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read kubelet's plugin registry: %w", err)
	}
	var out []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), "-reg.sock"); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// DRAPlatform is what DetShare's DRA plugin found of the cluster, in PlatformFile of its directory under kubelet's
// plugins directory (<kubelet-dir>/plugins/gpu.detshare.io/platform.json), for `detshare doctor` on the node, which
// has no API access: the apiserver's version and the DRA features it serves (the plugin's dry-run probe).
type DRAPlatform struct {
	Kubernetes string   `json:"kubernetes"` // the apiserver's gitVersion
	Served     []string `json:"served"`     // consumableCapacity, partitionableDevices, deviceTaints
	Published  []int    `json:"published"`  // the GPUs published
	Withheld   []string `json:"withheld"`   // "GPU <i> (<uuid>): <reason>" for each GPU not published or tainted
}

// PlatformFile is DRAPlatform's file name.
const PlatformFile = "platform.json"

// ReadDRAPlatform reads the DRA plugin's platform file from its directory pluginDir; none is nil and no error.
func ReadDRAPlatform(pluginDir string) (*DRAPlatform, error) {
	data, err := os.ReadFile(filepath.Join(pluginDir, PlatformFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the DRA plugin's platform file: %w", err)
	}
	var p DRAPlatform
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("the DRA plugin's platform file %s: %w", filepath.Join(pluginDir, PlatformFile), err)
	}
	return &p, nil
}
