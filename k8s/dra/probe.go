package dra

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Served is what the apiserver serves of the DRA features the driver can use.
type Served struct {
	ConsumableCapacity   bool // Device.allowMultipleAllocations and a capacity's requestPolicy (DRAConsumableCapacity)
	PartitionableDevices bool // ResourceSlice sharedCounters and Device.consumesCounters (DRAPartitionableDevices)
	DeviceTaints         bool // Device.taints (DRADeviceTaints)
}

// Probe asks the apiserver which of the DRA fields the driver publishes it keeps, by creating ResourceSlices for
// node with dryRun=All (nothing is stored): an apiserver drops the fields of a feature gate that is off, and an
// older one does not know them, so a field that comes back is served. It needs the create permission on
// resourceslices the plugin has anyway.
func Probe(ctx context.Context, client kubernetes.Interface, node string) (Served, error) {
	var s Served
	slices := client.ResourceV1().ResourceSlices()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	multi, one := true, qty(1)
	counters := map[string]resourceapi.Counter{"probe": {Value: one}}
	dev := resourceapi.Device{Name: "probe", AllowMultipleAllocations: &multi,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"probe": {Value: qty(2),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr(one), ValidValues: []resource.Quantity{one}}}},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "probe", Counters: counters}},
		Taints:           []resourceapi.DeviceTaint{{Key: TaintKey, Value: "probe", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}
	spec := func(name string) resourceapi.ResourceSliceSpec {
		return resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node,
			Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 2}}
	}
	name := "detshare-probe-" + node
	devSlice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-devices"}, Spec: spec(name)}
	devSlice.Spec.Devices = []resourceapi.Device{dev}
	got, err := slices.Create(ctx, devSlice, dry)
	if err != nil {
		return s, fmt.Errorf("probe the DRA features the apiserver serves (dry-run create of ResourceSlice %s): %w", devSlice.Name, err)
	}
	if len(got.Spec.Devices) != 1 {
		return s, fmt.Errorf("probe the DRA features the apiserver serves: dry-run ResourceSlice %s came back with %d devices, want 1", devSlice.Name, len(got.Spec.Devices))
	}
	d := got.Spec.Devices[0]
	s.ConsumableCapacity = d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations && d.Capacity["probe"].RequestPolicy != nil
	s.DeviceTaints = len(d.Taints) == 1
	if len(d.ConsumesCounters) == 1 {
		cSlice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-counters"}, Spec: spec(name)}
		cSlice.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "probe", Counters: counters}}
		got, err := slices.Create(ctx, cSlice, dry)
		if err != nil {
			return s, fmt.Errorf("probe the DRA features the apiserver serves (dry-run create of ResourceSlice %s): %w", cSlice.Name, err)
		}
		s.PartitionableDevices = len(got.Spec.SharedCounters) == 1
	}
	return s, nil
}
