package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// These tests render the chart with the helm binary build-components.sh built (`helm template`); they need no
// cluster, so they run under DETSHARE_SKIP_K8S=1 too whenever helm is there.

func helmTemplate(t *testing.T, set ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	comps, err := components()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(cacheDir(), comps["helm"])
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("DETSHARE_SKIP_K8S") == "1" {
			t.Skipf("no helm (%v) and DETSHARE_SKIP_K8S=1", err)
		}
		t.Fatalf("helm not built (integration/kubernetes/build-components.sh helm): %v", err)
	}
	args := []string{"template", "x", filepath.Join(repoRoot(), "configs/helm/detshare"), "--kube-version", k8sVersion(), "--namespace", "ds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := runHelm(bin, t.TempDir(), args...)
	if err != nil {
		return nil, err
	}
	return manifestObjects(out)
}

// podSpecs are the pod templates of the rendered DaemonSets, by component.
func podSpecs(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		comp, _, _ := unstructured.NestedString(o.Object, "spec", "template", "metadata", "labels", "app.kubernetes.io/component")
		spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		out[comp] = spec
	}
	return out
}

func containersOf(spec map[string]any) []map[string]any {
	var out []map[string]any
	for _, k := range []string{"initContainers", "containers"} {
		cs, _, _ := unstructured.NestedSlice(spec, k)
		for _, c := range cs {
			out = append(out, c.(map[string]any))
		}
	}
	return out
}

// Least privilege (issue 29): the plugins run with no capability, no privilege escalation and a read-only root; only
// the DRA plugin (ResourceSlices, claims) and the metrics proxy get a service-account token; what stays privileged
// is the node daemon (GPU device nodes for MPS and NVML, hostPID, hostIPC) and the installer (the host's files), the
// installer with hostPID only when it restarts containerd; the metrics endpoint is on loopback by default.
func TestChartLeastPrivilege(t *testing.T) {
	objs, err := helmTemplate(t, "devicePlugin.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	dra, err := helmTemplate(t, "devicePlugin.enabled=false", "dra.enabled=true", "installer.restartContainerd=false")
	if err != nil {
		t.Fatal(err)
	}
	specs := podSpecs(t, objs)
	for comp, spec := range podSpecs(t, dra) {
		specs["dra:"+comp] = spec
	}
	for _, comp := range []string{"installer", "node-daemon", "device-plugin", "dra:dra-plugin", "dra:installer"} {
		spec, ok := specs[comp]
		if !ok {
			t.Fatalf("no DaemonSet %s rendered (have %v)", comp, keys(specs))
		}
		auto, set, _ := unstructured.NestedBool(spec, "automountServiceAccountToken")
		wantToken := comp == "dra:dra-plugin"
		if wantToken == (set && !auto) {
			t.Errorf("%s: automountServiceAccountToken %v (set %v); want a token only for the DRA plugin", comp, auto, set)
		}
		privileged := comp == "installer" || comp == "dra:installer" || comp == "node-daemon"
		for _, c := range containersOf(spec) {
			name := comp + "/" + c["name"].(string)
			priv, _, _ := unstructured.NestedBool(c, "securityContext", "privileged")
			if priv != privileged {
				t.Errorf("%s: privileged %v, want %v", name, priv, privileged)
			}
			if privileged {
				continue
			}
			esc, set, _ := unstructured.NestedBool(c, "securityContext", "allowPrivilegeEscalation")
			ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
			drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
			add, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "add")
			if !set || esc || !ro || len(drop) != 1 || drop[0] != "ALL" || len(add) != 0 {
				t.Errorf("%s: allowPrivilegeEscalation %v (set %v), readOnlyRootFilesystem %v, drop %v, add %v; want false, true, [ALL], none",
					name, esc, set, ro, drop, add)
			}
		}
		hostPID, _, _ := unstructured.NestedBool(spec, "hostPID")
		if want := comp == "node-daemon" || comp == "installer"; hostPID != want {
			t.Errorf("%s: hostPID %v, want %v", comp, hostPID, want)
		}
		hostIPC, _, _ := unstructured.NestedBool(spec, "hostIPC")
		if hostIPC != (comp == "node-daemon") {
			t.Errorf("%s: hostIPC %v", comp, hostIPC)
		}
	}
	// Metrics: loopback, no Service by default.
	for _, c := range containersOf(specs["node-daemon"]) {
		cmd, _, _ := unstructured.NestedStringSlice(c, "command")
		if !strings.Contains(strings.Join(cmd, " "), "--metrics-listen 127.0.0.1:9400") {
			t.Errorf("node daemon command %v: want --metrics-listen 127.0.0.1:9400", cmd)
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Service" {
			t.Errorf("a metrics Service by default: %s", o.GetName())
		}
	}
}

