package deviceplugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/kubeletdevices"
)

func twoGPUs() Inventory {
	return Inventory{GPUs: []GPU{{Index: 0, UUID: "GPU-aaaa", Groups: []uint32{8, 8}, MemGiB: 80},
		{Index: 1, UUID: "GPU-bbbb", Groups: []uint32{8, 8}, MemGiB: 80}}}
}

// writeCheckpoint writes kubelet's device-manager checkpoint as kubelet 1.34 does (Data.RegisteredDevices: the
// healthy devices of each resource).
func writeCheckpoint(t *testing.T, dir string, reg map[string][]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"Data": map[string]any{"PodDeviceEntries": nil, "RegisteredDevices": reg}, "Checksum": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, kubeletdevices.CheckpointFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A GPU whose UUID another resource advertises in kubelet's checkpoint (NVIDIA's device plugin: the UUID, or
// UUID::n when time-sliced) is claimed; DetShare's own resources and other devices are not claims.
func TestClaimsReadKubeletsCheckpoint(t *testing.T) {
	dir := t.TempDir()
	inv := twoGPUs()
	if c, err := Claims(dir, inv); err != nil || c != nil {
		t.Fatalf("no checkpoint: %v, %v; want no claim", c, err)
	}
	writeCheckpoint(t, dir, map[string][]string{ResourceShares: {"gpu0-sm-0", "GPU-aaaa"}, ResourceMemory: {"gpu1-mem-0"},
		"nvidia.com/gpu": {"GPU-bbbb::0", "GPU-bbbb::1"}, "example.com/nic": {"GPU-aaaaX", "eth0"}})
	c, err := Claims(dir, inv)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int][]string{1: {"nvidia.com/gpu"}}; !reflect.DeepEqual(c, want) {
		t.Errorf("claims %v, want %v", c, want)
	}
	writeCheckpoint(t, dir, map[string][]string{"nvidia.com/gpu": {"GPU-aaaa"}, "nvidia.com/mig-1g.10gb": {"GPU-aaaa"}})
	if c, _ := Claims(dir, inv); !reflect.DeepEqual(c, map[int][]string{0: {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}}) {
		t.Errorf("claims %v, want GPU 0 by both NVIDIA resources", c)
	}
	os.WriteFile(filepath.Join(dir, kubeletdevices.CheckpointFile), []byte("{"), 0o644)
	if _, err := Claims(dir, inv); err == nil || !strings.Contains(err.Error(), kubeletdevices.CheckpointFile) {
		t.Errorf("corrupt checkpoint: %v, want an error naming it", err)
	}
}

// The claimed GPU is unhealthy (ClaimHealth, merged with the table's health by Or) and the readiness file is gone
// while it is claimed, back when the other plugin stops advertising it.
func TestClaimedGPUIsNotServedAndNotReady(t *testing.T) {
	dir, ready := t.TempDir(), filepath.Join(t.TempDir(), "ready")
	inv := twoGPUs()
	mps := Health(func() map[int]string { return map[int]string{0: ReasonMPSFailed} })
	h := Readiness(ready, inv, mps.Or(ClaimHealth(dir, inv)))
	if got := h(); !reflect.DeepEqual(got, map[int]string{0: ReasonMPSFailed}) {
		t.Errorf("unclaimed: health %v, want only GPU 0's MPS failure", got)
	}
	if b, err := os.ReadFile(ready); err != nil || !strings.Contains(string(b), "gpu 1 GPU-bbbb served") {
		t.Errorf("unclaimed: readiness file %q, %v; want it naming the GPUs served", b, err)
	}
	writeCheckpoint(t, dir, map[string][]string{"nvidia.com/gpu": {"GPU-bbbb", "GPU-aaaa"}})
	if got := h(); !reflect.DeepEqual(got, map[int]string{0: ReasonMPSFailed, 1: ReasonClaimedElsewhere}) {
		t.Errorf("claimed: health %v, want GPU 0 mps-failed (first reason kept) and GPU 1 claimed", got)
	}
	if _, err := os.Stat(ready); !os.IsNotExist(err) {
		t.Errorf("claimed: readiness file still there (%v)", err)
	}
	writeCheckpoint(t, dir, map[string][]string{"nvidia.com/gpu": {}})
	if got := h(); !reflect.DeepEqual(got, map[int]string{0: ReasonMPSFailed}) {
		t.Errorf("released: health %v, want only GPU 0's MPS failure", got)
	}
	if _, err := os.Stat(ready); err != nil {
		t.Errorf("released: no readiness file: %v", err)
	}
}

// --gpus keeps the GPUs named by index or UUID; a name no GPU has is refused naming the GPUs found.
func TestSelectGPUs(t *testing.T) {
	inv := twoGPUs()
	for spec, want := range map[string][]int{"all": {0, 1}, "": {0, 1}, "1": {1}, "GPU-aaaa": {0}, "1, GPU-aaaa,1": {1, 0}} {
		got, err := inv.Select(spec)
		if err != nil {
			t.Errorf("--gpus=%q: %v", spec, err)
			continue
		}
		var idx []int
		for _, g := range got.GPUs {
			idx = append(idx, g.Index)
		}
		if !reflect.DeepEqual(idx, want) {
			t.Errorf("--gpus=%q: GPUs %v, want %v", spec, idx, want)
		}
	}
	for _, spec := range []string{"2", "GPU-cccc", "0,,1"} {
		_, err := inv.Select(spec)
		if err == nil || !strings.Contains(err.Error(), "--gpus") || !strings.Contains(err.Error(), "1 (GPU-bbbb)") {
			t.Errorf("--gpus=%q: %v, want an error naming the flag and the GPUs found", spec, err)
		}
	}
}
