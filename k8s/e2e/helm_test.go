package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/detshare/detshare/k8s/installerimage"
)

const (
	chartNS      = "detshare-system"
	release      = "ds"
	installerTag = "docker.io/library/detshare-installer:e2e"
)

// renderChart runs `helm template` on configs/helm/detshare with the values this cluster needs: the installer image
// built here (never pulled), the test's run directory, the simulated GPU (a test double), host network with metrics
// on loopback, no installer (the test configured containerd itself), and DRA (DeviceClass and plugin, on the test's
// kubelet and CDI directories).
func (c *cluster) renderChart(metricsPort int) (string, error) {
	args := []string{"template", release, filepath.Join(c.repo, "configs/helm/detshare"), "--kube-version", "1.34.4",
		"--namespace", chartNS,
		"--set", "image.repository=detshare-installer", "--set", "image.tag=e2e", "--set", "image.pullPolicy=Never",
		"--set", "runDir=" + c.runDir, "--set", "installer.enabled=false", "--set", "hostNetwork=true",
		"--set", "nodeDaemon.metricsAddress=127.0.0.1", "--set", fmt.Sprintf("nodeDaemon.metricsPort=%d", metricsPort),
		"--set", "devicePlugin.logLevel=debug", "--set", "dra.enabled=true",
		"--set", "dra.kubeletDir=" + c.kubeletRoot, "--set", "dra.cdiDir=" + c.cdiDir(),
		"--set", "extraEnv[0].name=DETSHARE_SIMGPU", "--set-string", "extraEnv[0].value=1",
		// No kube-proxy here: the in-cluster client of the DRA plugin (host network) reaches the apiserver on loopback.
		"--set", "extraEnv[1].name=KUBERNETES_SERVICE_HOST", "--set-string", "extraEnv[1].value=127.0.0.1",
		"--set", "extraEnv[2].name=KUBERNETES_SERVICE_PORT", "--set-string", fmt.Sprintf("extraEnv[2].value=%d", c.apiPort)}
	out, err := exec.Command(c.bin["helm"], args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// deployChart imports the installer image, labels the node as a DetShare node and applies every object the chart
// renders whose API the cluster serves; the kinds it does not serve (ServiceMonitor without the Prometheus operator)
// are returned.
func (c *cluster) deployChart() error {
	img := filepath.Join(c.dir, "installer.tar")
	if err := installerimage.Pack(c.build, img, installerTag, "/bin/busybox"); err != nil {
		return fmt.Errorf("installer image: %w", err)
	}
	if out, err := c.ctr("images", "import", img); err != nil {
		return fmt.Errorf("import installer image: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	patch := []byte(`{"metadata":{"labels":{"detshare.io/node":"true"}}}`)
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, nodeName, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node: %w", err)
	}
	c.metricsPort = freePort()
	rendered, err := c.renderChart(c.metricsPort)
	if err != nil {
		return err
	}
	c.rendered = rendered
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chartNS}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
	objs, err := decodeAll(rendered)
	if err != nil {
		return err
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			c.unserved = append(c.unserved, o)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
		ri := dyn.Resource(m.Resource)
		var r dynamic.ResourceInterface = ri
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			r = ri.Namespace(chartNS)
		}
		if _, err := r.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
		}
	}
	return nil
}

func decodeAll(manifests string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(manifests)), 4096)
	var out []*unstructured.Unstructured
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode rendered chart: %w", err)
		}
		if len(o) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: o})
	}
}
