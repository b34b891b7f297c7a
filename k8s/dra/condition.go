package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/gpufacts"
	"github.com/detshare/detshare/internal/kubeletdevices"
	"github.com/detshare/detshare/internal/table"
)

// ConditionType is the node condition the DRA plugin keeps on its node: True while it publishes at least one GPU,
// its message the platform it found. The DRA plugin sets it because it is the node agent that already talks to the
// apiserver (the device plugin and the node daemon run without a service-account token); it needs only patch on
// nodes/status.
const ConditionType corev1.NodeConditionType = "DetShareReady"

// Condition reasons.
const (
	ReasonPublishing = "GPUsPublished"  // at least one GPU is published
	ReasonNoGPU      = "NoGPUPublished" // every GPU is withheld (another driver publishes it)
	ReasonStopped    = "PluginStopped"  // the plugin stopped
)

// Names are the features of s, by the names docs/kubernetes.md uses.
func (s Served) Names() []string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{{s.ConsumableCapacity, "consumableCapacity"}, {s.PartitionableDevices, "partitionableDevices"}, {s.DeviceTaints, "deviceTaints"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	return out
}

// Platform is what the node's DRA plugin found: the driver (NVML), MPS (the scheduler's table), NVIDIA's container
// toolkit and CDI spec (under the host root), the apiserver's version and DRA features, and the GPUs it publishes.
type Platform struct {
	Driver     *gpufacts.Driver // nil: NVML not reachable
	DriverErr  string           // why not
	MPS        string
	Toolkit    string
	CDI        string
	Kubernetes string
	Served     Served
	Published  []int
	Withheld   []string
}

// HostPlatform fills in MPS (from the scheduler's table in runDir), NVIDIA's toolkit and its CDI spec (under
// hostRoot).
func (p *Platform) HostPlatform(hostRoot, runDir string) {
	p.MPS = "no scheduler table"
	if tb, err := table.OpenReadOnly(runDir); err == nil {
		var st []string
		for _, g := range tb.GPUs() {
			st = append(st, fmt.Sprintf("GPU %d %s", g.Index, table.MPSName(g.MPSState)))
		}
		tb.Close()
		p.MPS = strings.Join(st, ", ")
	}
	p.Toolkit = "not found"
	for _, b := range []string{"/usr/bin/nvidia-ctk", "/usr/local/bin/nvidia-ctk", "/usr/local/nvidia/toolkit/nvidia-ctk",
		"/usr/bin/nvidia-container-runtime"} {
		if _, err := os.Stat(cdi.Join(hostRoot, b)); err == nil {
			p.Toolkit = b
			break
		}
	}
	p.CDI = "no " + cdi.NVIDIAKind + " spec"
	if specs, _ := cdi.FindSpecs(hostRoot, cdi.SpecDirs, cdi.NVIDIAKind); len(specs) > 0 {
		p.CDI = cdi.NVIDIAKind + " spec " + strings.TrimPrefix(specs[0].Path, strings.TrimSuffix(hostRoot, "/"))
	}
}

// Condition is the node condition reporting p.
func (p Platform) Condition(now time.Time) corev1.NodeCondition {
	driver := "NVML not reachable"
	if p.DriverErr != "" {
		driver += " (" + p.DriverErr + ")"
	}
	if p.Driver != nil {
		driver = "driver " + p.Driver.Version
		if p.Driver.CUDAVersion > 0 {
			driver += fmt.Sprintf(" (CUDA %d.%d)", p.Driver.CUDAVersion/1000, p.Driver.CUDAVersion%1000/10)
		}
	}
	served := strings.Join(p.Served.Names(), ", ")
	if served == "" {
		served = "none"
	}
	msg := fmt.Sprintf("%s; MPS: %s; NVIDIA toolkit: %s; CDI: %s; Kubernetes %s; DRA features served: %s; GPUs published: %s",
		driver, p.MPS, p.Toolkit, p.CDI, p.Kubernetes, served, ints(p.Published))
	if len(p.Withheld) > 0 {
		msg += "; withheld or tainted: " + strings.Join(p.Withheld, "; ")
	}
	c := corev1.NodeCondition{Type: ConditionType, Status: corev1.ConditionTrue, Reason: ReasonPublishing, Message: msg,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	if len(p.Published) == 0 {
		c.Status, c.Reason = corev1.ConditionFalse, ReasonNoGPU
	}
	return c
}

func ints(v []int) string {
	if len(v) == 0 {
		return "none"
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}

// SetNodeCondition puts c on node's status (a strategic-merge patch of nodes/status: conditions merge by type, the
// kubelet's own are left alone). It keeps LastTransitionTime when the status did not change.
func SetNodeCondition(ctx context.Context, client kubernetes.Interface, node string, c corev1.NodeCondition) error {
	if n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
		for _, old := range n.Status.Conditions {
			if old.Type == c.Type && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().PatchStatus(ctx, node, patch); err != nil {
		return fmt.Errorf("set node condition %s on %s (the plugin's role needs patch on nodes/status): %w", c.Type, node, err)
	}
	return nil
}

// ConditionHeartbeat is how often the DRA plugin re-sets its node condition while nothing changes, so that its
// LastHeartbeatTime says the plugin is alive (a condition whose heartbeat is much older is stale: the plugin is gone
// without having said so).
const ConditionHeartbeat = time.Minute

// KeepNodeCondition sets the condition cond returns on node every interval until ctx ends (SetNodeCondition: its
// LastTransitionTime moves only when the status does). Failures are logged and tried again at the next beat.
func KeepNodeCondition(ctx context.Context, client kubernetes.Interface, node string, every time.Duration, cond func(now time.Time) corev1.NodeCondition) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := SetNodeCondition(ctx, client, node, cond(now)); err != nil && ctx.Err() == nil {
				logrus.WithError(err).Warn("node condition heartbeat not set")
			}
		}
	}
}

// WritePlatformFile writes p for `detshare doctor` into the plugin's directory dataDir (kubeletdevices.DRAPlatform).
func (p Platform) WritePlatformFile(dataDir string) error {
	data, err := json.MarshalIndent(kubeletdevices.DRAPlatform{Kubernetes: p.Kubernetes, Served: p.Served.Names(),
		Published: p.Published, Withheld: p.Withheld}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dataDir, kubeletdevices.PlatformFile), data, 0o644, false)
}
