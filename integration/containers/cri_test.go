package containers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/shimv2"
)

// criClient talks to containerd's CRI plugin over its socket, as kubelet does.
func criClient(t *testing.T, e *env) (cri.RuntimeServiceClient, func()) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+e.ctrSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial CRI: %v", err)
	}
	rt := cri.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rt.Version(ctx, &cri.VersionRequest{}); err != nil {
		conn.Close()
		t.Fatalf("CRI Version: %v (is the CRI plugin loaded? see %s)", err, filepath.Join(e.dir, "containerd.log"))
	}
	return rt, func() { conn.Close() }
}

type pod struct {
	rt     cri.RuntimeServiceClient
	id     string
	config *cri.PodSandboxConfig
}

func runPod(t *testing.T, e *env, rt cri.RuntimeServiceClient, name string, ann map[string]string) *pod {
	t.Helper()
	logDir := filepath.Join(e.dir, "pods", name)
	os.MkdirAll(logDir, 0o755)
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Uid: name + "-uid", Namespace: "default"},
		LogDirectory: logDir,
		Annotations:  ann,
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE}}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: criHandler()})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	return &pod{rt: rt, id: resp.PodSandboxId, config: cfg}
}

func (p *pod) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.id})
	p.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.id})
}

// wholeGPU is an allocation of the whole simulated GPU (its 15 groups of 8 SMs, 80 GiB) as the container annotations kubelet passes from DetShare's
// device plugin: a CRI container's quota is at most its allocation, and one without may not set its own.
var wholeGPU = map[string]string{"alloc.detshare.io/tier": "latency-critical", "alloc.detshare.io/sms": "120",
	"alloc.detshare.io/memory": "80Gi"}

// createContainer creates a container with alloc as its container annotations (nil: no allocation).
func (p *pod) createContainer(t *testing.T, name string, cmd []string, alloc map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := p.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.id, SandboxConfig: p.config,
		Config: &cri.ContainerConfig{Metadata: &cri.ContainerMetadata{Name: name}, Image: &cri.ImageSpec{Image: imageRef},
			Command: cmd, LogPath: name + ".log", Annotations: alloc}})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	return resp.ContainerId
}

func (p *pod) start(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := p.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id})
	return err
}

func (p *pod) exec(id string) func(args ...string) (string, error) {
	return func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := p.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: args, Timeout: 20})
		if err != nil {
			return "", err
		}
		out := string(resp.Stdout) + string(resp.Stderr)
		if resp.ExitCode != 0 {
			return out, fmt.Errorf("exit code %d", resp.ExitCode)
		}
		return out, nil
	}
}

func (p *pod) stopRemove(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := p.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
		t.Errorf("StopContainer: %v", err)
	}
	if _, err := p.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Errorf("RemoveContainer: %v", err)
	}
}

func TestCRIPodAnnotations(t *testing.T) {
	e := need(t)
	rt, done := criClient(t, e)
	defer done()
	p := runPod(t, e, rt, "ds-cri-ok", map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16",
		"detshare.io/memory": "768MiB", "unrelated.example/x": "y"})
	defer p.remove()
	if ids := e.registered(t); len(ids) != 0 {
		t.Errorf("the pod's pause container was registered: %v", ids)
	}
	id := p.createContainer(t, "work", []string{"sh", "-c", "simgpu-probe meminfo > /tmp/main.out 2>&1; exec sleep 300"}, wholeGPU)
	if err := p.start(id); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	r := e.waitRegistered(t, id)
	if r.MemLimit != 768<<20 || r.SMs < 16 || r.Tier != table.TierBurstable {
		t.Errorf("registration %+v: want burstable, >=16 SMs, 768 MiB from pod annotations", r)
	}
	if ids := e.registered(t); len(ids) != 1 {
		t.Errorf("registered %v, want only the workload container (not the sandbox)", ids)
	}
	exec := p.exec(id)
	checkInside(t, exec, id, 768<<20)
	main, _ := exec("cat", "/tmp/main.out")
	if got := meminfoTotal(t, main); got != 768<<20 {
		t.Errorf("main process sees %d bytes", got)
	}
	p.stopRemove(t, id)
	e.assertNoLeak(t, id)
}

