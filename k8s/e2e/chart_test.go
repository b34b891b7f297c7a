package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// The chart was installed with `helm install` (the cluster setup does it) and runs: the device plugin, the DRA plugin
// and the node daemon as DaemonSet pods from the installer image built here, the RuntimeClass with its nodeSelector,
// and the node daemon serves metrics.
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
	ds, err := c.client.AppsV1().DaemonSets(chartNS).Get(ctx(t), release+"-node", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node daemon DaemonSet: %v", err)
	}
	spec := ds.Spec.Template.Spec
	if spec.PriorityClassName != "system-node-critical" || ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("node daemon: priorityClassName %q, updateStrategy %+v; want system-node-critical, RollingUpdate maxUnavailable 1",
			spec.PriorityClassName, ds.Spec.UpdateStrategy)
	}
	if r := spec.Containers[0].Resources.Requests; r.Cpu().MilliValue() != 100 || r.Memory().Value() != 128<<20 {
		t.Errorf("node daemon requests %v, want cpu 100m memory 128Mi", r)
	}
	body := c.metrics(t)
	if !strings.Contains(body, "detshare_") {
		t.Errorf("node daemon metrics at 127.0.0.1:%d have no detshare_ series:\n%.2000s", c.metricsPort, body)
	}
}

// The chart installs with its defaults on a cluster without the Prometheus operator, and asking for a
// ServiceMonitor there leaves it out instead of failing the install (`no matches for kind "ServiceMonitor"`); where
// the API is served the ServiceMonitor is rendered and selects the metrics Service.
func TestHelmServiceMonitorOnlyWhereServed(t *testing.T) {
	c := need(t)
	out, err := c.helm("list", "--namespace", chartNS, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rels []struct{ Name, Status string }
	if err := json.Unmarshal([]byte(out), &rels); err != nil {
		t.Fatalf("helm list: %v: %s", err, out)
	}
	deployed := map[string]bool{}
	for _, r := range rels {
		deployed[r.Name] = r.Status == "deployed"
	}
	if !deployed[release] || !deployed[releaseDRA] {
		t.Errorf("helm list: %s, want releases %s and %s deployed", out, release, releaseDRA)
	}
	// --dry-run=server maps every object onto the apiserver's kinds, as an install does, and creates nothing. (Its
	// RuntimeClass is renamed: the cluster-wide one belongs to release ds, and helm refuses to adopt it.)
	args := append([]string{"install", "ds-sm", c.chartDir(), "--namespace", chartNS, "--dry-run=server"}, c.mainValues()...)
	out, err = c.helm(append(args, "--set", "serviceMonitor.enabled=true", "--set", "runtimeClass.name=ds-sm-probe")...)
	if err != nil {
		t.Fatalf("serviceMonitor.enabled=true on a cluster without the Prometheus operator: %v", err)
	}
	if strings.Contains(out, "kind: ServiceMonitor") || !strings.Contains(out, "no ServiceMonitor was created") {
		t.Errorf("without the ServiceMonitor API: want no ServiceMonitor and the NOTES warning, got:\n%s", out)
	}
	out, err = runHelm(c.bin["helm"], t.TempDir(), append([]string{"template", release, c.chartDir(), "--kube-version", k8sVersion(), "--namespace", chartNS,
		"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--set", "serviceMonitor.enabled=true"}, c.mainValues()...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifestObjects(out)
	if err != nil {
		t.Fatal(err)
	}
	var sm *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ServiceMonitor" {
			sm = o
		}
	}
	if sm == nil {
		t.Fatalf("with the ServiceMonitor API served the chart rendered no ServiceMonitor:\n%s", out)
	}
	svc, err := c.client.CoreV1().Services(chartNS).Get(ctx(t), release+"-metrics", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("metrics Service: %v", err)
	}
	want, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(want) == 0 || !subset(want, svc.Labels) {
		t.Errorf("ServiceMonitor selects %v, the metrics Service is labelled %v", want, svc.Labels)
	}
}

// values.schema.json refuses what the chart does not know, before anything reaches the cluster; the defaults pass.
func TestHelmValuesSchemaRejectsTypos(t *testing.T) {
	c := need(t)
	home := t.TempDir()
	if out, err := runHelm(c.bin["helm"], home, "template", "x", c.chartDir(), "--kube-version", k8sVersion()); err != nil {
		t.Fatalf("the defaults: %v", err)
	} else if !strings.Contains(out, "kind: DaemonSet") {
		t.Fatalf("the defaults rendered no DaemonSet:\n%s", out)
	}
	for _, tc := range []struct{ set, want string }{
		{"nodeDaemon.metricPort=9500", "metricPort"},                        // typo'd key, second level
		{"imag.tag=v1", "imag"},                                             // typo'd key, top level
		{"serviceMonitor.enable=true", "enable"},                            // typo'd key of a boolean
		{"nodeDaemon.resources.request.cpu=1", "request"},                   // typo'd key, third level
		{"nodeDaemon.updateStrategy.type=Sometimes", "updateStrategy/type"}, // not an allowed value
		{"image.pullPolicy=Sometimes", "pullPolicy"},                        // not an allowed value
		{"runtimeClass.tolerations[0].operator=Exists", "key"},              // a toleration of every taint
		{"nodeDaemon.metricsPort=http", "metricsPort"},                      // wrong type
	} {
		out, err := runHelm(c.bin["helm"], home, "template", "x", c.chartDir(), "--kube-version", k8sVersion(), "--set", tc.set)
		if err == nil {
			t.Errorf("--set %s: rendered, want a schema error", tc.set)
			continue
		}
		if !strings.Contains(out, "values don't meet the specifications of the schema") || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: want a schema error naming %q, got: %s", tc.set, tc.want, out)
		}
	}
}

