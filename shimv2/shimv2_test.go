package shimv2

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/hook/specmod"
	"github.com/detshare/detshare/internal/simgpu"
)

func anyOf(t *testing.T, v interface{}) *anypb.Any {
	t.Helper()
	a, err := typeurl.MarshalAny(v)
	if err != nil {
		t.Fatal(err)
	}
	return protobuf.FromAny(a)
}

func runcOpts(t *testing.T, a *anypb.Any) *options.Options {
	t.Helper()
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := v.(*options.Options)
	if !ok {
		t.Fatalf("options are %T, want *options.Options (the runc service panics otherwise)", v)
	}
	return o
}

func TestNormalizeOptionsSystemdCgroupsPath(t *testing.T) {
	const sd = "system.slice:docker:abc"
	out, err := NormalizeOptions(nil, sd)
	if err != nil || !runcOpts(t, out).SystemdCgroup {
		t.Errorf("nil options with a systemd cgroupsPath: SystemdCgroup not set (%v)", err)
	}
	out, err = NormalizeOptions(anyOf(t, &runtimeoptions.Options{ConfigBody: []byte("Root = \"/r\"\n")}), sd)
	if err != nil || !runcOpts(t, out).SystemdCgroup {
		t.Errorf("generic options without SystemdCgroup: not set (%v)", err)
	}
	out, _ = NormalizeOptions(anyOf(t, &runtimeoptions.Options{ConfigBody: []byte("SystemdCgroup = false\n")}), sd)
	if runcOpts(t, out).SystemdCgroup {
		t.Error("an explicit SystemdCgroup = false was overridden")
	}
	if out, _ := NormalizeOptions(nil, "/k8s.io/abc"); out != nil {
		t.Error("cgroupfs path got options")
	}
	in := anyOf(t, &options.Options{})
	if out, _ := NormalizeOptions(in, sd); runcOpts(t, out).SystemdCgroup {
		t.Error("genuine runc options from the engine must be kept as they are")
	}
}

func TestNormalizeOptions(t *testing.T) {
	if out, err := NormalizeOptions(nil, ""); err != nil || out != nil {
		t.Errorf("nil: %v %v", out, err)
	}
	in := anyOf(t, &options.Options{BinaryName: "/usr/sbin/runc", SystemdCgroup: true})
	out, err := NormalizeOptions(in, "")
	if err != nil || out != in {
		t.Errorf("runc options not passed through: %v", err)
	}
	body := "BinaryName = \"/opt/runc\"\nSystemdCgroup = true\nRoot = \"/run/r\"\nIoUid = 5\n"
	out, err = NormalizeOptions(anyOf(t, &runtimeoptions.Options{TypeUrl: "x", ConfigBody: []byte(body)}), "")
	if err != nil {
		t.Fatal(err)
	}
	if o := runcOpts(t, out); o.BinaryName != "/opt/runc" || !o.SystemdCgroup || o.Root != "/run/r" || o.IoUid != 5 {
		t.Errorf("converted options %+v", o)
	}
	p := filepath.Join(t.TempDir(), "shim.toml")
	os.WriteFile(p, []byte("NoPivotRoot = true\n"), 0o644)
	out, err = NormalizeOptions(anyOf(t, &runtimeoptions.Options{ConfigPath: p}), "")
	if err != nil || !runcOpts(t, out).NoPivotRoot {
		t.Errorf("ConfigPath options: %v", err)
	}
	out, err = NormalizeOptions(anyOf(t, &runtimeoptions.Options{}), "")
	if err != nil || runcOpts(t, out).BinaryName != "" {
		t.Errorf("empty generic options must become default runc options: %v", err)
	}
	_, err = NormalizeOptions(anyOf(t, &runtimeoptions.Options{ConfigBody: []byte("BinaryNmae = \"x\"\n")}), "")
	if err == nil || !strings.Contains(err.Error(), "BinaryNmae") || !strings.Contains(err.Error(), "BinaryName, Root") {
		t.Errorf("typo key: err = %v, want it named with allowed keys", err)
	}
	_, err = NormalizeOptions(anyOf(t, &runtimeoptions.Options{ConfigPath: "/nonexistent/x.toml"}), "")
	if err == nil || !strings.Contains(err.Error(), "ConfigPath") {
		t.Errorf("missing ConfigPath: %v", err)
	}
	_, err = NormalizeOptions(anyOf(t, &taskAPI.StateRequest{ID: "x"}), "")
	if err == nil || !strings.Contains(err.Error(), "allowed are") {
		t.Errorf("foreign type: %v", err)
	}
}

// fakeTask stands in for the runc task service.
type fakeTask struct {
	taskAPI.TaskService
	createErr  error
	gotOptions *anypb.Any
	creates    int
}

