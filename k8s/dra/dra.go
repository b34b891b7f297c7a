// Package dra is DetShare's DRA (dynamic resource allocation, resource.k8s.io/v1) kubelet plugin. It publishes one
// ResourceSlice pool per GPU whose devices are the GPU's SM groups (capacity: their SMs; attributes: GPU index,
// UUID, memory), so a ResourceClaim asking for k devices of the DeviceClass gpu.detshare.io gets k groups of one
// GPU. An opaque configuration on the claim or the class, DetShareConfig{tier, sms, memory, sloP99}, refines the
// quota. Preparing a claim writes a CDI spec whose container edits give the container the claim's GPU (its device
// nodes, the driver's libraries and hooks: cgroupgpu/cdi, NVIDIA's spec when there is one) and set the tenant's
// DETSHARE_* quota keys; the runtime applies it (containerd enable_cdi) and DetShare's shim and hook turn those keys
// into the tenant's quota.
package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/gpufacts"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/k8s/deviceplugin"
)

// DriverName is the DRA driver's name and the DeviceClass users ask for.
const DriverName = "gpu.detshare.io"

// CDIKind is the CDI kind of the devices Prepare hands out: detshare.io/gpu=<claim UID>.
const CDIKind = "detshare.io/gpu"

// Config is the opaque configuration a claim (or its class) may carry, in parameters:
//
//	{"apiVersion": "detshare.io/v1alpha1", "kind": "DetShareConfig", "tier": "latency-critical", "sms": "50%",
//	 "memory": "8Gi", "sloP99": "20ms"}
//
// Empty fields take their defaults: tier burstable, the SMs of the allocated groups, the groups' share of the GPU's
// memory. A class's config bounds its claims': the tier and memory are the lower of the two.
type Config struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Tier       string `json:"tier,omitempty"`
	SMs        string `json:"sms,omitempty"`
	Memory     string `json:"memory,omitempty"`
	SLOP99     string `json:"sloP99,omitempty"`
}

// ConfigKind and ConfigAPIVersion identify Config.
const (
	ConfigKind       = "DetShareConfig"
	ConfigAPIVersion = "detshare.io/v1alpha1"
)

// TaintKey is the device taint the driver puts on the devices of an unhealthy GPU (value: the reason, e.g.
// mps-failed, xid-79), with effect NoSchedule (the scheduler allocates them to no new claim until the GPU recovers)
// or, where configured (SliceOptions.TaintEffect), NoExecute (the pods using them are evicted too).
const TaintKey = DriverName + "/unhealthy"

// SliceOptions say how Slices describes the GPUs: what the apiserver serves (Probe decides it).
type SliceOptions struct {
	// Node is the node's name, which prefixes its pools' names (PoolName).
	Node string
	// Taints: the devices of an unhealthy GPU carry TaintKey (device taints: resource.k8s.io/v1 Device.Taints,
	// feature gate DRADeviceTaints, beta and on by default in Kubernetes 1.36).
	Taints bool
	// Consumable: one device per GPU, gpu<i>, that many claims share (allowMultipleAllocations) by consuming its
	// capacity "sms" (min and step one SM group, max the GPU's guaranteed SMs) and "memory" (step 1 MiB): consumable
	// capacity, KEP-5075, feature gate DRAConsumableCapacity (beta, on by default in 1.36). Off: one device per SM
	// group, gpu<i>-sm-<n>, with capacity "sms", memory in the DetShareConfig (Kubernetes 1.34).
	Consumable bool
	// Partitionable: with Consumable, each GPU also has a device gpu<i>-whole (the GPU for one claim), and both
	// devices consume the GPU's whole counter set (partitionable devices, KEP-4815, DRAPartitionableDevices, beta
	// and on by default in 1.36), so a whole-GPU claim and SM claims exclude each other: the shared device consumes
	// its counters once, when its first claim is allocated, and gives them back when its last one goes.
	Partitionable bool
	// TaintEffect is the effect of TaintKey ("": NoSchedule): NoSchedule keeps new claims off an unhealthy GPU,
	// NoExecute also evicts the pods whose claims use it (the controller-manager's device-taint eviction).
	TaintEffect resourceapi.DeviceTaintEffect
	// Facts are NVML's facts of the driver and the GPUs (the binary reads them: sched/gpuinfo.Facts), published as
	// attributes; nil: none.
	Facts *gpufacts.Driver
}

