package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/detshare/detshare/k8s/dra"
)

// DRA on Kubernetes 1.36+ (issue 29): consumable capacity, partitionable devices, extended resources backed by
// DRA, device taints and device metadata, with the real kube-scheduler allocating. The simulated GPU is an H100's
// shape: 15 groups of 8 SMs (120 guaranteed SMs), 80 GiB.

func need136(t *testing.T) *cluster {
	t.Helper()
	c := need(t)
	if !c.consumable() {
		t.Skipf("Kubernetes %s: the DRA driver publishes per-group devices (consumable capacity needs 1.36+)", k8sVersion())
	}
	return c
}

// unschedulable says whether the scheduler gave up on the pod for now: PodScheduled false, reason Unschedulable.
func unschedulable(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

func scheduledMessage(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return cond.Message
		}
	}
	return ""
}

// capacityPod creates pod name whose claim (also name) asks the shared device for sms SMs and memory bytes.
func (c *cluster) capacityPod(t *testing.T, name string, sms, memory int64) {
	t.Helper()
	c.createCapacityClaim(t, name, sms, memory, "")
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), claimPod(name, name), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { c.deletePod(t, name) })
}

// stays checks that pod name is refused by the scheduler for DRA (cannot allocate all claims) and still is 5 s later.
func (c *cluster) staysPending(t *testing.T, name, why string) {
	t.Helper()
	p := c.waitPod(t, name, 60*time.Second, "unschedulable ("+why+")", unschedulable)
	if msg := scheduledMessage(p); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("%s (%s): scheduler's reason %q, want DRA's \"cannot allocate all claims\"", name, why, msg)
	}
	time.Sleep(5 * time.Second)
	if p, err := c.client.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("%s (%s): bound to %q (%v), want Pending", name, why, p.Spec.NodeName, err)
	}
}

// checkTenant checks the tenant of running pod name has sms guaranteed SMs and a memory limit of mem bytes.
func (c *cluster) checkTenant(t *testing.T, name string, sms uint32, mem uint64, tier string) {
	t.Helper()
	p := c.waitPod(t, name, 120*time.Second, "Running", running)
	tn, ok := tenantOf(c.status(t), containerID(p))
	if !ok {
		t.Fatalf("pod %s's container is not a tenant", name)
	}
	if tn.GuaranteedSMs != sms || tn.MemLimit != mem || tn.Tier != tier {
		t.Errorf("pod %s: tenant with %d guaranteed SMs, memory limit %d, tier %s; want %d, %d, %s (the allocation is the ceiling)",
			name, tn.GuaranteedSMs, tn.MemLimit, tn.Tier, sms, mem, tier)
	}
}

// The driver publishes one shared device per GPU with consumable capacity sms and memory, a whole-GPU device, and
// their counter set; the Kubernetes scheduler packs claims by SMs and memory: 64 + 56 SMs fit the GPU's 120, a
// third claim of 8 SMs stays Pending (the scheduler's reason), and a claim whose SMs fit but whose memory does not
// (40 GiB + 48 GiB > 80 GiB) stays Pending too while the SM claim, once room is made, runs. Each running pod's
// tenant has what its claim consumed as its quota.
func TestDRAConsumableCapacityPacksPods(t *testing.T) {
	c := need136(t)
	slices, err := c.client.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var counters []resourceapi.CounterSet
	for _, s := range slices.Items {
		counters = append(counters, s.Spec.SharedCounters...)
		if s.Spec.Pool.Name != nodeName+"/gpu0" {
			t.Errorf("ResourceSlice %s: pool %q, want %s/gpu0 (pools are told apart across nodes)", s.Name, s.Spec.Pool.Name, nodeName)
		}
	}
	devs := devicesOf(slices.Items)
	if len(counters) != 1 || counters[0].Name != "gpu0" || len(devs) != 2 {
		t.Fatalf("ResourceSlices: counter sets %+v, devices %d; want counter set gpu0 and two devices", counters, len(devs))
	}
	shared, whole := devs[0], devs[1]
	if shared.Name == "gpu0-whole" {
		shared, whole = whole, shared
	}
	sms, mem := shared.Capacity[dra.CapacitySMs], shared.Capacity[dra.CapacityMemory]
	if shared.Name != "gpu0" || shared.AllowMultipleAllocations == nil || !*shared.AllowMultipleAllocations || sms.Value.Value() != 120 ||
		sms.RequestPolicy == nil || sms.RequestPolicy.ValidRange == nil || sms.RequestPolicy.ValidRange.Step.Value() != 8 ||
		mem.Value.Value() != 80*gib || mem.RequestPolicy == nil || mem.RequestPolicy.ValidRange.Step.Value() != 1<<20 {
		t.Errorf("shared device as the apiserver stored it: %+v", shared)
	}
	if whole.Name != "gpu0-whole" || len(whole.ConsumesCounters) != 1 || len(shared.ConsumesCounters) != 1 {
		t.Errorf("whole-GPU device %+v, shared consumes %+v: want both consuming gpu0's counters", whole, shared.ConsumesCounters)
	}
	for _, a := range []string{dra.AttrUUID, dra.AttrProduct, dra.AttrSMGroupSize, dra.AttrSMGroups, dra.AttrMPSAvailable, dra.AttrWhole} {
		if _, ok := shared.Attributes[resourceapi.QualifiedName(a)]; !ok {
			t.Errorf("shared device lacks attribute %s: %+v", a, shared.Attributes)
		}
	}

	c.capacityPod(t, "pack-a", 64, 40*gib)
	c.checkTenant(t, "pack-a", 64, 40*gib, "burstable")
	c.capacityPod(t, "pack-b", 56, 30*gib)
	c.checkTenant(t, "pack-b", 56, 30*gib, "burstable")
	c.capacityPod(t, "pack-c", 8, 1*gib)
	c.staysPending(t, "pack-c", "120 of 120 SMs consumed")

	c.deletePod(t, "pack-b") // 56 SMs and 40 GiB free: pack-c's 8 SMs fit now
	c.checkTenant(t, "pack-c", 8, 1*gib, "burstable")
	c.capacityPod(t, "pack-d", 8, 48*gib)
	c.staysPending(t, "pack-d", "48 GiB asked, 39 GiB free")
}

