package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/detshare/detshare/k8s/installerimage"
)

const (
	chartNS      = "detshare-system"
	release      = "ds"     // device plugin, node daemon, RuntimeClass, metrics Service
	releaseDRA   = "ds-dra" // the DeviceClass and the DRA plugin: a release has the device plugin or DRA, not both
	installerTag = "docker.io/library/detshare-installer:e2e"
)

// chartDir is the chart under test.
func (c *cluster) chartDir() string { return filepath.Join(c.repo, "configs/helm/detshare") }

// helm runs the helm binary build-components.sh built against this cluster, with Helm's own cache, configuration
// and data directories under the test directory so that nothing is left in $HOME.
func (c *cluster) helm(args ...string) (string, error) {
	return runHelm(c.bin["helm"], c.dir, append(args, "--kubeconfig", c.kubeconfig)...)
}

func runHelm(bin, home string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "helm/cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "helm/config"), "HELM_DATA_HOME="+filepath.Join(home, "helm/data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// commonValues are what every release of this cluster needs: the installer image built here (never pulled), the
// test's run directory, the simulated GPU (a test double), host network, and no
// installer (the test configured containerd itself).
func (c *cluster) commonValues() []string {
	return []string{"--set", "image.repository=detshare-installer", "--set", "image.tag=e2e", "--set", "image.pullPolicy=Never",
		"--set", "runDir=" + c.runDir, "--set", "installer.enabled=false", "--set", "hostNetwork=true",
		"--set", "extraEnv[0].name=DETSHARE_SIMGPU", "--set-string", "extraEnv[0].value=1",
		// No kube-proxy here: the in-cluster client of the DRA plugin (host network) reaches the apiserver on loopback.
		"--set", "extraEnv[1].name=KUBERNETES_SERVICE_HOST", "--set-string", "extraEnv[1].value=127.0.0.1",
		"--set", "extraEnv[2].name=KUBERNETES_SERVICE_PORT", "--set-string", fmt.Sprintf("extraEnv[2].value=%d", c.apiPort)}
}

// mainValues: release ds, the chart's defaults (device plugin, node daemon, RuntimeClass; no ServiceMonitor) and
// the metrics Service on this cluster.
func (c *cluster) mainValues() []string {
	// The metrics Service needs an endpoint off loopback (no kube-rbac-proxy image here): every address of the
	// host network, on a free port.
	return append(c.commonValues(), "--set-string", "nodeDaemon.metricsAddress=", "--set", "metrics.service=true",
		"--set", fmt.Sprintf("nodeDaemon.metricsPort=%d", c.metricsPort), "--set", "devicePlugin.logLevel=debug")
}

// draValues: release ds-dra, only DRA (DeviceClass and plugin, on the test's kubelet and CDI directories).
func (c *cluster) draValues() []string {
	return append(c.commonValues(), "--set", "devicePlugin.enabled=false", "--set", "nodeDaemon.enabled=false",
		"--set", "runtimeClass.enabled=false", "--set", "dra.enabled=true",
		"--set", "dra.kubeletDir="+c.kubeletRoot, "--set", "dra.cdiDir="+c.cdiDir(),
		// The NVML double (the simulated GPU's libnvidia-ml.so.1, through the node's / at /host): the plugin reads the
		// GPUs' attributes from it and watches the critical Xid errors a test injects through its Xid file; a GPU is
		// healthy again 30 s after its last one.
		"--set", "extraEnv[3].name=LD_LIBRARY_PATH", "--set-string", "extraEnv[3].value=/host"+filepath.Join(c.build, "lib/simgpu"),
		"--set", "extraEnv[4].name=DETSHARE_SIMGPU_XID", "--set-string", "extraEnv[4].value=/host"+c.xidFile(),
		"--set-string", "gpuHealth.xidHold=30s")
}

// xidFile is the NVML double's Xid file the DRA plugin's watch reads (simgpu.InjectXid).
func (c *cluster) xidFile() string { return filepath.Join(c.dir, "xid") }

// deployChart imports the installer image, labels the node as a DetShare node and installs the chart with `helm
// install` against the cluster's kube-apiserver, as a user would: release ds with the chart's defaults, release
// ds-dra with DRA only.
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
	if _, err := c.helm(append([]string{"install", release, c.chartDir(), "--namespace", chartNS, "--create-namespace"},
		c.mainValues()...)...); err != nil {
		return err
	}
	_, err := c.helm(append([]string{"install", releaseDRA, c.chartDir(), "--namespace", chartNS}, c.draValues()...)...)
	return err
}

// manifestObjects are the objects of a rendered manifest (helm template, helm get manifest).
func manifestObjects(manifests string) ([]*unstructured.Unstructured, error) {
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
