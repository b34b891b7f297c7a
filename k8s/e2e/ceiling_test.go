package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What the cluster allocated is the ceiling (issue 29): each case a pod author could use to widen what the
// Kubernetes scheduler accounted for, on the real kubelet and containerd.

func (c *cluster) runTenant(t *testing.T, pod *corev1.Pod) (string, func()) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s: %v", pod.Name, err)
	}
	p := c.waitPod(t, pod.Name, 120*time.Second, "Running", running)
	return containerID(p), func() { c.deletePod(t, pod.Name) }
}

// createAwaitingEvent creates pod (deleted when the test ends) and waits up to timeout for an event of it that
// contains want; it returns the pod's events.
func (c *cluster) createAwaitingEvent(t *testing.T, pod *corev1.Pod, want string, timeout time.Duration) string {
	t.Helper()
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s: %v", pod.Name, err)
	}
	t.Cleanup(func() { c.deletePod(t, pod.Name) })
	var evs string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if evs = c.events(t, pod.Name); strings.Contains(evs, want) {
			break
		}
	}
	return evs
}

func env(kv ...string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
	}
	return out
}

// (a) A pod that asks only for detshare.io/gpu-memory is best-effort with no guaranteed SMs, whatever its own
// environment and annotations say.
func TestMemoryOnlyPodStaysBestEffort(t *testing.T) {
	c := need(t)
	pod := sharePod("mem-only", 0, 2)
	pod.Annotations = map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "100%"}
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, env("DETSHARE_TIER", "latency-critical", "DETSHARE_SMS", "100%")...)
	id, done := c.runTenant(t, pod)
	defer done()
	tn, ok := tenantOf(c.status(t), id)
	if !ok {
		t.Fatal("the pod's container is not a tenant")
	}
	if tn.Tier != "best-effort" || tn.GuaranteedSMs != 0 || tn.MemLimit != 2*gib {
		t.Errorf("gpu-memory only, asking latency-critical 100%%: tier %s, %d guaranteed SMs, memory %d; want best-effort, 0, 2 GiB",
			tn.Tier, tn.GuaranteedSMs, tn.MemLimit)
	}
}

// (b) A DRA claim's sms is bounded by the devices allocated: one SM group and sms 100% is one group.
// (c) Pod annotations (passed by this cluster's handler) and environment cannot override the claim upward.
func TestDRAClaimIsTheCeiling(t *testing.T) {
	c := need(t)
	c.createClaim(t, "one-group", 1, `{"apiVersion": "detshare.io/v1alpha1", "kind": "DetShareConfig", "tier": "latency-critical", "sms": "100%", "memory": "2Gi"}`)
	pod := claimPod("one-group", "one-group")
	pod.Annotations = map[string]string{"detshare.io/sms": "100%", "detshare.io/memory": "80Gi", "detshare.io/weight": "10000"}
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, env("DETSHARE_SMS", "120", "DETSHARE_ROLE", "decode")...)
	id, done := c.runTenant(t, pod)
	defer done()
	tn, ok := tenantOf(c.status(t), id)
	if !ok {
		t.Fatal("the pod's container is not a tenant")
	}
	if tn.Tier != "latency-critical" || tn.GuaranteedSMs != 8 || tn.MemLimit != 2*gib || tn.Weight != 1 || tn.Role != "none" {
		t.Errorf("claim of 1 group with sms 100%%, pod asking the whole GPU: tier %s, %d guaranteed SMs, memory %d, weight %d, role %s; "+
			"want latency-critical, 8, 2 GiB, 1, none", tn.Tier, tn.GuaranteedSMs, tn.MemLimit, tn.Weight, tn.Role)
	}
}

