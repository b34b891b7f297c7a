package e2e

import (
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The chart's objects were applied (the cluster setup does it) and run: the device plugin, the DRA plugin and the
// node daemon as DaemonSet pods from the installer image built here, the RuntimeClass with its nodeSelector; the ServiceMonitor
// (no Prometheus operator here) selects the metrics Service's pods, and those serve metrics.
func TestHelmChartRunsPluginsAndNodeDaemon(t *testing.T) {
	c := need(t)
	for _, comp := range []string{"device-plugin", "node-daemon", "dra-plugin"} {
		var pods *corev1.PodList
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
			var err error
			if pods, err = c.client.CoreV1().Pods(chartNS).List(ctx(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + comp}); err != nil {
				t.Fatal(err)
			}
			if len(pods.Items) == 1 && running(&pods.Items[0]) {
				break
			}
		}
		if len(pods.Items) != 1 || !running(&pods.Items[0]) {
			var st []string
			for _, p := range pods.Items {
				st = append(st, fmt.Sprintf("%s %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
			}
			t.Errorf("%s: want one Running pod on the node, got %d: %v", comp, len(pods.Items), st)
		}
	}
	rc, err := c.client.NodeV1().RuntimeClasses().Get(ctx(t), "detshare", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("RuntimeClass from the chart: %v", err)
	}
	if rc.Handler != "detshare" || rc.Scheduling == nil || rc.Scheduling.NodeSelector["detshare.io/node"] != "true" {
		t.Errorf("RuntimeClass: handler %q scheduling %+v, want handler detshare and nodeSelector detshare.io/node=true", rc.Handler, rc.Scheduling)
	}
	var sm *unstructured.Unstructured
	for _, o := range c.unserved {
		if o.GetKind() == "ServiceMonitor" {
			sm = o
		} else {
			t.Errorf("rendered %s %s could not be applied: its API is not served", o.GetKind(), o.GetName())
		}
	}
	if sm == nil {
		t.Fatal("the chart rendered no ServiceMonitor")
	}
	svc, err := c.client.CoreV1().Services(chartNS).Get(ctx(t), release+"-metrics", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("metrics Service: %v", err)
	}
	want, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !reflect.DeepEqual(want, svc.Labels) && !subset(want, svc.Labels) {
		t.Errorf("ServiceMonitor selects %v, the metrics Service is labelled %v", want, svc.Labels)
	}
	body := c.metrics(t)
	if !strings.Contains(body, "detshare_") {
		t.Errorf("node daemon metrics at 127.0.0.1:%d have no detshare_ series:\n%.2000s", c.metricsPort, body)
	}
}

func subset(want, have map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// metrics scrapes the node daemon the chart runs.
func (c *cluster) metrics(t *testing.T) string {
	t.Helper()
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metricsPort))
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	t.Fatalf("node daemon metrics: %v", last)
	return ""
}