// The scheduler rounds a request up to the device's request policy (KEP-5075): 12 SMs consumes two 8-SM groups, and
// the tenant gets the 16 SMs the cluster accounted for. A request above the policy's maximum (128 of 120 SMs) is
// never allocated.
func TestDRACapacityRoundsUpToWholeGroups(t *testing.T) {
	c := need136(t)
	c.capacityPod(t, "odd-sms", 12, 1*gib)
	c.checkTenant(t, "odd-sms", 16, 1*gib, "burstable")
	claim, err := c.client.ResourceV1().ResourceClaims("default").Get(ctx(t), "odd-sms", metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim odd-sms: %+v, %v", claim, err)
	}
	if q := claim.Status.Allocation.Devices.Results[0].ConsumedCapacity[dra.CapacitySMs]; q.Value() != 16 {
		t.Errorf("claim odd-sms consumed %s SMs, want 16 (12 rounded up to whole groups)", q.String())
	}
	c.deletePod(t, "odd-sms")
	c.capacityPod(t, "too-many-sms", 128, 1*gib)
	c.staysPending(t, "too-many-sms", "128 SMs asked of a GPU with 120")
}

// KEP-5004: a pod's resources.limits {detshare.io/gpu-share: 1} is served by DRA (the DeviceClass's
// extendedResourceName): one SM group and its share of the memory. While it runs, a pod asking for the whole GPU
// ({detshare.io/gpu-whole: 1}) stays Pending, the counters of partitionable devices excluding it; once the share
// goes, the whole-GPU pod runs with the GPU's 120 SMs and 80 GiB.
func TestDRAExtendedResourcesAndWholeGPU(t *testing.T) {
	c := need136(t)
	for class, name := range map[string]string{dra.DriverName: "detshare.io/gpu-share", "whole." + dra.DriverName: "detshare.io/gpu-whole"} {
		dc, err := c.client.ResourceV1().DeviceClasses().Get(ctx(t), class, metav1.GetOptions{})
		if err != nil || dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != name {
			t.Fatalf("DeviceClass %s: %+v (%v), want extendedResourceName %s", class, dc, err, name)
		}
	}
	erPod := func(name, resourceName string) {
		pod := sharePod(name, 0, 0)
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(resourceName): resource.MustParse("1")}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		t.Cleanup(func() { c.deletePod(t, name) })
	}
	erPod("er-share", "detshare.io/gpu-share")
	c.checkTenant(t, "er-share", 8, uint64(groupsShare(1)), "burstable")
	p, _ := c.client.CoreV1().Pods("default").Get(ctx(t), "er-share", metav1.GetOptions{})
	if p.Status.ExtendedResourceClaimStatus == nil || p.Status.ExtendedResourceClaimStatus.ResourceClaimName == "" {
		t.Errorf("pod er-share: no extendedResourceClaimStatus (the scheduler's claim for the extended resource): %+v", p.Status)
	}
	erPod("er-whole", "detshare.io/gpu-whole")
	c.staysPending(t, "er-whole", "the GPU's shared device is in use")
	c.deletePod(t, "er-share")
	c.checkTenant(t, "er-whole", 120, 80*gib, "burstable")
}