func (f *fakeTask) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	f.creates++
	f.gotOptions = r.Options
	if f.createErr != nil {
		return nil, f.createErr
	}
	return &taskAPI.CreateTaskResponse{Pid: 42}, nil
}

func (f *fakeTask) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	return &taskAPI.DeleteResponse{}, nil
}

func testCfg(t *testing.T) hook.Config {
	t.Helper()
	d := t.TempDir()
	t.Setenv("DETSHARE_SIMGPU", "1")
	lib := filepath.Join(d, "libdetshare.so")
	os.WriteFile(lib, []byte("x"), 0o644)
	h := filepath.Join(d, "detshare-hook")
	os.WriteFile(h, []byte("#!/bin/sh\n"), 0o755)
	return hook.Config{RunDir: filepath.Join(d, "run"), LibPath: lib, HookPath: h,
		Registrar: tenant.Registrar{DiscoverGPUs: simgpu.Discover}, Devices: cdi.Simulated{}}
}

func bundle(t *testing.T, spec string) string {
	b := t.TempDir()
	os.WriteFile(filepath.Join(b, "config.json"), []byte(spec), 0o644)
	return b
}

func TestCreateRegistersAndDeleteDeregisters(t *testing.T) {
	cfg := testCfg(t)
	inner := &fakeTask{}
	s := New(inner, cfg, func(ctx context.Context, id string) (map[string]string, error) {
		return map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16"}, nil
	})
	b := bundle(t, `{"process":{"env":["PATH=/bin"]},"root":{"path":"rootfs"}}`)
	body := anyOf(t, &runtimeoptions.Options{ConfigBody: []byte("SystemdCgroup = false\n")})
	if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "ctr1", Bundle: b, Options: body}); err != nil {
		t.Fatal(err)
	}
	runcOpts(t, inner.gotOptions)
	res, ok, _ := tenant.Lookup(cfg.RunDir, "ctr1")
	if !ok || res.Registration.SMs < 16 {
		t.Fatalf("ctr1 not registered from containerd labels: %+v", res)
	}
	sp, _ := specmod.Load(filepath.Join(b, "config.json"))
	if sp.Annotations()[specmod.TenantIDAnnotation] != "ctr1" {
		t.Error("spec not edited")
	}
	if _, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "ctr1"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "ctr1"); ok {
		t.Error("ctr1 registered after Delete")
	}
}

// The shim gives a DetShare container exactly the GPU its tenant was placed on (the simulated GPU's device node,
// a test double of /dev/nvidia<N>), once even when containerd retries the create; a plain container gets none.
func TestCreateGivesThePlacedGPUOnly(t *testing.T) {
	cfg := testCfg(t)
	t.Setenv("DETSHARE_SIMGPU_COUNT", "3")
	s := New(&fakeTask{}, cfg, nil)
	spec := `{"process":{"env":["PATH=/bin","DETSHARE_TIER=best-effort","DETSHARE_GPU=2"]},"root":{"path":"rootfs"}}`
	b := bundle(t, spec)
	for i := 0; i < 2; i++ { // the second create is a retry of the same container: nothing is added twice
		if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "gpu2", Bundle: b}); err != nil {
			t.Fatal(err)
		}
	}
	res, ok, _ := tenant.Lookup(cfg.RunDir, "gpu2")
	if !ok || res.Registration.GPU != 2 {
		t.Fatalf("gpu2 registered %v on GPU %d, want GPU 2", ok, res.Registration.GPU)
	}
	sp, _ := specmod.Load(filepath.Join(b, "config.json"))
	want := []specmod.LinuxDevice{{Path: "/dev/detshare-simgpu2", Type: "c", Major: 1, Minor: 3}}
	if got := sp.Devices(); len(got) != 1 || got[0] != want[0] {
		t.Errorf("linux.devices = %+v, want %+v", got, want)
	}
	if a := sp.Annotations()[specmod.GPUAnnotation]; a != "/dev/detshare-simgpu2" {
		t.Errorf("%s = %q", specmod.GPUAnnotation, a)
	}
	plain := `{"process":{"env":["PATH=/bin"]},"root":{"path":"rootfs"}}`
	pb := bundle(t, plain)
	if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "plain", Bundle: pb}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(pb, "config.json")); string(data) != plain {
		t.Errorf("plain container's spec edited: %s", data)
	}
}