func TestCRIBadQuotaFailsStartAndNothingLeaks(t *testing.T) {
	e := need(t)
	rt, done := criClient(t, e)
	defer done()
	over := map[string]string{"alloc.detshare.io/tier": "burstable", "alloc.detshare.io/sms": "16", "alloc.detshare.io/memory": "100Gi"}
	cases := []struct {
		name    string
		ann     map[string]string
		blocker bool
		want    []string
		alloc   map[string]string // the container's allocation (nil: none)
	}{
		{"no allocation", map[string]string{"detshare.io/tier": "burstable"}, false,
			[]string{`detshare.io/tier="burstable"`, "no DetShare allocation"}, nil},
		{"unknown tier", map[string]string{"detshare.io/tier": "gold"}, false, []string{`detshare.io/tier="gold"`, "latency-critical"}, wholeGPU},
		{"200% SMs", map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "200%"}, false, []string{`detshare.io/sms="200%"`}, wholeGPU},
		{"memory over GPU", nil, false, []string{`alloc.detshare.io/memory="100Gi"`, "more than GPU"}, over},
		{"admission refused", map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "50%"}, true,
			[]string{"admission refused", "blocker"}, wholeGPU},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.blocker {
				t.Setenv("DETSHARE_SIMGPU", "1")
				if _, err := registrar.Register(context.Background(), e.runDir, tenant.Request{ID: "blocker",
					Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "90%"}}.Resolve()}); err != nil {
					t.Fatalf("register blocker: %v", err)
				}
				defer tenant.Deregister(e.runDir, "blocker")
			}
			p := runPod(t, e, rt, fmt.Sprintf("ds-cri-bad%d", i), c.ann)
			defer p.remove()
			id := p.createContainer(t, "work", []string{"true"}, c.alloc)
			err := p.start(id)
			if err == nil {
				t.Fatalf("StartContainer succeeded with %v", c.ann)
			}
			t.Logf("refusal as kubelet sees it: %v", err)
			msg := strings.ReplaceAll(err.Error(), shimv2.FullwidthPercent, "%")
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not name %s: %v", w, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
				t.Errorf("RemoveContainer: %v", err)
			}
			e.assertNoLeak(t, id)
		})
	}
}

func criHandler() string {
	if h := os.Getenv("DETSHARE_E2E_CRI_HANDLER"); h != "" { // debugging: compare with plain runc
		return h
	}
	return "detshare"
}

// CRI puts every container of a pod into its sandbox's shim (annotation io.kubernetes.cri.sandbox-id, which the
// front's start reads as containerd's runc manager does): two containers and the pause container share one serving
// shim, and no shim process is started for the containers themselves.
func TestCRIPodSharesOneShim(t *testing.T) {
	e := need(t)
	rt, done := criClient(t, e)
	defer done()
	p := runPod(t, e, rt, "ds-cri-group", nil)
	defer p.remove()
	var ids []string
	for _, name := range []string{"one", "two"} {
		id := p.createContainer(t, name, []string{"sleep", "300"}, nil)
		if err := p.start(id); err != nil {
			t.Fatalf("StartContainer %s: %v", name, err)
		}
		ids = append(ids, id)
	}
	shims := func(id string) (n int) {
		for _, pid := range testenv.ProcessesNaming(id) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if argv0, _, _ := strings.Cut(string(cmd), "\x00"); strings.HasPrefix(filepath.Base(argv0), "containerd-shim-detshare") {
				n++
			}
		}
		return n
	}
	if n := shims(p.id); n != 1 {
		t.Errorf("%d shim processes serve sandbox %s, want 1", n, p.id)
	}
	for _, id := range ids {
		if n := shims(id); n != 0 {
			t.Errorf("%d shim processes were started for container %s, want 0 (it joins the sandbox's shim)", n, id)
		}
		if out, err := p.exec(id)("true"); err != nil {
			t.Errorf("exec in %s through the shared shim: %v: %s", id, err, out)
		}
	}
	for _, id := range ids {
		p.stopRemove(t, id)
	}
}
