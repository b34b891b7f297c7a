// Package deviceplugin is DetShare's Kubernetes device plugin (k8s.io/kubelet device plugin API v1beta1). It
// advertises every GPU of the node as countable extended resources, so the Kubernetes scheduler can place several
// pods on one GPU without overcommitting it:
//
//   - detshare.io/gpu: one unit per SM group of the GPU's split (an H100 has 15 groups of 8 SMs). A container asking
//     for k units becomes a burstable tenant guaranteed k groups, exactly what DetShare's own admission counts.
//   - detshare.io/gpu-memory: one unit per GiB of GPU memory. A container asking for m units gets a memory quota of
//     m GiB (a best-effort tenant when it asks for no detshare.io/gpu).
//
// Allocate answers with container annotations (detshare.io/sms, detshare.io/memory, detshare.io/tier,
// detshare.io/gpu) that containerd passes to the DetShare runtime handler (its container_annotations list), where
// the shim and the hook turn them into the tenant's quota like any other annotation. Annotations outrank the
// container's own DETSHARE_* environment, so a pod cannot widen what the scheduler accounted for.
package deviceplugin

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// The extended resources.
const (
	ResourceShares = "detshare.io/gpu"
	ResourceMemory = "detshare.io/gpu-memory"
)

const gib = 1 << 30

// GPU is one GPU as the plugin advertises it.
type GPU struct {
	Index  int
	UUID   string
	Groups []uint32 // SMs in each SM group, in the order the driver assigns them
	MemGiB int
}

// Inventory is the node's GPUs.
type Inventory struct{ GPUs []GPU }

// NewInventory builds the inventory from the table's GPU entries (published split when there is one, an estimate
// otherwise).
func NewInventory(gpus []table.GPUState) Inventory {
	var inv Inventory
	for _, g := range gpus {
		split := g.Split
		if len(split.Groups) == 0 {
			split = table.EstimateSplit(g.SMCount, table.DefaultSplitMinSize)
		}
		inv.GPUs = append(inv.GPUs, GPU{Index: g.Index, UUID: g.UUID, Groups: append([]uint32(nil), split.Groups...),
			MemGiB: int(g.MemTotal / gib)})
	}
	return inv
}

// FromInfo builds the inventory from discovery results, with the estimated split.
func FromInfo(infos []table.GPUInfo) Inventory {
	states := make([]table.GPUState, len(infos))
	for i, g := range infos {
		states[i] = table.GPUState{GPUInfo: g}
	}
	return NewInventory(states)
}

// Discover prefers the scheduler's table in runDir (the split the driver published); without one it discovers the
// GPUs with discover (the backend the plugin's main chose) and estimates the split as the scheduler would.
func Discover(runDir string, discover func() ([]table.GPUInfo, error)) (Inventory, error) {
	if tb, err := table.OpenReadOnly(runDir); err == nil {
		defer tb.Close()
		if gpus := tb.GPUs(); len(gpus) > 0 {
			return NewInventory(gpus), nil
		}
	}
	infos, err := discover()
	if err != nil {
		return Inventory{}, fmt.Errorf("discover GPUs: %w", err)
	}
	return FromInfo(infos), nil
}

// deviceID names unit n of resource kind ("sm" or "mem") on GPU gpu: "gpu<index>-<kind>-<n>".
func deviceID(gpu int, kind string, n int) string { return fmt.Sprintf("gpu%d-%s-%d", gpu, kind, n) }

// parseDeviceID is deviceID's inverse; it refuses anything else (kubelet only sends IDs we advertised, but a
// stale checkpoint from another plugin version must not be misread).
func parseDeviceID(id string) (gpu int, kind string, n int, err error) {
	parts := strings.Split(id, "-")
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "gpu") || (parts[1] != "sm" && parts[1] != "mem") {
		return 0, "", 0, fmt.Errorf("device ID %q: want gpu<index>-sm-<n> or gpu<index>-mem-<n>", id)
	}
	if gpu, err = strconv.Atoi(strings.TrimPrefix(parts[0], "gpu")); err != nil || gpu < 0 {
		return 0, "", 0, fmt.Errorf("device ID %q: bad GPU index", id)
	}
	if n, err = strconv.Atoi(parts[2]); err != nil || n < 0 {
		return 0, "", 0, fmt.Errorf("device ID %q: bad unit number", id)
	}
	return gpu, parts[1], n, nil
}

func kindOf(resource string) (string, error) {
	switch resource {
	case ResourceShares:
		return "sm", nil
	case ResourceMemory:
		return "mem", nil
	}
	return "", fmt.Errorf("unknown resource %q: allowed are %s and %s", resource, ResourceShares, ResourceMemory)
}

