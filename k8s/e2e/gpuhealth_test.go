package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/detshare/detshare/integration/simgpu"
	"github.com/detshare/detshare/k8s/dra"
)

// A critical Xid on GPU 0 (injected through the NVML double the DRA plugin watches): an application-caused one (13)
// changes nothing; Xid 79 taints the GPU's devices gpu.detshare.io/unhealthy=xid-79:NoSchedule (mpsAvailable stays
// true: its MPS did not fail), a new claim's pod stays Pending; 30 s (the e2e's gpuHealth.xidHold) after the Xid
// the taint goes and the pod runs.
func TestDRADeviceTaintOnXid(t *testing.T) {
	c := need136(t)
	c.waitDeviceTaint(t, "", "", true)
	simgpu.InjectXid(t, c.xidFile(), 0, 13)
	time.Sleep(3 * time.Second)
	c.waitDeviceTaint(t, "", "", true)
	simgpu.InjectXid(t, c.xidFile(), 0, 79)
	c.waitDeviceTaint(t, "xid-79", resourceapi.DeviceTaintEffectNoSchedule, true)
	c.capacityPod(t, "xid-wait", 8, 1*gib)
	c.staysPending(t, "xid-wait", "GPU 0's devices tainted xid-79")
	c.waitDeviceTaint(t, "", "", true)
	c.checkTenant(t, "xid-wait", 8, 1*gib, "burstable")
}

// The devices carry the GPU's architecture, compute capability and the driver's and CUDA's versions from NVML (the
// double's: Hopper 9.0, 580.00-simgpu, 13.0); a DeviceClass selecting on the architecture allocates a Hopper GPU
// and one asking for Ampere leaves its pod Pending.
func TestDRADevicesCarryNVMLAttributes(t *testing.T) {
	c := need136(t)
	l, err := c.client.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devs := devicesOf(l.Items)
	if len(devs) != 2 {
		t.Fatalf("devices %+v, want gpu0 and gpu0-whole", devs)
	}
	for _, d := range devs {
		a := d.Attributes
		str := func(k resourceapi.QualifiedName) string {
			if v := a[k].StringValue; v != nil {
				return *v
			}
			if v := a[k].VersionValue; v != nil {
				return *v
			}
			return ""
		}
		for k, want := range map[resourceapi.QualifiedName]string{dra.AttrArchitecture: "hopper", dra.AttrComputeCapability: "9.0.0",
			dra.AttrDriverVersion: "580.0.0-simgpu", dra.AttrCUDADriverVersion: "13.0.0"} {
			if got := str(k); got != want {
				t.Errorf("device %s attribute %s = %q, want %q (attributes %v)", d.Name, k, got, want, a)
			}
		}
	}
	for arch, runs := range map[string]bool{"hopper": true, "ampere": false} {
		class := arch + ".gpu.detshare.io"
		dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.detshare.io" && ` +
				`!device.attributes["gpu.detshare.io"].wholeGPU && "architecture" in device.attributes["gpu.detshare.io"] && ` +
				`device.attributes["gpu.detshare.io"].architecture == "` + arch + `"`}}}}}
		if _, err := c.client.ResourceV1().DeviceClasses().Create(ctx(t), dc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.client.ResourceV1().DeviceClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
		})
		name := "arch-" + arch
		c.applyClaim(t, name, resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}, "")
		if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), claimPod(name, name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.deletePod(t, name) })
		if runs {
			c.checkTenant(t, name, 8, uint64(groupsShare(1)), "burstable")
			c.deletePod(t, name)
		} else {
			c.staysPending(t, name, "no Ampere GPU")
		}
	}
}

