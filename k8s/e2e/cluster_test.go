package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/detshare/detshare/integration/hostleft"
	"github.com/detshare/detshare/integration/testenv"
)

// versions are the component versions, from integration/kubernetes/versions.env (the one place that names them,
// which build-components.sh builds too); DETSHARE_K8S_VERSION picks another cached Kubernetes (e.g. v1.34.4, built
// with K8S_VERSION=v1.34.4 build-components.sh kubernetes).
func versions() (map[string]string, error) {
	path := filepath.Join(repoRoot(), "integration/kubernetes/versions.env")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	v := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok || val == "" {
			return nil, fmt.Errorf("%s:%d: %q is not KEY=value", path, i+1, line)
		}
		v[key] = val
	}
	if k := os.Getenv("DETSHARE_K8S_VERSION"); k != "" {
		v["K8S_VERSION"] = k
	}
	for _, key := range []string{"CONTAINERD_VERSION", "K8S_VERSION", "ETCD_VERSION", "CNI_VERSION", "HELM_VERSION"} {
		if v[key] == "" {
			return nil, fmt.Errorf("%s: no %s", path, key)
		}
	}
	return v, nil
}

// components are the binaries build-components.sh caches, by name: their paths under the cache.
func components() (map[string]string, error) {
	v, err := versions()
	if err != nil {
		return nil, fmt.Errorf("component versions: %w", err)
	}
	k8s, ctrd := "kubernetes-"+v["K8S_VERSION"]+"/bin/", "containerd-"+v["CONTAINERD_VERSION"]+"/bin/"
	return map[string]string{
		"etcd":                    "etcd-" + v["ETCD_VERSION"] + "/bin/etcd",
		"kube-apiserver":          k8s + "kube-apiserver",
		"kube-controller-manager": k8s + "kube-controller-manager",
		"kube-scheduler":          k8s + "kube-scheduler",
		"kubelet":                 k8s + "kubelet",
		"containerd":              ctrd + "containerd",
		"ctr":                     ctrd + "ctr",
		"containerd-shim-runc-v2": ctrd + "containerd-shim-runc-v2",
		"loopback":                "cni-" + v["CNI_VERSION"] + "/bin/loopback",
		"helm":                    "helm-" + v["HELM_VERSION"] + "/bin/helm",
	}, nil
}

// draGates are the feature gates DetShare's DRA driver uses, on every component (apiserver, controller-manager,
// scheduler, kubelet) of a Kubernetes 1.36+ cluster: consumable capacity (KEP-5075) and partitionable devices
// (KEP-4815) for the shared per-GPU device, extended resources backed by DRA (KEP-5004), device taints and
// DeviceTaintRules (KEP-5055; the rules' API, resource.k8s.io/v1beta2, is off by default: runtimeConfig). All but
// DRADeviceTaintRules are beta and on by default in 1.36; naming them keeps the e2e honest if a default changes. A
// 1.34 cluster (DETSHARE_K8S_VERSION=v1.34.4) runs with its defaults, where the driver falls back to per-group
// devices.
func draGates() (gates, runtimeConfig []string) {
	var major, minor int
	if _, err := fmt.Sscanf(k8sVersion(), "%d.%d", &major, &minor); err != nil || major == 1 && minor < 36 {
		return nil, nil
	}
	return []string{"--feature-gates=DRAConsumableCapacity=true,DRAPartitionableDevices=true,DRAExtendedResource=true," +
		"DRADeviceTaints=true,DRADeviceTaintRules=true"}, []string{"--runtime-config=resource.k8s.io/v1beta2=true"}
}

// k8sVersion is the Kubernetes version the e2e runs, without the v (helm template --kube-version).
func k8sVersion() string {
	v, err := versions()
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(v["K8S_VERSION"], "v")
}

const (
	nodeName  = "detshare-e2e-node"
	imageRef  = "docker.io/library/detshare-e2e:test" // the simulated-GPU (test double) workload image
	pauseRef  = "docker.io/library/detshare-pause:test"
	criNS     = "k8s.io"
	simGPUSMs = 132 // the simulated GPU's default: an H100's 132 SMs, 15 groups of 8
)

