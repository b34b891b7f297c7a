package main

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/k8s/dra"
)

// --devices=auto publishes one shared device per GPU where the apiserver serves consumable capacity (1.36), with
// the whole-GPU device where it serves partitionable devices too, per SM group where it serves neither (1.34's
// defaults); --device-taints=auto follows device taints; forcing what is not served, or an unknown value, is
// refused naming the allowed values.
func TestDevicesModeFollowsTheAPIServer(t *testing.T) {
	v134 := dra.Served{}
	v136 := dra.Served{ConsumableCapacity: true, PartitionableDevices: true, DeviceTaints: true}
	for _, tc := range []struct {
		devices, taints string
		served          dra.Served
		want            dra.SliceOptions
	}{
		{"auto", "auto", v134, dra.SliceOptions{}},
		{"auto", "auto", v136, dra.SliceOptions{Consumable: true, Partitionable: true, Taints: true}},
		{"auto", "off", dra.Served{ConsumableCapacity: true}, dra.SliceOptions{Consumable: true}},
		{"groups", "auto", v136, dra.SliceOptions{Taints: true}},
		{"gpu", "on", v136, dra.SliceOptions{Consumable: true, Partitionable: true, Taints: true}},
	} {
		got, err := sliceOptions(tc.devices, tc.taints, tc.served)
		if err != nil || got != tc.want {
			t.Errorf("--devices=%s --device-taints=%s served %+v: %+v, %v; want %+v", tc.devices, tc.taints, tc.served, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ devices, taints, want string }{
		{"gpu", "off", "DRAConsumableCapacity"}, {"groups", "on", "DRADeviceTaints"},
		{"shared", "off", "gpu, groups, auto"}, {"auto", "yes", "auto, on, off"},
	} {
		if _, err := sliceOptions(tc.devices, tc.taints, v134); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--devices=%s --device-taints=%s on 1.34: %v, want a refusal naming %s", tc.devices, tc.taints, err, tc.want)
		}
	}
}

// --unhealthy-effect takes NoSchedule or NoExecute; anything else is refused naming the flag and both values.
func TestUnhealthyEffect(t *testing.T) {
	for _, v := range []string{"NoSchedule", "NoExecute"} {
		if e, err := taintEffect(v); err != nil || string(e) != v {
			t.Errorf("--unhealthy-effect=%s: %q, %v", v, e, err)
		}
	}
	for _, v := range []string{"noexecute", "", "Evict"} {
		if _, err := taintEffect(v); err == nil || !strings.Contains(err.Error(), "--unhealthy-effect") ||
			!strings.Contains(err.Error(), "NoSchedule, NoExecute") {
			t.Errorf("--unhealthy-effect=%q: %v, want a refusal naming the flag and NoSchedule, NoExecute", v, err)
		}
	}
}