// Device attributes (in the driver's domain, gpu.detshare.io/<name> in CEL: device.attributes["gpu.detshare.io"].name).
const (
	AttrGPU          = "gpu"          // int: the GPU's index on the node
	AttrUUID         = "uuid"         // string
	AttrProduct      = "product"      // string: the driver's product name
	AttrMemory       = "memory"       // int: the GPU's memory in bytes
	AttrSMGroupSize  = "smGroupSize"  // int: SMs per group (sms consumes whole groups)
	AttrSMGroups     = "smGroups"     // int: groups on the GPU
	AttrMPSAvailable = "mpsAvailable" // bool: the scheduler does not record the GPU's MPS as failed
	AttrWhole        = "wholeGPU"     // bool: the device is the whole GPU for one claim (gpu<i>-whole)
	// From NVML (absent where the plugin cannot reach it): DeviceClass selectors test them with
	// "name" in device.attributes["gpu.detshare.io"] first.
	AttrArchitecture      = "architecture"      // string: lower case, e.g. hopper, ampere, blackwell
	AttrComputeCapability = "computeCapability" // version: e.g. 9.0.0
	AttrDriverVersion     = "driverVersion"     // version: the driver's, e.g. 580.95.5 (580.95.05)
	AttrCUDADriverVersion = "cudaDriverVersion" // version: the CUDA version the driver supports, e.g. 13.0.0
)

// factAttrs are GPU index's attributes from NVML's facts.
func factAttrs(f *gpufacts.Driver, index int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	if f == nil {
		return out
	}
	if v, ok := semver(f.Version); ok {
		out[AttrDriverVersion] = resourceapi.DeviceAttribute{VersionValue: &v}
	}
	if f.CUDAVersion > 0 {
		v := fmt.Sprintf("%d.%d.0", f.CUDAVersion/1000, f.CUDAVersion%1000/10)
		out[AttrCUDADriverVersion] = resourceapi.DeviceAttribute{VersionValue: &v}
	}
	g, ok := f.GPUs[index]
	if !ok {
		return out
	}
	if g.Architecture != "" {
		a := g.Architecture
		out[AttrArchitecture] = resourceapi.DeviceAttribute{StringValue: &a}
	}
	if g.CCMajor >= 0 && g.CCMinor >= 0 {
		v := fmt.Sprintf("%d.%d.0", g.CCMajor, g.CCMinor)
		out[AttrComputeCapability] = resourceapi.DeviceAttribute{VersionValue: &v}
	}
	return out
}

// semver writes a driver version (580.95.05, 535.104.12, 580.00-simgpu) as a semantic version (580.95.5,
// 535.104.12, 580.0.0-simgpu): numbers without leading zeros, three of them, a suffix after "-" kept as the
// pre-release when it is alphanumeric.
func semver(v string) (string, bool) {
	core, pre, _ := strings.Cut(v, "-")
	parts := strings.Split(core, ".")
	if core == "" || len(parts) > 3 {
		return "", false
	}
	nums := []string{"0", "0", "0"}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return "", false
		}
		nums[i] = strconv.FormatUint(n, 10)
	}
	out := strings.Join(nums, ".")
	if pre != "" {
		for _, r := range pre {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				return "", false
			}
		}
		out += "-" + pre
	}
	return out, true
}