// detshareReady is the node's DetShareReady condition (nil: none).
func (c *cluster) detshareReady(t *testing.T) *corev1.NodeCondition {
	n, err := c.client.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == dra.ConditionType {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func (c *cluster) waitCondition(t *testing.T, what string, ok func(*corev1.NodeCondition) bool) *corev1.NodeCondition {
	t.Helper()
	var cond *corev1.NodeCondition
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if cond = c.detshareReady(t); cond != nil && ok(cond) {
			return cond
		}
	}
	t.Fatalf("node condition %s after 60 s: %+v, want %s", dra.ConditionType, cond, what)
	return nil
}

// The DRA plugin keeps the node condition DetShareReady: True while it publishes GPU 0, its message the platform it
// found (the NVML double's driver, the scheduler's MPS, toolkit, CDI, the apiserver's version and the DRA features
// it serves).
func TestNodeConditionDetShareReady(t *testing.T) {
	c := need136(t)
	ver, err := c.client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	cond := c.waitCondition(t, "True", func(n *corev1.NodeCondition) bool { return n.Status == corev1.ConditionTrue })
	for _, want := range []string{"driver 580.00-simgpu (CUDA 13.0)", "MPS: GPU 0 ", "NVIDIA toolkit: ", "CDI: ", "Kubernetes " + ver.GitVersion,
		"DRA features served: consumableCapacity, partitionableDevices, deviceTaints", "GPUs published: 0"} {
		if !strings.Contains(cond.Message, want) {
			t.Errorf("%s message %q lacks %q", dra.ConditionType, cond.Message, want)
		}
	}
	if cond.Reason != dra.ReasonPublishing {
		t.Errorf("%s reason %q, want %s", dra.ConditionType, cond.Reason, dra.ReasonPublishing)
	}
}

// NVIDIA's DRA driver publishing the same GPU (a ResourceSlice of gpu.nvidia.com for this node whose device has the
// GPU's UUID, created by the test): DetShare's DRA plugin withdraws the GPU's slices and says why in DetShareReady;
// once NVIDIA's slice goes, it publishes the GPU again.
func TestDRAWithholdsAGPUNVIDIAsDRADriverPublishes(t *testing.T) {
	c := need136(t)
	ours := func() []resourceapi.Device {
		l, err := c.client.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + dra.DriverName})
		if err != nil {
			t.Fatal(err)
		}
		return devicesOf(l.Items)
	}
	devs := ours()
	if len(devs) == 0 || devs[0].Attributes[dra.AttrUUID].StringValue == nil {
		t.Fatalf("DetShare's devices: %+v", devs)
	}
	uuid, node := *devs[0].Attributes[dra.AttrUUID].StringValue, nodeName
	nv := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "e2e-gpu.nvidia.com"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: dra.NVIDIADriver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: &uuid}}}}}}
	if _, err := c.client.ResourceV1().ResourceSlices().Create(ctx(t), nv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	remove := func() {
		if err := c.client.ResourceV1().ResourceSlices().Delete(context.Background(), nv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		deleted = true
	}
	t.Cleanup(func() {
		if !deleted {
			remove()
		}
	})
	wait := func(n int, what string) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if len(ours()) == n {
				return
			}
		}
		t.Fatalf("DetShare's devices after 60 s: %+v, want %d (%s)", ours(), n, what)
	}
	wait(0, "GPU 0 withheld while gpu.nvidia.com publishes it")
	cond := c.waitCondition(t, "False, naming the withheld GPU", func(n *corev1.NodeCondition) bool { return n.Status == corev1.ConditionFalse })
	if cond.Reason != dra.ReasonNoGPU || !strings.Contains(cond.Message, "GPU 0 ("+uuid+"): claimed-by-other-plugin") {
		t.Errorf("%s while NVIDIA's driver publishes GPU 0: %+v, want reason %s naming GPU 0", dra.ConditionType, cond, dra.ReasonNoGPU)
	}
	remove()
	wait(2, "GPU 0 published again")
	c.waitCondition(t, "True again", func(n *corev1.NodeCondition) bool { return n.Status == corev1.ConditionTrue })
}

// setUnhealthyEffect upgrades release ds-dra with dra.unhealthyEffect=effect and waits for the DRA plugin pod that
// runs with it to publish GPU 0 again.
func (c *cluster) setUnhealthyEffect(t *testing.T, effect string) {
	t.Helper()
	args := append([]string{"upgrade", releaseDRA, c.chartDir(), "--namespace", chartNS}, c.draValues()...)
	if _, err := c.helm(append(args, "--set", "dra.unhealthyEffect="+effect)...); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		pods, err := c.client.CoreV1().Pods(chartNS).List(ctx(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + releaseDRA +
			",app.kubernetes.io/component=dra-plugin"})
		if err == nil && len(pods.Items) == 1 && running(&pods.Items[0]) && pods.Items[0].DeletionTimestamp == nil &&
			strings.Contains(strings.Join(pods.Items[0].Spec.Containers[0].Command, " "), "--unhealthy-effect "+effect) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DRA plugin with --unhealthy-effect %s not running after 120 s: %s", effect, c.chartPods(ctx(t)))
		}
	}
	c.waitDeviceTaint(t, "", "", true)
	time.Sleep(5 * time.Second) // the new plugin's Xid watch has started (its event set reads from then on)
}

// With dra.unhealthyEffect=NoExecute a critical Xid evicts: the device taint is gpu.detshare.io/unhealthy=xid-79:
// NoExecute and the controller-manager's device-taint eviction (DRADeviceTaints) deletes the running pod whose claim
// uses GPU 0; the taint goes after the hold time. The release goes back to NoSchedule afterwards.
func TestDRANoExecuteEvictsOnXid(t *testing.T) {
	c := need136(t)
	c.setUnhealthyEffect(t, string(resourceapi.DeviceTaintEffectNoExecute))
	t.Cleanup(func() { c.setUnhealthyEffect(t, string(resourceapi.DeviceTaintEffectNoSchedule)) })
	c.capacityPod(t, "evictee", 8, 1*gib)
	c.checkTenant(t, "evictee", 8, 1*gib, "burstable")
	simgpu.InjectXid(t, c.xidFile(), 0, 79)
	c.waitDeviceTaint(t, "xid-79", resourceapi.DeviceTaintEffectNoExecute, true)
	var p *corev1.Pod
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var err error
		p, err = c.client.CoreV1().Pods("default").Get(ctx(t), "evictee", metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod evictee not evicted 60 s after its GPU was tainted NoExecute: %+v", p.Status)
		}
	}
	c.waitDeviceTaint(t, "", "", true)
}
