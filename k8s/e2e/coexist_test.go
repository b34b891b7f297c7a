package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeNVIDIA is a device plugin advertising nvidia.com/gpu as NVIDIA's does: one device per GPU, named by its UUID.
type fakeNVIDIA struct {
	pluginapi.UnimplementedDevicePluginServer
	devices chan []string // each value is sent to kubelet as the new device list
}

func (f *fakeNVIDIA) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (f *fakeNVIDIA) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		select {
		case ids := <-f.devices:
			var devs []*pluginapi.Device
			for _, id := range ids {
				devs = append(devs, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
			}
			if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

// startFakeNVIDIA serves the fake on a socket in kubelet's device-plugin directory and registers it with kubelet.
func (c *cluster) startFakeNVIDIA(t *testing.T) *fakeNVIDIA {
	t.Helper()
	const sock = "e2e-nvidia-gpu.sock"
	path := filepath.Join(c.pluginDir, sock)
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNVIDIA{devices: make(chan []string, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, f)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Stop(); os.Remove(path) })
	conn, err := grpc.NewClient("unix://"+filepath.Join(c.pluginDir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx(t), &pluginapi.RegisterRequest{Version: pluginapi.Version,
		Endpoint: sock, ResourceName: "nvidia.com/gpu"}); err != nil {
		t.Fatalf("register the fake nvidia.com/gpu plugin with kubelet: %v", err)
	}
	return f
}

// waitNode waits until cond holds for the node, describing what it waited for.
func (c *cluster) waitNode(t *testing.T, what string, timeout time.Duration, cond func(*corev1.Node) bool) {
	t.Helper()
	var n *corev1.Node
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		var err error
		if n, err = c.client.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{}); err == nil && cond(n) {
			return
		}
	}
	t.Fatalf("node: not %s after %v: allocatable %v; chart pods: %s", what, timeout, n.Status.Allocatable, c.chartPods(ctx(t)))
}

// devicePluginReady tells whether the chart's device-plugin pod is Ready.
func (c *cluster) devicePluginReady(t *testing.T) bool {
	pods, err := c.client.CoreV1().Pods(chartNS).List(ctx(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release +
		",app.kubernetes.io/component=device-plugin"})
	if err != nil || len(pods.Items) != 1 {
		return false
	}
	for _, cond := range pods.Items[0].Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (c *cluster) waitDevicePluginReady(t *testing.T, want bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if c.devicePluginReady(t) == want {
			return
		}
	}
	t.Fatalf("device-plugin pod Ready is not %v after 60 s: %s", want, c.chartPods(ctx(t)))
}

// NVIDIA's device plugin on the same node (a fake registered with the real kubelet, advertising nvidia.com/gpu with
// the simulated GPU's UUID as its device, as NVIDIA's names GPUs): DetShare's device plugin stops serving that GPU
// (allocatable detshare.io/gpu 15 → 0) and its pod is not Ready; when the other plugin advertises the GPU no more,
// DetShare serves it again and is Ready.
func TestDevicePluginYieldsAGPUNVIDIAsPluginAdvertises(t *testing.T) {
	c := need(t)
	gpus := c.status(t).GPUs
	if len(gpus) == 0 || gpus[0].UUID == "" {
		t.Fatalf("detshare status shows no GPU UUID: %+v", gpus)
	}
	uuid := gpus[0].UUID
	alloc := func(n *corev1.Node, res string) int64 {
		q := n.Status.Allocatable[corev1.ResourceName(res)]
		return q.Value()
	}
	c.waitNode(t, "serving detshare.io/gpu", 60*time.Second, func(n *corev1.Node) bool { return alloc(n, "detshare.io/gpu") == 15 })
	c.waitDevicePluginReady(t, true)

	f := c.startFakeNVIDIA(t)
	released := false
	t.Cleanup(func() {
		if !released { // leave the node as the other tests expect it
			f.devices <- nil
			time.Sleep(2 * time.Second)
		}
	})
	f.devices <- []string{uuid}
	c.waitNode(t, fmt.Sprintf("advertising nvidia.com/gpu %s and no detshare.io/gpu", uuid), 60*time.Second, func(n *corev1.Node) bool {
		return alloc(n, "nvidia.com/gpu") == 1 && alloc(n, "detshare.io/gpu") == 0 && alloc(n, "detshare.io/gpu-memory") == 0
	})
	c.waitDevicePluginReady(t, false)

	f.devices <- nil
	released = true
	c.waitNode(t, "serving detshare.io/gpu again", 60*time.Second, func(n *corev1.Node) bool {
		return alloc(n, "nvidia.com/gpu") == 0 && alloc(n, "detshare.io/gpu") == 15 && alloc(n, "detshare.io/gpu-memory") == 80
	})
	c.waitDevicePluginReady(t, true)
}