// Slices describes the node's GPUs as one pool per GPU; the GPUs in unhealthy (index → reason) are tainted when
// opts.Taints, except those another driver or plugin claims (reason deviceplugin.ReasonClaimedElsewhere), which are
// not published at all. With opts.Partitionable the pool's first slice holds the GPU's counter set (an apiserver
// takes shared counters and devices in separate slices).
func Slices(inv deviceplugin.Inventory, unhealthy map[int]string, opts SliceOptions) resourceslice.DriverResources {
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	effect := opts.TaintEffect
	if effect == "" {
		effect = resourceapi.DeviceTaintEffectNoSchedule
	}
	for _, g := range inv.GPUs {
		var taint []resourceapi.DeviceTaint
		why := unhealthy[g.Index]
		if why == deviceplugin.ReasonClaimedElsewhere {
			continue
		}
		if why != "" && opts.Taints {
			taint = []resourceapi.DeviceTaint{{Key: TaintKey, Value: why, Effect: effect}}
		}
		idx, memBytes := int64(g.Index), int64(g.MemGiB)<<30
		uuid, product, mps := g.UUID, g.Product, why != deviceplugin.ReasonMPSFailed
		attrs := func() map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
			// Every device carries wholeGPU (false but on gpu<i>-whole): a DeviceClass selector naming an attribute a
			// device lacks fails the allocation rather than skipping the device.
			a := factAttrs(opts.Facts, g.Index)
			maps.Copy(a, map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrGPU: {IntValue: &idx}, AttrUUID: {StringValue: &uuid},
				AttrMemory: {IntValue: &memBytes}, AttrMPSAvailable: {BoolValue: &mps}, AttrWhole: {BoolValue: ptr(false)}})
			if product != "" {
				a[AttrProduct] = resourceapi.DeviceAttribute{StringValue: &product}
			}
			return a
		}
		pool, counterSet := PoolName(opts.Node, g.Index), fmt.Sprintf("gpu%d", g.Index)
		var slices []resourceslice.Slice
		var devs []resourceapi.Device
		if size, ok := groupSize(g); opts.Consumable && ok {
			total, groups := int64(size)*int64(len(g.Groups)), int64(len(g.Groups))
			sz := int64(size)
			shared, whole := attrs(), attrs()
			for _, a := range []map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{shared, whole} {
				a[AttrSMGroupSize] = resourceapi.DeviceAttribute{IntValue: &sz}
				a[AttrSMGroups] = resourceapi.DeviceAttribute{IntValue: &groups}
			}
			whole[AttrWhole] = resourceapi.DeviceAttribute{BoolValue: ptr(true)}
			var consumes []resourceapi.DeviceCounterConsumption
			if opts.Partitionable {
				counters := map[string]resourceapi.Counter{string(CapacitySMs): {Value: qty(total)}, string(CapacityMemory): {Value: qty(memBytes)}}
				slices = append(slices, resourceslice.Slice{SharedCounters: []resourceapi.CounterSet{{Name: counterSet, Counters: counters}}})
				consumes = []resourceapi.DeviceCounterConsumption{{CounterSet: counterSet, Counters: counters}}
			}
			multi := true
			devs = append(devs, resourceapi.Device{
				Name: counterSet, Taints: taint, AllowMultipleAllocations: &multi, Attributes: shared, ConsumesCounters: consumes,
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					// A claim that names no sms consumes one group, and no memory its share: what one group of the
					// per-group devices is given.
					CapacitySMs: {Value: qty(total), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr(qty(sz)),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr(qty(sz)), Max: ptr(qty(total)), Step: ptr(qty(sz))}}},
					CapacityMemory: {Value: qty(memBytes), RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    ptr(qty(memBytes / groups &^ (mib - 1))),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr(qty(mib)), Max: ptr(qty(memBytes)), Step: ptr(qty(mib))}}},
				},
			})
			if opts.Partitionable {
				devs = append(devs, resourceapi.Device{
					Name: counterSet + WholeSuffix, Taints: taint, Attributes: whole, ConsumesCounters: consumes,
					Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapacitySMs: {Value: qty(total)}, CapacityMemory: {Value: qty(memBytes)}},
				})
			}
		} else {
			for i, sms := range g.Groups {
				devs = append(devs, resourceapi.Device{
					Name: fmt.Sprintf("gpu%d-sm-%d", g.Index, i), Taints: taint, Attributes: attrs(),
					Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapacitySMs: {Value: qty(int64(sms))}},
				})
			}
		}
		res.Pools[pool] = resourceslice.Pool{Slices: append(slices, resourceslice.Slice{Devices: devs})}
	}
	return res
}