// cluster is a one-node Kubernetes cluster on loopback.
type cluster struct {
	repo, build, dir, runDir string
	bin                      map[string]string
	daemons                  []*testenv.Daemon // in start order
	names                    []string
	launched                 []*exec.Cmd // how each daemon was started (restart starts it again)
	ctrSock, kubeconfig      string
	kubeletRoot, podLogs     string
	pluginDir                string // kubelet's device-plugin directory: a fixed host path, whatever --root-dir
	createdHostDirs          []string
	client                   *kubernetes.Clientset
	cgroupsBefore            map[string]bool
	metricsPort              int // the node daemon's metrics port (loopback)
	apiPort                  int
}

var (
	C        *cluster
	setupErr error
)

func TestMain(m *testing.M) {
	if os.Getenv("DETSHARE_SKIP_K8S") == "1" {
		fmt.Println("DETSHARE_SKIP_K8S=1: Kubernetes end-to-end tests skipped")
		os.Exit(m.Run())
	}
	// Besides what every engine suite watches: kubelet's fixed device-plugin directory and our test directories.
	finish, err := hostleft.Suite("Kubernetes suite", "/var/lib/kubelet", "/var/lib/kubelet/*", "/var/lib/kubelet/device-plugins/*",
		"/tmp/dsk8s-*")
	if err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	C, setupErr = start()
	code := m.Run()
	if C != nil {
		C.stop()
	}
	code = finish(code)
	os.Exit(code)
}

// need fails the test (skips it only with DETSHARE_SKIP_K8S=1) when the cluster could not start.
func need(t *testing.T) *cluster {
	t.Helper()
	if os.Getenv("DETSHARE_SKIP_K8S") == "1" {
		t.Skip("DETSHARE_SKIP_K8S=1")
	}
	if setupErr != nil {
		t.Fatalf("Kubernetes test cluster not available: %v", setupErr)
	}
	return C
}

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(f), "..", ".."))
}

// cacheDir is where build-components.sh cached the components (DETSHARE_K8S_CACHE).
func cacheDir() string {
	if d := os.Getenv("DETSHARE_K8S_CACHE"); d != "" {
		return d
	}
	return "/var/cache/detshare-k8s"
}

func start() (*cluster, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root (containerd, runc and kubelet run as root)")
	}
	c := &cluster{repo: repoRoot(), bin: map[string]string{}}
	cache := cacheDir()
	comps, err := components()
	if err != nil {
		return nil, err
	}
	for name, rel := range comps {
		p := filepath.Join(cache, rel)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s missing (%v): run integration/kubernetes/build-components.sh (DETSHARE_K8S_CACHE=%s)", name, err, cache)
		}
		c.bin[name] = p
	}
	c.build = os.Getenv("DETSHARE_BUILD_DIR")
	if c.build == "" {
		c.build = filepath.Join(c.repo, "build")
	}
	for _, f := range []string{"bin/detshare", "bin/detshare-hook", "bin/containerd-shim-detshare-v1", "bin/containerd-shim-detshare-v1-serve", "bin/detshare-device-plugin",
		"bin/detshare-dra-plugin", "bin/detshare-runtime",
		"lib/libdetshare.so", "lib/simgpu/libcuda.so.1", "tests/simgpu-probe"} {
		if _, err := os.Stat(filepath.Join(c.build, f)); err != nil {
			return nil, fmt.Errorf("%s missing: run `make build` first", filepath.Join(c.build, f))
		}
	}
	dir, err := os.MkdirTemp("/tmp", "dsk8s-")
	if err != nil {
		return nil, err
	}
	c.dir, c.runDir = dir, filepath.Join(dir, "run")
	c.cgroupsBefore = kubepodsCgroups()
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	steps := []struct {
		name string
		fn   func() error
	}{{"control plane", c.startControlPlane}, {"containerd", c.startContainerd}, {"kubelet", c.startKubelet},
		{"node registered", c.waitNodeRegistered}, {"helm install (device plugin, node daemon, RuntimeClass; DRA)", c.deployChart},
		{"node ready with detshare.io resources", c.waitNodeReady}, {"DRA ResourceSlices", c.waitResourceSlices}}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.fn(); err != nil {
			return nil, fmt.Errorf("%s: %w (logs in %s; DETSHARE_E2E_KEEP=1 keeps them)", s.name, err, dir)
		}
		fmt.Printf("e2e: %s up in %.1f s\n", s.name, time.Since(t0).Seconds())
	}
	ok = true
	return c, nil
}

