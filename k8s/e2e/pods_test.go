package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/detshare/detshare/sched/view"
)

const gib = 1 << 30

// sharePod is a pod of the workload image asking for shares SM groups and memGiB GiB through the device plugin;
// its container prints what the simulated GPU (test double) shows it, then sleeps.
func sharePod(name string, shares, memGiB int64) *corev1.Pod {
	zero, grace := false, int64(1)
	rc := "detshare"
	limits := corev1.ResourceList{}
	if shares > 0 {
		limits["detshare.io/gpu"] = *resource.NewQuantity(shares, resource.DecimalSI)
	}
	if memGiB > 0 {
		limits["detshare.io/gpu-memory"] = *resource.NewQuantity(memGiB, resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &rc,
			HostNetwork:                   true,
			AutomountServiceAccountToken:  &zero,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "work", Image: imageRef, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", "simgpu-probe meminfo; exec sleep 600"},
				Resources: corev1.ResourceRequirements{Limits: limits},
				// The simulated GPU answers only through its device node, as a real one through /dev/nvidia<N>:
				// a pod whose device plugin and runtime handler gave it no GPU fails cuInit (no "total" in its log).
				Env: []corev1.EnvVar{{Name: "DETSHARE_SIMGPU_DEVICE_DIR", Value: "/dev"}},
			}},
		},
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// waitPod waits until cond(pod) holds, failing with the pod's status and events otherwise.
func (c *cluster) waitPod(t *testing.T, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var p *corev1.Pod
	for time.Now().Before(deadline) {
		var err error
		if p, err = c.client.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{}); err == nil && cond(p) {
			return p
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("pod %s not %s after %v: status %+v\nevents:\n%s", name, what, timeout, p.Status, c.events(t, name))
	return nil
}

func running(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
}

func (c *cluster) events(t *testing.T, pod string) string {
	evs, err := c.client.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "  %s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// status runs `detshare status --json` on the cluster's run directory.
func (c *cluster) status(t *testing.T) view.Snapshot {
	t.Helper()
	out, err := exec.Command(filepath.Join(c.build, "bin/detshare"), "--run-dir", c.runDir, "status", "--json").Output()
	if err != nil {
		t.Fatalf("detshare status --json: %v: %s", err, out)
	}
	var s view.Snapshot
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("detshare status --json: %v: %s", err, out)
	}
	return s
}

func containerID(p *corev1.Pod) string {
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	return id
}

func tenantOf(s view.Snapshot, id string) (view.Tenant, bool) {
	for _, tn := range s.Tenants {
		if tn.ID == id {
			return tn, true
		}
	}
	return view.Tenant{}, false
}

// tenantGone waits up to 10 s for container id to leave the table.
func (c *cluster) tenantGone(t *testing.T, id string) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := tenantOf(c.status(t), id); !ok {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// podLog reads the container's log from kubelet's pod log directory.
func (c *cluster) podLog(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(c.podLogs, fmt.Sprintf("default_%s_%s", p.Name, p.UID), "work", "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

func (c *cluster) deletePod(t *testing.T, name string) {
	t.Helper()
	// A graceful delete (the pod's 1 s): the object goes only once kubelet has stopped the containers.
	if err := c.client.CoreV1().Pods("default").Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.client.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("pod %s not gone after 60 s", name)
}

// The device plugin advertises the simulated GPU's 15 SM groups and 80 GiB.
func TestNodeAdvertisesShares(t *testing.T) {
	c := need(t)
	n, err := c.client.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Status.Allocatable["detshare.io/gpu"]; got.Value() != 15 {
		t.Errorf("allocatable detshare.io/gpu = %v, want 15 (the simulated GPU's 132 SMs in groups of 8)", got.String())
	}
	if got := n.Status.Allocatable["detshare.io/gpu-memory"]; got.Value() != 80 {
		t.Errorf("allocatable detshare.io/gpu-memory = %v, want 80 (GiB)", got.String())
	}
}

// Two pods land on the one simulated GPU as tenants with the quotas they asked for; a third that does not fit stays
// Pending with the scheduler's reason, runs once a tenant leaves, and deleting every pod frees everything.
func TestPodsShareOneGPUWithTheirQuotas(t *testing.T) {
	c := need(t)
	pods := []struct {
		name           string
		shares, memGiB int64
	}{{"tenant-a", 6, 8}, {"tenant-b", 5, 16}}
	for _, p := range pods {
		if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), sharePod(p.name, p.shares, p.memGiB), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", p.name, err)
		}
		defer c.deletePod(t, p.name)
	}
	ids := map[string]string{}
	for _, p := range pods {
		pod := c.waitPod(t, p.name, 120*time.Second, "Running", running)
		ids[p.name] = containerID(pod)
		// What the tenant's CUDA sees: the memory quota as the GPU's total.
		deadline := time.Now().Add(20 * time.Second)
		want := fmt.Sprintf(`"total":%d`, p.memGiB*gib)
		for !strings.Contains(c.podLog(t, pod), want) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if log := c.podLog(t, pod); !strings.Contains(log, want) {
			t.Errorf("%s: the simulated GPU does not show its %d GiB quota as total; log:\n%s", p.name, p.memGiB, log)
		}
	}
	s := c.status(t)
	for _, p := range pods {
		tn, ok := tenantOf(s, ids[p.name])
		if !ok {
			t.Fatalf("%s (container %s) is not a tenant in detshare status: %+v", p.name, ids[p.name], s.Tenants)
		}
		if tn.Pod != p.name || tn.Namespace != "default" || tn.Container != "work" {
			t.Errorf("%s: tenant is pod %q namespace %q container %q, want %s/default/work", p.name, tn.Pod, tn.Namespace, tn.Container, p.name)
		}
		if tn.GPU != 0 || tn.Tier != "burstable" || tn.GuaranteedSMs != uint32(p.shares*8) || tn.MemLimit != uint64(p.memGiB*gib) {
			t.Errorf("%s: tenant gpu=%d tier=%s guaranteed_sms=%d memory_limit=%d; want gpu 0, burstable, %d SMs, %d GiB",
				p.name, tn.GPU, tn.Tier, tn.GuaranteedSMs, tn.MemLimit, p.shares*8, p.memGiB)
		}
	}

	// The node daemon the chart runs labels each tenant's series as DCGM exporter does.
	m := c.metrics(t)
	for _, p := range pods {
		want := fmt.Sprintf(`detshare_tenant_sms_guaranteed{tenant=%q,gpu="0",UUID=%q,pod=%q,namespace="default",container="work",tier="burstable",role="none"} %d`,
			ids[p.name], s.GPUs[0].UUID, p.name, p.shares*8)
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %s; tenant series:\n%s", want, grepLines(m, "detshare_tenant_sms_guaranteed"))
		}
	}

	// 6 + 5 of 15 groups are taken: 5 more do not fit.
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), sharePod("tenant-c", 5, 4), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create tenant-c: %v", err)
	}
	defer c.deletePod(t, "tenant-c")
	deadline := time.Now().Add(60 * time.Second)
	var evs string
	for time.Now().Before(deadline) {
		if evs = c.events(t, "tenant-c"); strings.Contains(evs, "FailedScheduling") && strings.Contains(evs, "Insufficient detshare.io/gpu") {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !strings.Contains(evs, "Insufficient detshare.io/gpu") {
		t.Fatalf("tenant-c: no FailedScheduling event naming detshare.io/gpu; events:\n%s", evs)
	}
	if p, _ := c.client.CoreV1().Pods("default").Get(ctx(t), "tenant-c", metav1.GetOptions{}); p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Fatalf("tenant-c: phase %s on node %q, want Pending and unscheduled", p.Status.Phase, p.Spec.NodeName)
	}
	if n := len(c.status(t).Tenants); n != 2 {
		t.Errorf("%d tenants while tenant-c is pending, want 2", n)
	}

	// tenant-a leaving frees its 6 groups: tenant-c runs.
	c.deletePod(t, "tenant-a")
	if !c.tenantGone(t, ids["tenant-a"]) {
		t.Errorf("tenant-a's container is still a tenant 10 s after the pod was deleted")
	}
	pc := c.waitPod(t, "tenant-c", 120*time.Second, "Running", running)
	if tn, ok := tenantOf(c.status(t), containerID(pc)); !ok || tn.GuaranteedSMs != 40 || tn.MemLimit != 4*gib {
		t.Errorf("tenant-c: tenant %+v (found %v), want 40 guaranteed SMs and a 4 GiB memory limit", tn, ok)
	}

	c.deletePod(t, "tenant-b")
	c.deletePod(t, "tenant-c")
	deadline = time.Now().Add(20 * time.Second)
	s = c.status(t)
	for len(s.Tenants) > 0 && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		s = c.status(t)
	}
	if len(s.Tenants) != 0 {
		t.Errorf("tenants left after every pod was deleted: %+v", s.Tenants)
	}
	// Nothing of the tenants' pods runs any more (the chart's pods in their namespace keep running).
	deadline = time.Now().Add(30 * time.Second)
	left, err := c.podObjects("default")
	for (err != nil || len(left) > 0) && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		left, err = c.podObjects("default")
	}
	if err != nil || len(left) > 0 {
		t.Errorf("after every pod was deleted, CRI still runs: %v (%v)", left, err)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A pod is a hostile tenant: it asks the scheduler for 2 SM groups and 1 GiB but claims the whole GPU,
// latency-critical, the highest weight and the decode role in its environment and in pod annotations (which this
// cluster's handler passes, pod_annotations). It gets what Kubernetes accounted for: the device plugin's allocation
// (alloc.detshare.io/*) is its ceiling, and weight and role stay within the host's limits (issue 29 c, d).
func TestPodCannotWidenItsShare(t *testing.T) {
	c := need(t)
	pod := sharePod("greedy", 2, 1)
	pod.Annotations = map[string]string{"detshare.io/sms": "100%", "detshare.io/memory": "80Gi", "detshare.io/tier": "latency-critical",
		"detshare.io/weight": "10000"}
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, []corev1.EnvVar{{Name: "DETSHARE_SMS", Value: "120"}, {Name: "DETSHARE_MEMORY", Value: "80Gi"},
		{Name: "DETSHARE_TIER", Value: "latency-critical"}, {Name: "DETSHARE_ROLE", Value: "decode"}}...)
	if _, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	defer c.deletePod(t, "greedy")
	p := c.waitPod(t, "greedy", 120*time.Second, "Running", running)
	tn, ok := tenantOf(c.status(t), containerID(p))
	if !ok {
		t.Fatal("the pod's container is not a tenant")
	}
	if tn.GuaranteedSMs != 16 || tn.MemLimit != 1<<30 || tn.Tier != "burstable" || tn.Weight != 1 || tn.Role != "none" {
		t.Errorf("greedy pod got tier %s, %d guaranteed SMs, memory limit %d, weight %d, role %s; want burstable, 16 SMs, 1 GiB "+
			"(what it was scheduled for), weight 1 and role none (the chart's tenantLimits)", tn.Tier, tn.GuaranteedSMs, tn.MemLimit, tn.Weight, tn.Role)
	}
}
