// Package deviceplugin is DetShare's Kubernetes device plugin (k8s.io/kubelet device plugin API v1beta1). It
// advertises every GPU of the node as countable extended resources, so the Kubernetes scheduler can place several
// pods on one GPU without overcommitting it:
//
//   - detshare.io/gpu: one unit per SM group of the GPU's split (an H100 has 15 groups of 8 SMs). A container asking
//     for k units becomes a burstable tenant guaranteed k groups, exactly what DetShare's own admission counts.
//   - detshare.io/gpu-memory: one unit per GiB of GPU memory. A container asking for m units gets a memory quota of
//     m GiB (a best-effort tenant when it asks for no detshare.io/gpu).
//
// Allocate answers with the allocation as the container's ceiling (cgroupgpu/quota Ceiling): container annotations
// alloc.detshare.io/{tier,sms,memory,gpu,weight,role} that containerd passes to the DetShare runtime handler (its
// container_annotations list; a pod cannot set container annotations, and pod_annotations must never pass
// alloc.detshare.io/*). The shim and the hook make the ceiling the tenant's quota; the pod's own annotations, labels
// and DETSHARE_* environment may lower it, never raise it, so a pod cannot widen what the scheduler accounted for.
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
	Index   int
	UUID    string
	Product string   // the driver's product name (NVML)
	Groups  []uint32 // SMs in each SM group, in the order the driver assigns them
	MemGiB  int
}

// Inventory is the node's GPUs and the host's limits on what a pod may ask beyond its allocation.
type Inventory struct {
	GPUs   []GPU
	Limits Limits
}

// Limits bound what a pod may set itself that no resource accounts for: its weight and its TPOT-First role. They go
// into every allocation's ceiling (cgroupgpu/quota Ceiling).
type Limits struct {
	MaxWeight uint32       // 0: 1
	Roles     []table.Role // nil: none only
}

// ParseLimits checks the plugins' --max-weight and --allowed-roles.
func ParseLimits(maxWeight uint, roles string) (Limits, error) {
	w, err := quota.ParseWeight(strconv.FormatUint(uint64(maxWeight), 10))
	if err != nil {
		return Limits{}, fmt.Errorf("--max-weight=%d: %w", maxWeight, err)
	}
	rs, err := quota.ParseRoles(roles)
	if err != nil {
		return Limits{}, fmt.Errorf("--allowed-roles=%q: %w", roles, err)
	}
	return Limits{MaxWeight: w, Roles: rs}, nil
}

// Ceiling is the ceiling of an allocation on GPU gpu under the host's limits: tier, SMs and memory are the caller's.
func (l Limits) Ceiling(gpu int) quota.Ceiling {
	c := quota.NoCeiling()
	c.GPU = quota.GPUSelector{Index: gpu}
	if l.MaxWeight > 0 {
		c.MaxWeight = l.MaxWeight
	}
	if len(l.Roles) > 0 {
		c.Roles = l.Roles
	}
	return c
}

// NewInventory builds the inventory from the table's GPU entries (published split when there is one, an estimate
// otherwise).
func NewInventory(gpus []table.GPUState) Inventory {
	var inv Inventory
	for _, g := range gpus {
		split := g.Split
		if len(split.Groups) == 0 {
			split = table.EstimateSplit(g.SMCount, table.DefaultSplitMinSize)
		}
		inv.GPUs = append(inv.GPUs, GPU{Index: g.Index, UUID: g.UUID, Product: g.Name, Groups: append([]uint32(nil), split.Groups...),
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
	// The allocation is the container's ceiling (cgroupgpu/quota Ceiling): what it asks itself may lower it, never
	// raise it. Each resource sets only its own fields, since kubelet merges the two resources' annotations: a
	// container with no detshare.io/gpu has no SMs and tier best-effort, one with no detshare.io/gpu-memory is
	// refused (its memory would be unaccounted).
	gpu, _ := inv.gpu(gpuIndex)
	c := inv.Limits.Ceiling(gpuIndex)
	fields := []quota.Field{quota.FieldGPU, quota.FieldWeight, quota.FieldRole}
	if kind == "mem" {
		c.Memory = uint64(len(ids)) * gib
		fields = append(fields, quota.FieldMemory)
	} else {
		// DetShare rounds an SM request up to whole groups taken in order; the SMs of the first k groups are
		// granted exactly k groups, the k units Kubernetes accounted for.
		for _, s := range gpu.Groups[:len(ids)] {
			c.SMs += s
		}
		c.Tier = table.TierBurstable
		fields = append(fields, quota.FieldTier, quota.FieldSMs)
	}
	return c.Annotations(fields...), nil
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