// The metrics leave the node only authenticated (kube-rbac-proxy in front of loopback) or when the admin binds them
// to every address; a Service in front of loopback is refused with the two ways out.
func TestChartMetricsBehindRBACProxy(t *testing.T) {
	_, err := helmTemplate(t, "metrics.service=true")
	if err == nil || !strings.Contains(err.Error(), "metrics.rbacProxy.enabled=true") {
		t.Errorf("metrics.service over a loopback endpoint: %v, want a refusal naming metrics.rbacProxy.enabled", err)
	}
	if _, err := helmTemplate(t, "metrics.rbacProxy.enabled=true", "nodeDaemon.metricsAddress=0.0.0.0"); err == nil {
		t.Error("rbacProxy beside an endpoint on every address: rendered, want a refusal")
	}
	objs, err := helmTemplate(t, "metrics.rbacProxy.enabled=true", "metrics.service=true")
	if err != nil {
		t.Fatal(err)
	}
	spec := podSpecs(t, objs)["node-daemon"]
	if sa, _, _ := unstructured.NestedString(spec, "serviceAccountName"); sa != "x-metrics-proxy" {
		t.Errorf("node daemon service account %q, want x-metrics-proxy", sa)
	}
	var proxy map[string]any
	for _, c := range containersOf(spec) {
		if c["name"] == "kube-rbac-proxy" {
			proxy = c
		}
	}
	args, _, _ := unstructured.NestedStringSlice(proxy, "args")
	if proxy == nil || !strings.Contains(strings.Join(args, " "), "--upstream=http://127.0.0.1:9400/") {
		t.Fatalf("no kube-rbac-proxy sidecar in front of 127.0.0.1:9400: %v", proxy)
	}
	found := map[string]bool{}
	for _, o := range objs {
		found[o.GetKind()+"/"+o.GetName()] = true
		if o.GetKind() == "Service" {
			ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			if len(ports) != 1 || ports[0].(map[string]any)["targetPort"] != "https-metrics" {
				t.Errorf("metrics Service ports %v, want only https-metrics", ports)
			}
		}
	}
	for _, want := range []string{"ServiceAccount/x-metrics-proxy", "ClusterRole/x-metrics-proxy", "ClusterRoleBinding/x-metrics-proxy", "ClusterRole/x-metrics-reader"} {
		if !found[want] {
			t.Errorf("rendered no %s", want)
		}
	}
}

// The host's limits on a tenant's weight and role reach both plugins; pods' annotations reach the handler only when
// asked for.
func TestChartTenantLimitsAndPodAnnotations(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		comp string
		want string
	}{
		{nil, "device-plugin", `--max-weight 1 --allowed-roles none`},
		{[]string{"tenantLimits.maxWeight=50", "tenantLimits.allowedRoles={none,decode}"}, "device-plugin", `--max-weight 50 --allowed-roles none,decode`},
		{[]string{"devicePlugin.enabled=false", "dra.enabled=true", "tenantLimits.maxWeight=7"}, "dra-plugin", `--max-weight 7 --allowed-roles none`},
		{[]string{"devicePlugin.enabled=false", "dra.enabled=true"}, "dra-plugin", `--allowed-roles none --device-taints auto --devices auto --device-metadata=true`},
		{[]string{"devicePlugin.enabled=false", "dra.enabled=true", "dra.deviceTaints=on"}, "dra-plugin", `--device-taints on --devices auto`},
		{[]string{"devicePlugin.enabled=false", "dra.enabled=true", "dra.devices=gpu", "dra.deviceMetadata=false"}, "dra-plugin", `--devices gpu --device-metadata=false`},
	} {
		objs, err := helmTemplate(t, tc.set...)
		if err != nil {
			t.Fatal(err)
		}
		cmd, _, _ := unstructured.NestedStringSlice(containersOf(podSpecs(t, objs)[tc.comp])[0], "command")
		if !strings.Contains(strings.Join(cmd, " "), tc.want) {
			t.Errorf("%v: %s command %v, want %s", tc.set, tc.comp, cmd, tc.want)
		}
	}
	if _, err := helmTemplate(t, "tenantLimits.allowedRoles={boss}"); err == nil {
		t.Error("tenantLimits.allowedRoles={boss}: rendered, want a schema error")
	}
	for _, opt := range []bool{false, true} {
		objs, err := helmTemplate(t, "installer.podAnnotations="+map[bool]string{false: "false", true: "true"}[opt])
		if err != nil {
			t.Fatal(err)
		}
		script, _, _ := unstructured.NestedStringSlice(containersOf(podSpecs(t, objs)["installer"])[0], "command")
		if got := strings.Contains(strings.Join(script, " "), "--pod-annotations"); got != opt {
			t.Errorf("installer.podAnnotations=%v: the install passes --pod-annotations: %v", opt, got)
		}
	}
}