func TestCreateSkipsSandboxAndPlainContainers(t *testing.T) {
	cfg := testCfg(t)
	s := New(&fakeTask{}, cfg, nil)
	specs := map[string]string{
		"sandbox": `{"process":{"env":["DETSHARE_TIER=best-effort"]},"annotations":{"io.kubernetes.cri.container-type":"sandbox","detshare.io/tier":"best-effort"}}`,
		"plain":   `{"process":{"env":["PATH=/bin"]},"annotations":{"io.kubernetes.cri.container-type":"container"}}`,
	}
	for id, spec := range specs {
		b := bundle(t, spec)
		if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: id, Bundle: b}); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(filepath.Join(b, "config.json"))
		if string(data) != spec {
			t.Errorf("%s: spec edited", id)
		}
		if _, ok, _ := tenant.Lookup(cfg.RunDir, id); ok {
			t.Errorf("%s registered", id)
		}
	}
}

func TestCreateRefusesBadQuotaAndRollsBackOnRuncFailure(t *testing.T) {
	t.Setenv("MAX_SHIM_VERSION", "2") // a containerd ≥1.7 daemon: the message goes through unformatted
	cfg := testCfg(t)
	inner := &fakeTask{}
	s := New(inner, cfg, nil)
	b := bundle(t, `{"annotations":{"detshare.io/tier":"burstable","detshare.io/sms":"200%"}}`)
	_, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "bad", Bundle: b})
	if err == nil || !strings.Contains(err.Error(), `detshare.io/sms="200%"`) {
		t.Fatalf("err = %v, want it to name detshare.io/sms", err)
	}
	if inner.creates != 0 {
		t.Error("runc create ran for a refused container")
	}
	inner.createErr = errors.New("runc create failed")
	b = bundle(t, `{"annotations":{"detshare.io/tier":"best-effort"}}`)
	if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "c2", Bundle: b}); err == nil {
		t.Fatal("inner failure not returned")
	}
	if _, ok, _ := tenant.Lookup(cfg.RunDir, "c2"); ok {
		t.Error("registration left after runc create failed")
	}
	for _, d := range []string{"clients", "tenants"} {
		if ents, _ := os.ReadDir(filepath.Join(cfg.RunDir, d)); len(ents) != 0 {
			t.Errorf("%s/ not empty after failures", d)
		}
	}
}

func TestInvalidArgumentEscapesPercentForOldDaemons(t *testing.T) {
	t.Setenv("MAX_SHIM_VERSION", "")
	if got := invalidArgument(errors.New("sms=\"200%\"")).Error(); !strings.Contains(got, `sms="200`+FullwidthPercent+`"`) || strings.Contains(got, "%") {
		t.Errorf("containerd 1.6 formats the message; want no '%%' in %q", got)
	}
	t.Setenv("MAX_SHIM_VERSION", "2")
	if got := invalidArgument(errors.New("sms=\"200%\"")).Error(); !strings.Contains(got, `sms="200%"`) || strings.Contains(got, "%%") {
		t.Errorf("containerd ≥1.7 does not format; got %q", got)
	}
}

// The label lookup started at the shim's start (PrefetchLabels) is what Create uses for that container: the
// quota in the labels applies and containerd is asked once; another container, or a prefetch that failed, is looked
// up at Create.
func TestPrefetchedLabels(t *testing.T) {
	cfg := testCfg(t)
	var mu sync.Mutex
	calls := map[string]int{}
	failFirst := map[string]bool{"ctr-fail": true}
	release := make(chan struct{})
	s := New(&fakeTask{}, cfg, func(ctx context.Context, id string) (map[string]string, error) {
		mu.Lock()
		calls[id]++
		n, fail := calls[id], failFirst[id]
		mu.Unlock()
		if id == "ctr-pre" {
			<-release // Create must wait for the lookup in flight, not start a second one
		}
		if fail && n == 1 {
			return nil, errors.New("containerd not reachable yet")
		}
		return map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16"}, nil
	})
	spec := `{"process":{"env":["PATH=/bin"]},"root":{"path":"rootfs"}}`
	create := func(id string) {
		t.Helper()
		if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: id, Bundle: bundle(t, spec)}); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		if res, ok, _ := tenant.Lookup(cfg.RunDir, id); !ok || res.Registration.SMs < 16 {
			t.Fatalf("%s not registered with the quota of its labels: %+v", id, res)
		}
	}
	s.PrefetchLabels("ctr-pre")
	time.AfterFunc(50*time.Millisecond, func() { close(release) })
	create("ctr-pre")
	create("ctr-other")
	s.PrefetchLabels("ctr-fail")
	create("ctr-fail")
	mu.Lock()
	defer mu.Unlock()
	if calls["ctr-pre"] != 1 || calls["ctr-other"] != 1 || calls["ctr-fail"] != 2 {
		t.Fatalf("label lookups %v: want ctr-pre once (prefetched), ctr-other once, ctr-fail twice (its prefetch failed)", calls)
	}
}