// One release runs the device plugin or DRA, never both: each would account for the whole GPU.
func TestHelmRefusesDevicePluginWithDRA(t *testing.T) {
	c := need(t)
	out, err := runHelm(c.bin["helm"], t.TempDir(), "template", "x", c.chartDir(), "--kube-version", k8sVersion(), "--set", "dra.enabled=true")
	if err == nil {
		t.Fatalf("devicePlugin.enabled (default) with dra.enabled=true rendered:\n%.1000s", out)
	}
	if !strings.Contains(out, "devicePlugin.enabled and dra.enabled are both true") || !strings.Contains(out, "devicePlugin.enabled=false") {
		t.Errorf("want the message naming both values and the fix, got: %s", out)
	}
	if _, err := runHelm(c.bin["helm"], t.TempDir(), "template", "x", c.chartDir(), "--kube-version", k8sVersion(), "--set", "dra.enabled=true",
		"--set", "devicePlugin.enabled=false"); err != nil {
		t.Errorf("DRA alone: %v", err)
	}
}

// The RuntimeClass's tolerations are merged into every tenant pod: they must name GPU taints, never tolerate
// every taint (a tenant would stay on a dead node and ignore a cordon). Checked on the RuntimeClass the chart
// installed, on a tenant pod as the apiserver admits it, and on configs/kubernetes/runtimeclass.yaml.
func TestHelmRuntimeClassToleratesOnlyGPUTaints(t *testing.T) {
	c := need(t)
	rc, err := c.client.NodeV1().RuntimeClasses().Get(ctx(t), "detshare", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Scheduling == nil {
		t.Fatal("RuntimeClass detshare has no scheduling")
	}
	checkGPUTolerations(t, "the chart's RuntimeClass", rc.Scheduling.Tolerations)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "toleration-probe", Namespace: "default"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc.Name, Containers: []corev1.Container{{Name: "c", Image: imageRef}}}}
	admitted, err := c.client.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run tenant pod: %v", err)
	}
	for _, tol := range admitted.Spec.Tolerations {
		if tol.Key == "" {
			t.Errorf("an admitted tenant pod tolerates every taint: %+v (all: %+v)", tol, admitted.Spec.Tolerations)
		}
	}
	has := false
	for _, tol := range admitted.Spec.Tolerations {
		has = has || tol.Key == "nvidia.com/gpu"
	}
	if !has {
		t.Errorf("an admitted tenant pod does not tolerate nvidia.com/gpu: %+v", admitted.Spec.Tolerations)
	}
	data, err := os.ReadFile(filepath.Join(c.repo, "configs/kubernetes/runtimeclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifestObjects(string(data))
	if err != nil {
		t.Fatal(err)
	}
	var static nodev1.RuntimeClass
	if len(objs) != 1 || runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &static) != nil {
		t.Fatalf("configs/kubernetes/runtimeclass.yaml: want one RuntimeClass, got %d objects", len(objs))
	}
	if static.Scheduling == nil {
		t.Fatal("configs/kubernetes/runtimeclass.yaml: no scheduling")
	}
	checkGPUTolerations(t, "configs/kubernetes/runtimeclass.yaml", static.Scheduling.Tolerations)
}