// freePort asks the kernel for an unused loopback port.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// daemonEnv is what containerd (hence the shim and the hook) and the device plugin run with: the simulated GPU (a
// test double) and a private DetShare run directory.
func (c *cluster) daemonEnv() []string {
	return append(os.Environ(),
		"PATH="+filepath.Join(c.build, "bin")+":"+filepath.Dir(c.bin["containerd"])+":"+os.Getenv("PATH"),
		"DETSHARE_SIMGPU=1",
		"DETSHARE_RUN_DIR="+c.runDir,
		"DETSHARE_LIB="+filepath.Join(c.build, "lib/libdetshare.so"),
		"DETSHARE_HOOK="+filepath.Join(c.build, "bin/detshare-hook"),
		"DETSHARE_LOG_LEVEL=warning",
	)
}

// launch starts a component logging to dir/<name>.log.
func (c *cluster) launch(name string, env []string, args ...string) (*testenv.Daemon, error) {
	logf, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	bin := c.bin[name]
	if bin == "" {
		bin = filepath.Join(c.build, "bin", name)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	d, err := testenv.StartDaemon(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c.daemons = append(c.daemons, d)
	c.names = append(c.names, name)
	c.launched = append(c.launched, cmd)
	return d, nil
}

// waitFor polls cond until it holds, the daemon d exits or timeout passes; the error carries the log's tail.
func (c *cluster) waitFor(name string, d *testenv.Daemon, timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return nil
		}
		if d != nil && d.Exited() {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
	return fmt.Errorf("%s not ready (exited: %v): %v; log tail:\n%s", name, d != nil && d.Exited(), err, tail(string(log), 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (c *cluster) startControlPlane() error {
	p, err := newPKI(c.dir)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	tok := make([]byte, 16)
	rand.Read(tok)
	token := hex.EncodeToString(tok)
	tokens := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	gates, runtimeConfig := draGates()
	etcdPort, peerPort, apiPort := freePort(), freePort(), freePort()
	c.apiPort = apiPort
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcd, err := c.launch("etcd", nil, "--name", "e2e", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL, "--initial-cluster", "e2e="+peerURL,
		"--unsafe-no-fsync", "--log-level", "warn")
	if err != nil {
		return err
	}
	if err := c.waitFor("etcd", etcd, 30*time.Second, func() error {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", etcdPort))
		if err == nil {
			conn.Close()
		}
		return err
	}); err != nil {
		return err
	}
	api, err := c.launch("kube-apiserver", nil, append([]string{"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(apiPort), "--cert-dir", filepath.Join(c.dir, "apiserver"),
		"--tls-cert-file", p.ServerCert, "--tls-private-key-file", p.ServerKey, "--client-ca-file", p.CA,
		"--token-auth-file", tokens, "--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", p.SAPub,
		"--service-account-signing-key-file", p.SAKey, "--service-cluster-ip-range", "10.0.0.0/24",
		"--allow-privileged=true", "--profiling=false"}, append(gates, runtimeConfig...)...)...)
	if err != nil {
		return err
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://127.0.0.1:%d", certificate-authority: %q}
users:
- name: admin
  user: {token: %q}
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
`, apiPort, p.CA, token)
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return err
	}
	if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if err := c.waitFor("kube-apiserver", api, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return err
	}
	if _, err := c.launch("kube-controller-manager", nil, append([]string{"--kubeconfig", c.kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(freePort()), "--service-account-private-key-file", p.SAKey,
		"--root-ca-file", p.CA, "--use-service-account-credentials=false", "--controllers", "*,-csrsigning,-csrapproving,-csrcleaner"},
		gates...)...); err != nil {
		return err
	}
	if _, err := c.launch("kube-scheduler", nil, append([]string{"--kubeconfig", c.kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(freePort())}, gates...)...); err != nil {
		return err
	}
	// The controller manager is up when it created the default namespace's service account pods need.
	return c.waitFor("kube-controller-manager", nil, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func (c *cluster) startContainerd() error {
	c.ctrSock = filepath.Join(c.dir, "containerd.sock")
	cniConf, cniBin := filepath.Join(c.dir, "cni-conf"), filepath.Dir(c.bin["loopback"])
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return err
	}
	// Pods here use the host network; a loopback-only network makes the runtime report NetworkReady.
	if err := os.WriteFile(filepath.Join(cniConf, "10-loopback.conflist"),
		[]byte(`{"cniVersion": "1.0.0", "name": "lo", "plugins": [{"type": "loopback"}]}`), 0o644); err != nil {
		return err
	}
	// The device plugin's allocation (container annotations alloc.detshare.io/*) passes to the DetShare handler, and
	// so do pods' own detshare.io/* annotations: the worst case, an admin who opted in (detshare install containerd
	// --pod-annotations), in which a pod still cannot give itself more than the scheduler accounted for.
	cfg := testenv.ContainerdConfig{Major: 2, Root: filepath.Join(c.dir, "ctrd-root"), State: filepath.Join(c.dir, "ctrd-state"),
		Socket: c.ctrSock, SandboxImage: pauseRef, CNIBin: cniBin, CNIConf: cniConf,
		PodAnnotations: []string{"detshare.io/*"}, ContainerAnnotations: []string{"alloc.detshare.io/*"}, CDISpecDirs: []string{c.cdiDir()}}.Render()
	cfgPath := filepath.Join(c.dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	d, err := c.launch("containerd", c.daemonEnv(), "--config", cfgPath)
	if err != nil {
		return err
	}
	if err := c.waitFor("containerd", d, 30*time.Second, func() error { _, err := c.ctr("version"); return err }); err != nil {
		return err
	}
	work, err := testenv.WorkloadImage(c.dir, c.build)
	if err != nil {
		return fmt.Errorf("workload image: %w", err)
	}
	pause, err := testenv.PauseImage(c.dir)
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	for _, img := range []string{work, pause} {
		if out, err := c.ctr("images", "import", img); err != nil {
			return fmt.Errorf("import %s: %v: %s", img, err, out)
		}
	}
	return nil
}

func (c *cluster) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// stdout only: containerd 2.2's ctr warns about cgroup v1 on stderr, which must not read as an ID.
	cmd := exec.CommandContext(ctx, c.bin["ctr"], append([]string{"--address", c.ctrSock, "--namespace", criNS}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func (c *cluster) startKubelet() error {
	c.kubeletRoot, c.podLogs = filepath.Join(c.dir, "kubelet"), filepath.Join(c.dir, "pod-logs")
	// kubelet serves device-plugin registration at /var/lib/kubelet/device-plugins/kubelet.sock whatever its root
	// directory; remember what we create there to remove it at the end.
	c.pluginDir = "/var/lib/kubelet/device-plugins"
	for _, d := range []string{"/var/lib/kubelet", c.pluginDir} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			c.createdHostDirs = append(c.createdHostDirs, d)
		}
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
containerRuntimeEndpoint: unix://%s
# cgroup v1 without systemd, and no swap accounting: the CI machine's shape.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# The CI root lacks CAP_SYS_RESOURCE: kubelet must not lower its own oom_score_adj.
oomScoreAdj: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {"memory.available": "1Mi", "nodefs.available": "1%%", "imagefs.available": "1%%", "nodefs.inodesFree": "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: %q
resolvConf: ""
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
localStorageCapacityIsolation: false
`, freePort(), freePort(), c.ctrSock, c.podLogs)
	cfgPath := filepath.Join(c.dir, "kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	gates, _ := draGates()
	d, err := c.launch("kubelet", nil, append([]string{"--config", cfgPath, "--kubeconfig", c.kubeconfig, "--root-dir", c.kubeletRoot,
		"--hostname-override", nodeName, "--cert-dir", filepath.Join(c.dir, "kubelet-pki"), "--v", "2"}, gates...)...)
	if err != nil {
		return err
	}
	return c.waitFor("kubelet", d, 120*time.Second, func() error {
		_, err := os.Stat(filepath.Join(c.pluginDir, "kubelet.sock"))
		return err
	})
}

func (c *cluster) cdiDir() string { return filepath.Join(c.dir, "cdi") }

// waitResourceSlices waits for the DRA plugin the chart runs to publish the GPU.
func (c *cluster) waitResourceSlices() error {
	return c.waitFor("kubelet", c.daemons[len(c.daemons)-1], 120*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return fmt.Errorf("no ResourceSlice published yet; chart pods: %s", c.chartPods(ctx))
		}
		return nil
	})
}

// chartPods describes the chart's pods, for errors.
func (c *cluster) chartPods(ctx context.Context) string {
	var pods []string
	if l, err := c.client.CoreV1().Pods(chartNS).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range l.Items {
			pods = append(pods, fmt.Sprintf("%s %s %v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
		}
	}
	return strings.Join(pods, "; ")
}

// waitNodeRegistered waits for kubelet to register the node.
func (c *cluster) waitNodeRegistered() error {
	return c.waitFor("kubelet", c.daemons[len(c.daemons)-1], 120*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err
	})
}

// waitNodeReady waits for the node to be Ready with the device plugin's resources in its allocatable.
func (c *cluster) waitNodeReady() error {
	return c.waitFor("kubelet", c.daemons[len(c.daemons)-1], 180*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := c.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			return fmt.Errorf("node not Ready: %v", n.Status.Conditions)
		}
		if q := n.Status.Allocatable["detshare.io/gpu"]; q.Value() == 0 {
			return fmt.Errorf("node allocatable has no detshare.io/gpu yet: %v; chart pods: %s", n.Status.Allocatable, c.chartPods(ctx))
		}
		return nil
	})
}

func (c *cluster) stop() {
	if c.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		zero := int64(0)
		c.client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		cancel()
	}
	// kubelet first (it would restart what we remove), then the node's containers, then the rest in reverse order.
	for i := len(c.daemons) - 1; i >= 0; i-- {
		if c.names[i] == "kubelet" {
			testenv.StopDaemon(c.daemons[i])
		}
	}
	if c.ctrSock != "" {
		c.removeSandboxes()
		if out, err := c.ctr("tasks", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				c.ctr("tasks", "kill", "-s", "SIGKILL", id)
				time.Sleep(100 * time.Millisecond)
				c.ctr("tasks", "rm", "-f", id)
			}
		}
		if out, err := c.ctr("containers", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				c.ctr("containers", "rm", id)
			}
		}
	}
	for i := len(c.daemons) - 1; i >= 0; i-- {
		testenv.StopDaemon(c.daemons[i])
	}
	testenv.StopScheduler(c.runDir)
	if c.dir != "" {
		c.killStragglers()
	}
	removeNewCgroups(c.cgroupsBefore)
	if c.pluginDir != "" {
		for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint", "detshare-gpu.sock", "detshare-gpu-memory.sock"} {
			os.Remove(filepath.Join(c.pluginDir, f))
		}
	}
	for i := len(c.createdHostDirs) - 1; i >= 0; i-- {
		os.Remove(c.createdHostDirs[i]) // only when empty
	}
	if c.dir == "" {
		return
	}
	if os.Getenv("DETSHARE_E2E_KEEP") == "1" {
		fmt.Println("DETSHARE_E2E_KEEP=1: test directory kept:", c.dir)
		return
	}
	testenv.UnmountUnder(c.dir)
	os.RemoveAll(c.dir)
}