// WholeSuffix names GPU i's whole-GPU device: gpu<i>-whole.
const WholeSuffix = "-whole"

// PoolName is the pool of GPU gpu on node: <node>/gpu<i>. The scheduler tells devices apart by driver, pool and
// device name across the cluster, so each node's pools need names of their own (a bare gpu<i>, used when node is
// empty, is one node's only).
func PoolName(node string, gpu int) string {
	if node == "" {
		return fmt.Sprintf("gpu%d", gpu)
	}
	return fmt.Sprintf("%s/gpu%d", node, gpu)
}

// The capacities a device publishes.
const (
	CapacitySMs    resourceapi.QualifiedName = "sms"
	CapacityMemory resourceapi.QualifiedName = "memory"
)

const mib = 1 << 20

func qty(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.BinarySI) }

func ptr[T any](v T) *T { return &v }

// groupSize is the SMs of each of g's groups, when they are all the same (consumable capacity steps by one group).
func groupSize(g deviceplugin.GPU) (uint32, bool) {
	if len(g.Groups) == 0 {
		return 0, false
	}
	for _, s := range g.Groups {
		if s != g.Groups[0] {
			return 0, false
		}
	}
	return g.Groups[0], true
}

// Driver prepares claims into CDI specs in CDIDir.
type Driver struct {
	Node      string // the node's name (PoolName)
	Inventory deviceplugin.Inventory
	CDIDir    string
	// Devices gives the claim's GPU as CDI edits (nil: the spec sets the quota only).
	Devices cdi.Source
}

// Env resolves claim's allocation into the tenant's quota keys (DETSHARE_<KEY>=value), validated by
// cgroupgpu/quota, and the devices to report to kubelet.
func (d *Driver) Env(claim *resourceapi.ResourceClaim) ([]string, []kubeletplugin.Device, error) {
	env, devs, _, err := d.resolve(claim)
	return env, devs, err
}