// (d) Memory is what was allocated, never unlimited: a claim without memory gets its groups' share of the GPU's, and
// a pod allocated SM groups but no detshare.io/gpu-memory is refused, naming what to ask for.
func TestMemoryIsWhatWasAllocated(t *testing.T) {
	c := need(t)
	c.createClaim(t, "no-memory", 3, "")
	id, done := c.runTenant(t, claimPod("claim-no-memory", "no-memory"))
	tn, ok := tenantOf(c.status(t), id)
	if want := uint64(80*gib) * 3 / 15 &^ (1<<20 - 1); !ok || tn.MemLimit != want || tn.GuaranteedSMs != 24 {
		t.Errorf("claim of 3 groups without memory: tenant %+v (found %v), want 24 SMs and a %d-byte limit (3/15 of 80 GiB)", tn, ok, want)
	}
	done()

	pod := sharePod("shares-no-memory", 2, 0)
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.deletePod(t, pod.Name)
	deadline := time.Now().Add(90 * time.Second)
	var evs string
	for time.Now().Before(deadline) {
		if evs = c.events(t, pod.Name); strings.Contains(evs, "detshare.io/gpu-memory") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(evs, "alloc.detshare.io/memory") || !strings.Contains(evs, "detshare.io/gpu-memory") {
		t.Errorf("detshare.io/gpu without detshare.io/gpu-memory: no refusal naming alloc.detshare.io/memory and detshare.io/gpu-memory; events:\n%s", evs)
	}
	if p, err := c.client.CoreV1().Pods("default").Get(ctx(t), pod.Name, metav1.GetOptions{}); err == nil && running(p) {
		t.Errorf("the pod without memory runs: %+v", p.Status)
	}
	for _, tn := range c.status(t).Tenants {
		if tn.Pod == pod.Name {
			t.Errorf("the refused pod is a tenant: %+v", tn)
		}
	}
}

// A pod with runtimeClassName detshare and no DetShare allocation (no detshare.io/* resource, no claim) cannot choose
// its own quota: asking by environment or pod annotation it is refused at create, naming the key and the missing
// allocation; asking nothing it runs, but as no tenant and without a GPU.
func TestPodWithoutAllocationCannotChooseItsQuota(t *testing.T) {
	c := need(t)
	pod := sharePod("no-alloc-asks", 0, 0)
	pod.Annotations = map[string]string{"detshare.io/memory": "80Gi"}
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, env("DETSHARE_TIER", "latency-critical", "DETSHARE_SMS", "100%")...)
	evs := c.createAwaitingEvent(t, pod, "no DetShare allocation", 90*time.Second)
	for _, want := range []string{"no DetShare allocation", "detshare.io/gpu-memory", "gpu.detshare.io"} {
		if !strings.Contains(evs, want) {
			t.Errorf("a pod without allocation asking latency-critical: no refusal naming %q; events:\n%s", want, evs)
		}
	}
	if !strings.Contains(evs, "DETSHARE_TIER") && !strings.Contains(evs, "detshare.io/tier") {
		t.Errorf("the refusal does not name the key the pod set; events:\n%s", evs)
	}
	if p, err := c.client.CoreV1().Pods("default").Get(ctx(t), pod.Name, metav1.GetOptions{}); err == nil && running(p) {
		t.Errorf("the pod without allocation runs: %+v", p.Status)
	}
	for _, tn := range c.status(t).Tenants {
		if tn.Pod == pod.Name {
			t.Errorf("the refused pod is a tenant: %+v", tn)
		}
	}

	quiet := sharePod("no-alloc-quiet", 0, 0)
	_, done := c.runTenant(t, quiet)
	defer done()
	for _, tn := range c.status(t).Tenants {
		if tn.Pod == quiet.Name {
			t.Errorf("a pod without allocation or DetShare keys is a tenant: %+v", tn)
		}
	}
	p, err := c.client.CoreV1().Pods("default").Get(ctx(t), quiet.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	log := ""
	for deadline := time.Now().Add(20 * time.Second); log == "" && time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		log = c.podLog(t, p) // what the probe printed before the pod's sleep
	}
	if log == "" || strings.Contains(log, "total") {
		t.Errorf("a pod without allocation: the probe's output %q, want a failed cuInit (no GPU)", log)
	}
}