// Devices lists the device IDs of resource, GPU by GPU.
func (inv Inventory) Devices(resource string) ([]string, error) {
	kind, err := kindOf(resource)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, g := range inv.GPUs {
		n := g.MemGiB
		if kind == "sm" {
			n = len(g.Groups)
		}
		for i := 0; i < n; i++ {
			ids = append(ids, deviceID(g.Index, kind, i))
		}
	}
	return ids, nil
}

func (inv Inventory) gpu(index int) (GPU, bool) {
	for _, g := range inv.GPUs {
		if g.Index == index {
			return g, true
		}
	}
	return GPU{}, false
}

// Allocation turns the device IDs kubelet allocated to one container for resource into the quota annotations.
// All units must be on one GPU: a tenant runs on one GPU.
func (inv Inventory) Allocation(resource string, ids []string) (map[string]string, error) {
	kind, err := kindOf(resource)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%s: no devices allocated", resource)
	}
	gpuIndex := -1
	seen := map[string]bool{}
	for _, id := range ids {
		g, k, n, err := parseDeviceID(id)
		if err != nil {
			return nil, err
		}
		if k != kind {
			return nil, fmt.Errorf("device ID %q is not a %s unit", id, resource)
		}
		gpu, ok := inv.gpu(g)
		limit := gpu.MemGiB
		if kind == "sm" {
			limit = len(gpu.Groups)
		}
		if !ok || n >= limit {
			return nil, fmt.Errorf("device ID %q: no such unit on this node", id)
		}
		if gpuIndex >= 0 && g != gpuIndex {
			return nil, fmt.Errorf("%s: units on GPUs %d and %d; one container runs on one GPU (ask for at most one GPU's worth)", resource, gpuIndex, g)
		}
		if seen[id] {
			return nil, fmt.Errorf("device ID %q allocated twice", id)
		}
		seen[id] = true
		gpuIndex = g
	}
	gpu, _ := inv.gpu(gpuIndex)
	ann := map[string]string{quota.FieldGPU.AnnotationKey(): strconv.Itoa(gpuIndex)}
	if kind == "mem" {
		ann[quota.FieldMemory.AnnotationKey()] = fmt.Sprintf("%dGi", len(ids))
	} else {
		// DetShare rounds an SM request up to whole groups taken in order; asking for the SMs of the first k
		// groups is granted exactly k groups, the k units Kubernetes accounted for.
		var sms uint32
		for _, s := range gpu.Groups[:len(ids)] {
			sms += s
		}
		ann[quota.FieldSMs.AnnotationKey()] = strconv.FormatUint(uint64(sms), 10)
		ann[quota.FieldTier.AnnotationKey()] = table.TierBurstable.String()
	}
	for k, v := range ann { // what we hand out must parse as a quota; one parser, cgroupgpu/quota
		q := quota.Default()
		if err := q.Set(quota.Field(strings.TrimPrefix(k, quota.AnnotationPrefix)), v, quota.SourceAnnotation); err != nil {
			return nil, fmt.Errorf("allocation for %v: %w", ids, err)
		}
	}
	return ann, nil
}

// Preferred picks size units of resource from available, all on the GPU with the most available units (lowest
// index on ties), lowest unit numbers first, keeping mustInclude.
func (inv Inventory) Preferred(resource string, available, mustInclude []string, size int) ([]string, error) {
	kind, err := kindOf(resource)
	if err != nil {
		return nil, err
	}
	byGPU := map[int][]string{}
	for _, id := range available {
		g, k, _, err := parseDeviceID(id)
		if err != nil || k != kind {
			continue
		}
		byGPU[g] = append(byGPU[g], id)
	}
	if len(mustInclude) > 0 {
		g, _, _, err := parseDeviceID(mustInclude[0])
		if err != nil {
			return nil, err
		}
		out := append([]string(nil), mustInclude...)
		in := map[string]bool{}
		for _, id := range mustInclude {
			in[id] = true
		}
		for _, id := range sortUnits(byGPU[g]) {
			if len(out) >= size {
				break
			}
			if !in[id] {
				out = append(out, id)
			}
		}
		return out, nil
	}
	best := -1
	for g, ids := range byGPU {
		if best < 0 || len(ids) > len(byGPU[best]) || (len(ids) == len(byGPU[best]) && g < best) {
			best = g
		}
	}
	if best < 0 {
		return nil, nil
	}
	ids := sortUnits(byGPU[best])
	if len(ids) > size {
		ids = ids[:size]
	}
	return ids, nil
}

func sortUnits(ids []string) []string {
	out := append([]string(nil), ids...)
	sort.Slice(out, func(i, j int) bool {
		_, _, a, _ := parseDeviceID(out[i])
		_, _, b, _ := parseDeviceID(out[j])
		return a < b
	})
	return out
}