// resolve is Env, and the claim's ceiling (its GPU among it).
func (d *Driver) resolve(claim *resourceapi.ResourceClaim) ([]string, []kubeletplugin.Device, quota.Ceiling, error) {
	fail := func(err error) ([]string, []kubeletplugin.Device, quota.Ceiling, error) {
		return nil, nil, quota.Ceiling{}, err
	}
	if claim.Status.Allocation == nil {
		return fail(errors.New("claim is not allocated"))
	}
	gpu := -1
	var sms uint32
	var groups int
	var consumed *uint64 // memory consumed from a shared GPU device (consumable capacity)
	var devs []kubeletplugin.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		// gpu<i>-sm-<n> (a group), gpu<i> (the shared GPU, what was consumed) or gpu<i>-whole (the GPU).
		var g, n int
		_, perGroup := fmt.Sscanf(r.Device, "gpu%d-sm-%d", &g, &n)
		if perGroup != nil || r.Device != fmt.Sprintf("gpu%d-sm-%d", g, n) {
			perGroup = errors.New("not per group")
			if _, err := fmt.Sscanf(r.Device, "gpu%d", &g); err != nil ||
				r.Device != fmt.Sprintf("gpu%d", g) && r.Device != fmt.Sprintf("gpu%d%s", g, WholeSuffix) {
				return fail(fmt.Errorf("device %q: not one of %s's devices", r.Device, DriverName))
			}
			if strings.HasSuffix(r.Device, WholeSuffix) && len(r.ConsumedCapacity) > 0 {
				return fail(fmt.Errorf("device %s/%s: the whole GPU is not shared, yet the allocation consumed %v", r.Pool, r.Device, r.ConsumedCapacity))
			}
		}
		info, ok := d.gpu(g)
		if !ok || r.Pool != PoolName(d.Node, g) || perGroup == nil && (n < 0 || n >= len(info.Groups)) {
			return fail(fmt.Errorf("device %s/%s: no such device on this node", r.Pool, r.Device))
		}
		if gpu >= 0 && g != gpu {
			return fail(fmt.Errorf("claim spans GPUs %d and %d; a tenant runs on one GPU (ask for at most one GPU's groups, or match on the gpu attribute)", gpu, g))
		}
		gpu = g
		if perGroup == nil {
			sms += info.Groups[n]
			groups++
		} else {
			s, k, mem, err := consumedOf(info, r)
			if err != nil {
				return fail(err)
			}
			sms, groups = sms+s, groups+k
			if consumed == nil {
				consumed = new(uint64)
			}
			*consumed += mem
		}
		devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{CDIKind + "=" + string(claim.UID)}, ShareID: r.ShareID})
	}
	if gpu < 0 {
		return fail(fmt.Errorf("claim has no %s device", DriverName))
	}
	class, own, err := configOf(claim)
	if err != nil {
		return fail(err)
	}
	info, _ := d.gpu(gpu)
	c, err := d.ceiling(info, sms, groups, consumed, class, own)
	if err != nil {
		return fail(fmt.Errorf("DetShareConfig of claim %s/%s: %w", claim.Namespace, claim.Name, err))
	}
	// The allocation is the container's ceiling (DETSHARE_ALLOC_*, cgroupgpu/quota Ceiling): the tier the configs
	// allow, the SMs of the allocated groups, the memory the configs give or else the groups' share of the GPU's. The
	// config's sms and sloP99 are the tenant's own settings under it (DETSHARE_SMS, DETSHARE_SLO_P99); CDI env
	// replaces the pod's variables of those names, and nothing the pod sets raises the ceiling.
	env := c.Env()
	q := quota.Default()
	for _, kv := range []struct {
		f quota.Field
		v string
	}{{quota.FieldSMs, pick(own.SMs, class.SMs)}, {quota.FieldSLOP99, pick(own.SLOP99, class.SLOP99)}} {
		if kv.v == "" {
			continue
		}
		if err := q.Set(kv.f, kv.v, quota.SourceEnv); err != nil {
			return fail(fmt.Errorf("DetShareConfig of claim %s/%s: %w", claim.Namespace, claim.Name, err))
		}
		env = append(env, kv.f.EnvKey()+"="+kv.v)
	}
	if r := (quota.Inputs{Env: env}).Resolve(); r.Err != nil { // what the runtime will resolve must resolve
		return fail(fmt.Errorf("DetShareConfig of claim %s/%s: %w", claim.Namespace, claim.Name, r.Err))
	}
	return env, devs, c, nil
}

func (d *Driver) gpu(index int) (deviceplugin.GPU, bool) {
	for _, g := range d.Inventory.GPUs {
		if g.Index == index {
			return g, true
		}
	}
	return deviceplugin.GPU{}, false
}