// The chart's DeviceClasses: gpu.detshare.io (SMs and memory of the shared device, or SM groups) and
// whole.gpu.detshare.io (a whole GPU) select on the wholeGPU attribute every device carries, and serve the
// extended resources detshare.io/gpu-share and detshare.io/gpu-whole through DRA (KEP-5004) unless set to "".
func TestChartDeviceClassesServeExtendedResources(t *testing.T) {
	classes := func(set ...string) map[string]*unstructured.Unstructured {
		objs, err := helmTemplate(t, append([]string{"devicePlugin.enabled=false", "dra.enabled=true"}, set...)...)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*unstructured.Unstructured{}
		for _, o := range objs {
			if o.GetKind() == "DeviceClass" {
				out[o.GetName()] = o
			}
		}
		return out
	}
	got := classes()
	for name, want := range map[string]struct{ ern, cel string }{
		"gpu.detshare.io":       {"detshare.io/gpu-share", `!device.attributes["gpu.detshare.io"].wholeGPU`},
		"whole.gpu.detshare.io": {"detshare.io/gpu-whole", `&& device.attributes["gpu.detshare.io"].wholeGPU`},
	} {
		dc := got[name]
		if dc == nil {
			t.Fatalf("no DeviceClass %s among %v", name, keys(got))
		}
		ern, _, _ := unstructured.NestedString(dc.Object, "spec", "extendedResourceName")
		sel, _, _ := unstructured.NestedSlice(dc.Object, "spec", "selectors")
		if ern != want.ern || len(sel) != 1 || !strings.Contains(fmt.Sprint(sel[0]), want.cel) {
			t.Errorf("DeviceClass %s: extendedResourceName %q, selectors %v; want %q and a selector with %s", name, ern, sel, want.ern, want.cel)
		}
	}
	got = classes("dra.extendedResourceNames.shared=", "dra.extendedResourceNames.whole=")
	for name, dc := range got {
		if _, found, _ := unstructured.NestedString(dc.Object, "spec", "extendedResourceName"); found {
			t.Errorf("extended resource names set to \"\": DeviceClass %s still has one", name)
		}
	}
	if _, err := helmTemplate(t, "devicePlugin.enabled=false", "dra.enabled=true", "dra.extendedResourceNames.shared=gpu share"); err == nil {
		t.Error("dra.extendedResourceNames.shared=\"gpu share\": rendered, want a schema error")
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The DRA plugin's ClusterRole grants, on the core API, only get on nodes and, for the DetShareReady condition
// (dra.nodeCondition, on by default), patch on nodes/status; with dra.nodeCondition=false not even that.
func TestChartDRAPluginRBAC(t *testing.T) {
	for _, cond := range []bool{true, false} {
		objs, err := helmTemplate(t, "devicePlugin.enabled=false", "dra.enabled=true", fmt.Sprintf("dra.nodeCondition=%v", cond))
		if err != nil {
			t.Fatal(err)
		}
		var core []string
		for _, o := range objs {
			if o.GetKind() != "ClusterRole" || !strings.HasSuffix(o.GetName(), "-dra-plugin") {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				rule := r.(map[string]any)
				groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
				res, _, _ := unstructured.NestedStringSlice(rule, "resources")
				verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
				if len(groups) == 1 && groups[0] == "" {
					core = append(core, strings.Join(res, ",")+":"+strings.Join(verbs, ","))
				}
			}
		}
		want := []string{"nodes:get"}
		if cond {
			want = append(want, "nodes/status:patch")
		}
		if strings.Join(core, " ") != strings.Join(want, " ") {
			t.Errorf("dra.nodeCondition=%v: the DRA plugin's core-API rules %v, want %v", cond, core, want)
		}
	}
}