func checkGPUTolerations(t *testing.T, what string, tols []corev1.Toleration) {
	t.Helper()
	keys := map[string]bool{}
	for _, tol := range tols {
		if tol.Key == "" || tol.Effect == corev1.TaintEffectNoExecute || tol.Effect == "" {
			t.Errorf("%s: toleration %+v: want a GPU taint key with effect NoSchedule or PreferNoSchedule", what, tol)
		}
		keys[tol.Key] = true
	}
	if !keys["nvidia.com/gpu"] || !keys["detshare.io/gpu"] {
		t.Errorf("%s: tolerations %+v, want nvidia.com/gpu and detshare.io/gpu", what, tols)
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

// helm uninstall deletes every object of the release, and the installer's preStop hook undoes what its init
// container did on the node: the handler leaves containerd's configuration (restored byte for byte), the binaries
// and the library leave the host directories. The node's directories are the test's own (restartContainerd off: the
// test's containerd is not a systemd unit).
func TestHelmUninstallRemovesObjectsAndUndoesInstaller(t *testing.T) {
	c := need(t)
	const rel, rcName = "ds-inst", "detshare-uninstall-probe"
	node := filepath.Join(c.dir, "node")
	binDir, libDir := filepath.Join(node, "usr/local/bin"), filepath.Join(node, "usr/local/lib/detshare")
	cfg, drop := filepath.Join(node, "etc/containerd/config.toml"), filepath.Join(node, "etc/containerd/conf.d/detshare.toml")
	original := "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n  default_runtime_name = \"runc\"\n" +
		"[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	if err := os.MkdirAll(filepath.Dir(cfg), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(original), 0o644); err != nil {
		t.Fatal(err)
	}
	before := fileTree(t, node)
	args := append([]string{"install", rel, c.chartDir(), "--namespace", chartNS}, c.commonValues()...)
	args = append(args, "--set", "installer.enabled=true", "--set", "installer.restartContainerd=false",
		"--set", "hostBinDir="+binDir, "--set", "hostLibDir="+libDir, "--set", "containerdConfig="+cfg,
		"--set", "containerdDropIn="+drop, "--set", "nodeDaemon.enabled=false", "--set", "devicePlugin.enabled=false",
		"--set", "runtimeClass.name="+rcName)
	if _, err := c.helm(args...); err != nil {
		t.Fatal(err)
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			c.helm("uninstall", rel, "--namespace", chartNS, "--wait", "--timeout", "2m")
		}
	})
	sel := c.waitInstallerRunning(t, rel)
	for _, b := range []string{"detshare", "detshare-hook", "detshare-runtime", "containerd-shim-detshare-v1", "containerd-shim-detshare-v1-serve"} {
		if st, err := os.Stat(filepath.Join(binDir, b)); err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("installer: %s not installed as an executable: %v", b, err)
		}
	}
	if _, err := os.Stat(filepath.Join(libDir, "libdetshare.so")); err != nil {
		t.Errorf("installer: libdetshare.so: %v", err)
	}
	if d, err := os.ReadFile(drop); err != nil || !strings.Contains(string(d), `runtime_type = "io.containerd.detshare.v1"`) ||
		!strings.Contains(string(d), filepath.Join(binDir, "containerd-shim-detshare-v1")) {
		t.Errorf("installer: drop-in %s: %v:\n%s", drop, err, d)
	}
	if d, _ := os.ReadFile(cfg); !strings.Contains(string(d), drop) {
		t.Errorf("installer: %s does not import the drop-in:\n%s", cfg, d)
	}
	manifest, err := c.helm("get", "manifest", rel, "--namespace", chartNS)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifestObjects(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.helm("uninstall", rel, "--namespace", chartNS, "--cascade", "foreground", "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	uninstalled = true
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		var err error
		switch o.GetKind() {
		case "DaemonSet":
			_, err = c.client.AppsV1().DaemonSets(chartNS).Get(ctx(t), o.GetName(), metav1.GetOptions{})
		case "RuntimeClass":
			_, err = c.client.NodeV1().RuntimeClasses().Get(ctx(t), o.GetName(), metav1.GetOptions{})
		default:
			t.Errorf("release %s has a %s the test does not check", rel, o.GetKind())
			continue
		}
		if !apierrors.IsNotFound(err) {
			t.Errorf("after helm uninstall, %s %s: %v, want NotFound", o.GetKind(), o.GetName(), err)
		}
	}
	if !kinds["DaemonSet"] || !kinds["RuntimeClass"] {
		t.Errorf("release %s had kinds %v, want the installer DaemonSet and the RuntimeClass", rel, kinds)
	}
	if pods, err := c.client.CoreV1().Pods(chartNS).List(ctx(t), sel); err != nil || len(pods.Items) != 0 {
		t.Errorf("after helm uninstall --cascade foreground --wait: pods %v (%v), want none", pods, err)
	}
	if after := fileTree(t, node); !reflect.DeepEqual(before, after) {
		t.Errorf("after helm uninstall the node's files are\n%v\nwant them as before the install\n%v", after, before)
	}
	if _, err := os.Stat(libDir); !os.IsNotExist(err) {
		t.Errorf("hostLibDir %s still there after uninstall: %v", libDir, err)
	}
}