// configOf merges the opaque DetShareConfigs of the allocation by source: the class's (an administrator's) and the
// claim's (the pod author's); within one source a later config's fields win.
func configOf(claim *resourceapi.ResourceClaim) (class, own Config, err error) {
	for _, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		var cfg Config
		dec := json.NewDecoder(strings.NewReader(string(c.Opaque.Parameters.Raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return Config{}, Config{}, fmt.Errorf("opaque config for %s: %w (fields: apiVersion, kind, tier, sms, memory, sloP99)", DriverName, err)
		}
		if cfg.Kind != ConfigKind || cfg.APIVersion != ConfigAPIVersion {
			return Config{}, Config{}, fmt.Errorf("opaque config for %s: kind %q apiVersion %q, want %s %s", DriverName, cfg.Kind, cfg.APIVersion, ConfigKind, ConfigAPIVersion)
		}
		out := &own
		if c.Source == resourceapi.AllocationConfigSourceClass {
			out = &class
		}
		for _, f := range []struct {
			dst *string
			v   string
		}{{&out.Tier, cfg.Tier}, {&out.SMs, cfg.SMs}, {&out.Memory, cfg.Memory}, {&out.SLOP99, cfg.SLOP99}} {
			if f.v != "" {
				*f.dst = f.v
			}
		}
	}
	return class, own, nil
}

func pick(own, class string) string {
	if own != "" {
		return own
	}
	return class
}

// ceiling is a claim's allocation on GPU g: groups SM groups holding sms SMs, under the class's and the claim's
// configs. Tier and memory are the lower of the two where both set them (the class bounds its claims), default
// burstable and the groups' share of the GPU's memory; weight and role are the host's limits.
func (d *Driver) ceiling(g deviceplugin.GPU, sms uint32, groups int, consumed *uint64, class, own Config) (quota.Ceiling, error) {
	c := d.Inventory.Limits.Ceiling(g.Index)
	c.SMs = sms
	c.Tier = table.TierBurstable
	memTotal := uint64(g.MemGiB) << 30
	if len(g.Groups) > 0 {
		c.Memory = memTotal * uint64(groups) / uint64(len(g.Groups)) &^ (mib - 1) // whole MiB
	}
	if consumed != nil { // consumable capacity: the memory Kubernetes accounted is the most a config may give
		c.Memory = *consumed
	}
	first := true
	for _, cfg := range []Config{class, own} {
		if cfg.Tier != "" {
			t, err := quota.ParseTier(cfg.Tier)
			if err != nil {
				return c, &quota.FieldError{Key: "tier", Value: cfg.Tier, Source: quota.SourceAllocation, Allowed: err.Error()}
			}
			if first || t < c.Tier {
				c.Tier = t
			}
			first = false
		}
	}
	first = true
	for _, cfg := range []Config{class, own} {
		if cfg.Memory == "" {
			continue
		}
		m, err := quota.ParseMemory(cfg.Memory)
		if err != nil || m.IsZero() {
			allowed := "bytes with an optional unit or a percent of the GPU (memory is what the claim is given; 0 is not allowed)"
			return c, &quota.FieldError{Key: "memory", Value: cfg.Memory, Source: quota.SourceAllocation, Allowed: allowed}
		}
		b := m.Limit(memTotal)
		if b == 0 || b > memTotal {
			return c, &quota.FieldError{Key: "memory", Value: cfg.Memory, Source: quota.SourceAllocation,
				Allowed: fmt.Sprintf("1 byte up to GPU %d's %s", g.Index, quota.FormatBytes(memTotal))}
		}
		if first && consumed == nil || b < c.Memory {
			c.Memory = b
		}
		first = false
	}
	return c, nil
}

// consumedOf is what a claim's allocation of GPU g's shared device consumed: SMs (whole groups), groups and memory
// bytes. An allocation without consumedCapacity (an apiserver without consumable capacity allocates the device
// whole) consumed the whole GPU.
func consumedOf(g deviceplugin.GPU, r resourceapi.DeviceRequestAllocationResult) (sms uint32, groups int, mem uint64, err error) {
	size, ok := groupSize(g)
	if !ok {
		return 0, 0, 0, fmt.Errorf("device %s/%s: GPU %d's SM groups differ in size; it is published per group", r.Pool, r.Device, g.Index)
	}
	memTotal := uint64(g.MemGiB) << 30
	if len(r.ConsumedCapacity) == 0 {
		return size * uint32(len(g.Groups)), len(g.Groups), memTotal, nil
	}
	q, ok := r.ConsumedCapacity[CapacitySMs]
	v, exact := q.AsInt64()
	if !ok || !exact || v < int64(size) || v%int64(size) != 0 || v > int64(size)*int64(len(g.Groups)) {
		return 0, 0, 0, fmt.Errorf("device %s/%s: consumed sms %s is not a whole number of %d-SM groups up to %d", r.Pool, r.Device, q.String(), size, int(size)*len(g.Groups))
	}
	m, ok := r.ConsumedCapacity[CapacityMemory]
	b, exact := m.AsInt64()
	if !ok || !exact || b < mib || uint64(b) > memTotal {
		return 0, 0, 0, fmt.Errorf("device %s/%s: consumed memory %s is not 1 MiB up to GPU %d's %s", r.Pool, r.Device, m.String(), g.Index, quota.FormatBytes(memTotal))
	}
	return uint32(v), int(v / int64(size)), uint64(b), nil
}

// cdiSpec is the CDI spec (v0.6.0) of one claim: a device named by the claim UID whose edits set the quota env.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

// cdiEdits are the claim device's edits: the quota env and the GPU's edit.
type cdiEdits struct {
	Env         []string         `json:"env"`
	DeviceNodes []cdi.DeviceNode `json:"deviceNodes,omitempty"`
	Hooks       []cdi.Hook       `json:"hooks,omitempty"`
	Mounts      []cdi.Mount      `json:"mounts,omitempty"`
}

func (d *Driver) specPath(uid types.UID) string {
	return filepath.Join(d.CDIDir, "detshare.io-gpu_"+string(uid)+".json")
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		env, devs, ceiling, err := d.resolve(c)
		if err == nil {
			err = d.writeSpec(c.UID, d.edits(env, ceiling.GPU.Index))
		}
		for i := range devs {
			devs[i].Metadata = d.metadata(ceiling)
		}
		if err != nil {
			logrus.WithError(err).WithField("claim", c.Namespace+"/"+c.Name).Warn("prepare refused")
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		logrus.WithFields(logrus.Fields{"claim": c.Namespace + "/" + c.Name, "env": env}).Info("prepared")
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

// Metadata attributes: what the claim was granted, in the device metadata file (KEP-5304) the kubelet plugin
// helper writes for each request and mounts into the container at
// /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.detshare.io-metadata.json (EnableDeviceMetadata), beside the
// GPU's own attributes (gpu, uuid, product).
const (
	MetaGrantedSMs  = "grantedSMs"  // int: the SMs the claim was allocated (its guaranteed SMs at most)
	MetaTier        = "tier"        // string: the tier the allocation allows (latency-critical, burstable, best-effort)
	MetaMemoryLimit = "memoryLimit" // int: the GPU memory limit in bytes
)

// metadata is the device metadata of a claim with ceiling c.
func (d *Driver) metadata(c quota.Ceiling) *kubeletplugin.DeviceMetadata {
	g, _ := d.gpu(c.GPU.Index)
	idx, sms, mem, tier, uuid := int64(g.Index), int64(c.SMs), int64(c.Memory), c.Tier.String(), g.UUID
	a := map[string]resourceapi.DeviceAttribute{AttrGPU: {IntValue: &idx}, AttrUUID: {StringValue: &uuid},
		MetaGrantedSMs: {IntValue: &sms}, MetaTier: {StringValue: &tier}, MetaMemoryLimit: {IntValue: &mem}}
	if g.Product != "" {
		product := g.Product
		a[AttrProduct] = resourceapi.DeviceAttribute{StringValue: &product}
	}
	return &kubeletplugin.DeviceMetadata{Attributes: a}
}

// edits are the claim's container edits: the quota env, then GPU index's edit. The GPU's edit comes first in the
// env so the quota keys win; a node whose GPU edit fails (the plugin cannot see the driver) still hands out the
// quota, and the DetShare runtime handler gives the container its GPU at create time.
func (d *Driver) edits(env []string, gpu int) cdiEdits {
	out := cdiEdits{Env: env}
	if d.Devices == nil {
		return out
	}
	g, _ := d.gpu(gpu)
	e, err := d.Devices.Edit(cdi.GPU{Index: g.Index, UUID: g.UUID})
	if err != nil {
		logrus.WithError(err).WithField("gpu", gpu).Warn("no GPU device edit in the claim's CDI spec (quota only)")
		return out
	}
	out.Env = append(append([]string(nil), e.Edits.Env...), env...)
	out.DeviceNodes, out.Hooks, out.Mounts = e.Edits.DeviceNodes, e.Edits.Hooks, e.Edits.Mounts
	return out
}

func (d *Driver) writeSpec(uid types.UID, edits cdiEdits) error {
	data, err := json.Marshal(cdiSpec{Version: "0.6.0", Kind: CDIKind, Devices: []cdiDevice{{Name: string(uid), Edits: edits}}})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.CDIDir, 0o755); err != nil {
		return fmt.Errorf("CDI directory: %w", err)
	}
	tmp := d.specPath(uid) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	if err := os.Rename(tmp, d.specPath(uid)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write CDI spec: %w", err)
	}
	return nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: the claim's CDI spec goes.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		if err := os.Remove(d.specPath(c.UID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			out[c.UID] = err
			continue
		}
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	logrus.WithError(err).Warn(msg)
}