// When the scheduler records GPU 0's MPS as failed (simulated, as in TestMPSFailureMakesTheGPUUnallocatable), the
// DRA driver republishes the GPU's devices with the taint gpu.detshare.io/unhealthy=mps-failed:NoSchedule and
// mpsAvailable false; a new claim's pod stays Pending while it is tainted; on recovery the taint goes and the pod
// runs.
func TestDRADeviceTaintOnMPSFailure(t *testing.T) {
	c := need136(t)
	fail, restore := c.simulateMPSFailure(t)
	tainted := func(want bool) {
		t.Helper()
		if want {
			c.waitDeviceTaint(t, "mps-failed", resourceapi.DeviceTaintEffectNoSchedule, false)
		} else {
			c.waitDeviceTaint(t, "", "", true)
		}
	}
	tainted(false)
	fail()
	tainted(true)
	c.capacityPod(t, "taint-wait", 8, 1*gib)
	c.staysPending(t, "taint-wait", "GPU 0's devices tainted")
	restore()
	tainted(false)
	c.checkTenant(t, "taint-wait", 8, 1*gib, "burstable")
}

// waitDeviceTaint waits until both devices of GPU 0 carry the taint gpu.detshare.io/unhealthy=value:effect (value
// "": no taint) and mpsAvailable mps.
func (c *cluster) waitDeviceTaint(t *testing.T, value string, effect resourceapi.DeviceTaintEffect, mps bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var devs []resourceapi.Device
	for time.Now().Before(deadline) {
		l, err := c.client.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{})
		if err == nil {
			devs = devicesOf(l.Items)
			ok := len(devs) == 2
			for _, d := range devs {
				has := len(d.Taints) == 1 && d.Taints[0].Key == dra.TaintKey && d.Taints[0].Value == value && d.Taints[0].Effect == effect
				m := d.Attributes[dra.AttrMPSAvailable].BoolValue
				ok = ok && (has || value == "" && len(d.Taints) == 0) && m != nil && *m == mps
			}
			if ok {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("devices after 60 s: %+v; want taint %q effect %q and mpsAvailable %v", devs, value, effect, mps)
}

// KEP-5304: the DRA driver writes each prepared request's device metadata, which the container reads at
// /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.detshare.io-metadata.json: the SMs granted, the tier and the
// memory limit, as its tenant was given them.
// The metadata file is the driver's (its kubelet plugin helper writes it and a CDI spec that mounts it), so it works
// on 1.34 too, with the per-group devices.
func TestDRADeviceMetadata(t *testing.T) {
	c := need(t)
	c.createClaim(t, "meta", 3, `{"apiVersion": "detshare.io/v1alpha1", "kind": "DetShareConfig", "tier": "latency-critical", "memory": "6Gi"}`)
	pod := claimPod("meta", "meta")
	pod.Spec.Containers[0].Command = []string{"sh", "-c", "cat /var/run/kubernetes.io/dra-device-attributes/resourceclaims/meta/gpu/gpu.detshare.io-metadata.json; echo; echo END-METADATA; exec sleep 600"}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.deletePod(t, "meta")
	c.checkTenant(t, "meta", 24, 6*gib, "latency-critical")
	p, _ := c.client.CoreV1().Pods("default").Get(ctx(t), "meta", metav1.GetOptions{})
	var log string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(log, "END-METADATA") {
		time.Sleep(300 * time.Millisecond)
		log = c.podLog(t, p)
	}
	// The container's output, less the CRI log prefix (time, stream, tag) of each line, up to the marker.
	var out strings.Builder
	for _, line := range strings.Split(log, "\n") {
		if f := strings.SplitN(line, " ", 4); len(f) == 4 {
			if f[3] == "END-METADATA" {
				break
			}
			out.WriteString(f[3] + "\n")
		}
	}
	var md struct {
		APIVersion string `json:"apiVersion"`
		Requests   []struct {
			Name    string `json:"name"`
			Devices []struct {
				Driver     string                                                    `json:"driver"`
				Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
			} `json:"devices"`
		} `json:"requests"`
	}
	if err := json.Unmarshal([]byte(out.String()), &md); err != nil || len(md.Requests) != 1 || len(md.Requests[0].Devices) == 0 {
		t.Fatalf("the container's metadata file: %v; the pod's log:\n%s", err, log)
	}
	dev := md.Requests[0].Devices[0]
	a := dev.Attributes
	i64 := func(k string) int64 {
		if v := a[resourceapi.QualifiedName(k)].IntValue; v != nil {
			return *v
		}
		return -1
	}
	str := func(k string) string {
		if v := a[resourceapi.QualifiedName(k)].StringValue; v != nil {
			return *v
		}
		return ""
	}
	if md.APIVersion != "metadata.resource.k8s.io/v1alpha1" || md.Requests[0].Name != "gpu" || dev.Driver != dra.DriverName ||
		i64(dra.MetaGrantedSMs) != 24 || str(dra.MetaTier) != "latency-critical" || i64(dra.MetaMemoryLimit) != 6*gib ||
		i64(dra.AttrGPU) != 0 || str(dra.AttrUUID) == "" {
		t.Errorf("the container's device metadata %+v: want %s, request gpu, driver %s, grantedSMs 24, tier latency-critical, memoryLimit %d, gpu 0, a uuid",
			md, "metadata.resource.k8s.io/v1alpha1", dra.DriverName, 6*gib)
	}
}
