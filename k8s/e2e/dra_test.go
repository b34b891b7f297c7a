package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/detshare/detshare/k8s/dra"
)

// A pod whose ResourceClaim asks the DRA driver for 4 SM groups with an opaque DetShareConfig (latency-critical,
// 4 GiB) runs as a tenant with that quota, whatever DETSHARE_* environment the pod sets itself (CDI edits replace it);
// the ResourceSlice describes the simulated GPU (a test double); deleting
// the pod frees the tenant and the claim's CDI spec.
func TestDRAClaimWithDetShareConfig(t *testing.T) {
	c := need(t)
	slices, err := c.client.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.consumable() {
		// 1.36: the GPU's counter set, then its shared and whole devices (TestDRAConsumableCapacityPacksPods checks them).
		if n := len(slices.Items); n != 2 || len(devicesOf(slices.Items)) != 2 {
			t.Fatalf("ResourceSlices on %s: want 2 of driver %s (counters; gpu0 and gpu0-whole), got %d: %+v", k8sVersion(), dra.DriverName, n, slices.Items)
		}
	} else if len(slices.Items) != 1 || slices.Items[0].Spec.Driver != dra.DriverName || len(slices.Items[0].Spec.Devices) != 15 {
		t.Fatalf("ResourceSlices: want one of driver %s with 15 SM-group devices, got %d: %+v", dra.DriverName, len(slices.Items), slices.Items)
	}
	if _, err := c.client.ResourceV1().DeviceClasses().Get(ctx(t), dra.DriverName, metav1.GetOptions{}); err != nil {
		t.Fatalf("DeviceClass %s from the Helm chart: %v", dra.DriverName, err)
	}
	c.createClaim(t, "dra-claim", 4, `{"apiVersion": "detshare.io/v1alpha1", "kind": "DetShareConfig", "tier": "latency-critical", "memory": "4Gi"}`)
	pod := claimPod("dra-tenant", "dra-claim")
	// A hostile pod's own DETSHARE_* environment, a forged ceiling among it, must not raise what its claim was
	// allocated (CDI env replaces the DETSHARE_ALLOC_* it sets; the rest is capped).
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, []corev1.EnvVar{{Name: "DETSHARE_SMS", Value: "120"},
		{Name: "DETSHARE_MEMORY", Value: "80Gi"}, {Name: "DETSHARE_ALLOC_SMS", Value: "132"}, {Name: "DETSHARE_ALLOC_MEMORY", Value: "80Gi"}}...)
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	defer c.deletePod(t, "dra-tenant")
	p := c.waitPod(t, "dra-tenant", 120*time.Second, "Running", running)
	id := containerID(p)
	tn, ok := tenantOf(c.status(t), id)
	if !ok {
		t.Fatalf("the DRA pod's container %s is not a tenant", id)
	}
	if tn.Tier != "latency-critical" || tn.GuaranteedSMs != 32 || tn.MemLimit != 4<<30 || tn.Pod != "dra-tenant" {
		t.Errorf("DRA tenant: tier %s, %d guaranteed SMs, memory limit %d, pod %q; want latency-critical, 32, 4 GiB, dra-tenant",
			tn.Tier, tn.GuaranteedSMs, tn.MemLimit, tn.Pod)
	}
	// The claim's spec, and the device metadata's (KEP-5304) that mounts its metadata file.
	specs, _ := filepath.Glob(filepath.Join(c.cdiDir(), "*.json"))
	claimSpecs, _ := filepath.Glob(filepath.Join(c.cdiDir(), "detshare.io-gpu_*.json"))
	if len(claimSpecs) != 1 || len(specs) != 2 {
		t.Errorf("CDI specs while the claim is in use: %v, want the claim's and its metadata's", specs)
	}
	c.deletePod(t, "dra-tenant")
	if !c.tenantGone(t, id) {
		t.Error("the DRA tenant is still registered 10 s after its pod was deleted")
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(specs) > 0 && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		specs, _ = filepath.Glob(filepath.Join(c.cdiDir(), "*.json"))
	}
	if len(specs) != 0 {
		data, _ := os.ReadFile(specs[0])
		t.Errorf("CDI spec left after the pod was deleted: %s", data)
	}
}

// consumable says whether the cluster serves consumable capacity and partitionable devices (Kubernetes 1.36+, its
// DRA gates on), where the driver publishes one shared device per GPU instead of its SM groups.
func (c *cluster) consumable() bool {
	gates, _ := draGates()
	return gates != nil
}

// groupsShare is groups SM groups' share of the simulated GPU's memory (80 GiB, 15 groups), in whole MiB: what the
// per-group devices give a claim that names no memory.
func groupsShare(groups int64) int64 { return 80 * gib * groups / 15 &^ (1<<20 - 1) }

// createClaim creates ResourceClaim name in default for groups SM groups of the DeviceClass, with config (a
// DetShareConfig, "" for none) as the claim's opaque configuration, and deletes it when the test ends. On a cluster
// with consumable capacity it asks the shared device for the groups' SMs and their share of the memory, what the
// per-group devices give.
func (c *cluster) createClaim(t *testing.T, name string, groups int64, config string) {
	t.Helper()
	if c.consumable() {
		c.createCapacityClaim(t, name, groups*8, groupsShare(groups), config)
		return
	}
	c.applyClaim(t, name, resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: groups}, config)
}

// createCapacityClaim creates ResourceClaim name asking the shared device of a GPU for sms SMs and memory bytes.
func (c *cluster) createCapacityClaim(t *testing.T, name string, sms, memory int64, config string) {
	t.Helper()
	c.applyClaim(t, name, resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
		Count: 1, Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]apiresource.Quantity{
			dra.CapacitySMs: *apiresource.NewQuantity(sms, apiresource.DecimalSI), dra.CapacityMemory: *apiresource.NewQuantity(memory, apiresource.BinarySI)}}}, config)
}

func (c *cluster) applyClaim(t *testing.T, name string, req resourceapi.ExactDeviceRequest, config string) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}},
		}},
	}
	if config != "" {
		claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: dra.DriverName, Parameters: runtime.RawExtension{Raw: []byte(config)}}}}}
	}
	if _, err := c.client.ResourceV1().ResourceClaims("default").Create(ctx(t), claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("ResourceClaim %s: %v", name, err)
	}
	t.Cleanup(func() {
		c.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// devicesOf lists the devices of slices.
func devicesOf(slices []resourceapi.ResourceSlice) []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range slices {
		out = append(out, s.Spec.Devices...)
	}
	return out
}

// claimPod is the workload pod using ResourceClaim claim for its container (no device-plugin resources).
func claimPod(name, claim string) *corev1.Pod {
	pod := sharePod(name, 0, 0)
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	return pod
}
