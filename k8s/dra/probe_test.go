package dra

import (
	"context"
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// apiserver is a fake apiserver's ResourceSlice create: it answers with the slice less the fields of the features
// that are off (what kube-apiserver's strategy drops when a gate is off), and records that the create was a dry run.
func apiserver(t *testing.T, served Served) *fake.Clientset {
	client := fake.NewClientset()
	client.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		c := a.(k8stesting.CreateAction)
		if opts := a.(k8stesting.CreateActionImpl).CreateOptions; len(opts.DryRun) != 1 {
			t.Errorf("probe created a ResourceSlice without dryRun=All: %+v", opts)
		}
		s := c.GetObject().(*resourceapi.ResourceSlice).DeepCopy()
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if !served.ConsumableCapacity {
				d.AllowMultipleAllocations = nil
				for k, v := range d.Capacity {
					v.RequestPolicy = nil
					d.Capacity[k] = v
				}
			}
			if !served.PartitionableDevices {
				d.ConsumesCounters = nil
			}
			if !served.DeviceTaints {
				d.Taints = nil
			}
		}
		if !served.PartitionableDevices {
			s.Spec.SharedCounters = nil
		}
		return true, s, nil
	})
	return client
}

// The fallback decision: an apiserver with Kubernetes 1.34's defaults (consumable capacity, partitionable devices
// and device taints alpha, off) keeps none of the probe's fields, so the driver publishes per-group devices; one with
// 1.36's (all beta, on) keeps them all; each feature is told apart.
func TestProbeTellsWhatTheAPIServerServes(t *testing.T) {
	for _, want := range []Served{{}, {ConsumableCapacity: true, PartitionableDevices: true, DeviceTaints: true},
		{ConsumableCapacity: true}, {DeviceTaints: true}, {ConsumableCapacity: true, DeviceTaints: true}} {
		got, err := Probe(context.Background(), apiserver(t, want), "node-1")
		if err != nil || got != want {
			t.Errorf("apiserver serving %+v: probe says %+v, %v", want, got, err)
		}
	}
	client := fake.NewClientset()
	client.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errForbidden
	})
	if _, err := Probe(context.Background(), client, "node-1"); err == nil || !strings.Contains(err.Error(), "dry-run create") {
		t.Errorf("apiserver refusing the probe: %v, want an error naming the dry-run create", err)
	}
}

var errForbidden = errors.New("resourceslices is forbidden")