// waitInstallerRunning waits for release rel's one pod, its installer, to run (its init container, the install, has
// finished); it returns the release's pod selector.
func (c *cluster) waitInstallerRunning(t *testing.T, rel string) metav1.ListOptions {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + rel}
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		pods, err := c.client.CoreV1().Pods(chartNS).List(ctx(t), sel)
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 1 && running(&pods.Items[0]) {
			return sel
		}
		if time.Now().After(deadline) {
			t.Fatalf("installer pod of %s not Running: %s", rel, c.chartPods(ctx(t)))
		}
	}
}

// fileTree maps each regular file under root to its content.
func fileTree(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		m[strings.TrimPrefix(p, root)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The chart's README documents every value values.schema.json allows (down to the second level: deeper keys are
// documented with their parent, as `nodeDaemon.resources`), and values.yaml sets no key the schema lacks.
func TestHelmChartREADMEDocumentsEveryValue(t *testing.T) {
	dir := filepath.Join(repoRoot(), "configs/helm/detshare")
	raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]struct {
			Properties map[string]any `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for top, p := range schema.Properties {
		paths := []string{top}
		if len(p.Properties) > 0 {
			paths = nil
			for sub := range p.Properties {
				paths = append(paths, top+"."+sub)
			}
		}
		for _, path := range paths {
			n++
			if !strings.Contains(string(readme), "`"+path+"`") {
				t.Errorf("configs/helm/detshare/README.md does not document `%s`", path)
			}
		}
	}
	if n < 30 {
		t.Errorf("values.schema.json names %d values, want the chart's ~35", n)
	}
}
