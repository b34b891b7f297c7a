package tenant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
)

func simRunDir(t *testing.T, gpus int) string {
	t.Helper()
	t.Setenv("DETSHARE_SIMGPU", "1")
	t.Setenv("DETSHARE_SIMGPU_COUNT", fmt.Sprint(gpus))
	t.Setenv("DETSHARE_SIMGPU_SMS", "132")
	t.Setenv("DETSHARE_SIMGPU_MEM", fmt.Sprint(80<<30))
	return filepath.Join(t.TempDir(), "run")
}

// tree lists every file under dir (relative), for "nothing left behind" checks.
func tree(t *testing.T, dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

func TestRegisterEndToEnd(t *testing.T) {
	dir := simRunDir(t, 1)
	called := ""
	reg := &Registrar{DiscoverGPUs: simgpu.Discover,
		EnsureScheduler: func(d string) error { called = d; return errors.New("no scheduler in this test") }}
	res, err := reg.Register(context.Background(), dir, Request{ID: "ctr1",
		Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "25%"},
			Labels: map[string]string{"detshare.io/memory": "8Gi", "detshare.io/role": "decode"},
			Env:    []string{"DETSHARE_WEIGHT=3"}}.Resolve()})
	if err != nil {
		t.Fatal(err)
	}
	if called != dir {
		t.Errorf("EnsureScheduler called with %q", called)
	}
	// 25% of 132 SMs = 33 -> 5 groups of 8 = 40 SMs.
	if res.Placement.Groups != 5 || res.Placement.SMs != 40 || res.Placement.Wanted != 33 || res.Placement.MemLimit != 8<<30 {
		t.Errorf("placement %+v", res.Placement)
	}
	r := res.Registration
	if r.Tier != table.TierLatencyCritical || r.Role != table.RoleDecode || r.Weight != 3 || r.SMGroups != 5 || r.SMs != 40 ||
		r.MemLimit != 8<<30 || r.GPU != 0 || r.HostTenant() {
		t.Errorf("registration %+v", r)
	}
	if res.Quota.SourceOf(quota.FieldMemory) != quota.SourceLabel || res.Quota.SourceOf(quota.FieldWeight) != quota.SourceEnv {
		t.Errorf("sources %v", res.Quota.Source)
	}
	host, err := os.ReadFile(res.QuotaFile)
	if err != nil {
		t.Fatal(err)
	}
	hf, err := quota.ParseFile(host)
	if err != nil {
		t.Fatal(err)
	}
	p := table.NewPaths(dir)
	// The tier, SMs, memory and role the quota file used to repeat are the registration's (checked above, and in
	// the table the library reads below); the file holds only what libdetshare reads.
	if hf.ID != "ctr1" || hf.Slot != r.Slot || hf.SlotGen != r.Gen || hf.GPU != r.GPU ||
		hf.Table != p.Table() || hf.ClientPage != p.ClientPage("ctr1") || hf.Doorbell != p.Doorbell() {
		t.Errorf("host quota file %+v", hf)
	}
	for _, k := range []string{"tier=", "sms=", "memory=", "weight=", "role="} {
		if strings.Contains(string(host), "\n"+k) {
			t.Errorf("host quota file carries %s, which libdetshare does not read:\n%s", k, host)
		}
	}
	cq, _ := os.ReadFile(res.ContainerQuotaFile)
	cf, err := quota.ParseFile(cq)
	if err != nil || cf.Table != "/run/detshare/table" || cf.ClientPage != "/run/detshare/client.page" || cf.Doorbell != "/run/detshare/doorbell" || cf.Slot != r.Slot {
		t.Errorf("container quota file %+v %v", cf, err)
	}
	// The container copy is the host copy with in-container paths.
	if cf.FilePaths = hf.FilePaths; cf != hf {
		t.Errorf("container quota file differs from the host's in more than its paths:\nhost      %+v\ncontainer %+v", hf, cf)
	}
	tb, err := table.OpenReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := tb.Container(hf.Slot)
	if table.Tier(c.Tier) != table.TierLatencyCritical || c.SMReq != 40 || table.Role(c.Role) != table.RoleDecode ||
		c.MemLimit != 8<<30 || c.Gen != hf.SlotGen {
		t.Errorf("the table slot the quota file names: tier %d sms %d role %d memory %d gen %d, want latency-critical, 40, decode, 8 GiB, %d",
			c.Tier, c.SMReq, c.Role, c.MemLimit, c.Gen, hf.SlotGen)
	}
	tb.Close()
	for _, f := range []string{res.QuotaFile, res.ContainerQuotaFile} {
		if st, _ := os.Stat(f); st.Mode() != 0o644 {
			t.Errorf("%s mode %v", f, st.Mode())
		}
	}
	if got, ok, err := Lookup(dir, "ctr1"); err != nil || !ok || got.Registration.Slot != r.Slot {
		t.Errorf("Lookup: %+v %v %v", got, ok, err)
	}
	again, err := Register(context.Background(), dir, Request{ID: "ctr1", Quota: quota.Inputs{}.Resolve()})
	if !errors.Is(err, table.ErrExists) || again.Registration.Slot != r.Slot || again.QuotaFile != res.QuotaFile {
		t.Errorf("re-register: %+v %v", again, err)
	}
	if err := Deregister(dir, "ctr1"); err != nil {
		t.Fatal(err)
	}
	if left := tree(t, dir); strings.Join(left, " ") != "clients doorbell table table.lock tenants" {
		t.Errorf("left after deregister: %v", left)
	}
	if err := Deregister(dir, "ctr1"); !errors.Is(err, table.ErrNotFound) {
		t.Errorf("second deregister: %v", err)
	}
}

func TestRegisterFailuresLeaveNothing(t *testing.T) {
	dir := simRunDir(t, 1)
	// Validation fails before anything is created.
	_, err := Register(context.Background(), dir, Request{ID: "bad",
		Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/sms": "200%"},
			Labels: map[string]string{"detshare.io/tier": "burstable"}}.Resolve()})
	if err == nil || !strings.Contains(err.Error(), `detshare.io/sms="200%" (annotation): percent must be in 1..100`) {
		t.Fatalf("validation: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Error("run directory created by a refused registration")
	}
	if _, err := Register(context.Background(), dir, Request{ID: "a/b", Quota: quota.Inputs{}.Resolve()}); err == nil {
		t.Error("bad ID accepted")
	}
	big := Request{ID: "big",
		Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "100", "detshare.io/memory": "60Gi"}}.Resolve()}
	if _, err := Register(context.Background(), dir, big); err != nil {
		t.Fatal(err)
	}
	before := tree(t, dir)
	for _, tc := range []struct {
		req  Request
		want string
	}{
		{Request{ID: "n1", Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "24"}}.Resolve()},
			`admission refused for "n1" on GPU 0`},
		{Request{ID: "n2", Quota: quota.Inputs{Env: []string{"DETSHARE_MEMORY=30Gi"}}.Resolve()}, `60Gi of 80Gi are reserved by others ["big" 60Gi]`},
		{Request{ID: "n3", Quota: quota.Inputs{Env: []string{"DETSHARE_GPU=3"}}.Resolve()}, `DETSHARE_GPU="3" (env): no such GPU; present: 0 (SIM-`},
		{Request{ID: "n4",
			Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/gpu": "GPU-nope"}}.Resolve()}, `detshare.io/gpu="GPU-nope" (annotation): no such GPU`},
	} {
		_, err := Register(context.Background(), dir, tc.req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.req.ID, err, tc.want)
		}
	}
	// A failure while writing the quota files (the tenant directory path is taken by a file) rolls back.
	os.WriteFile(table.NewPaths(dir).TenantDir("n5"), []byte("x"), 0o644)
	if _, err := Register(context.Background(), dir, Request{ID: "n5", Quota: quota.Inputs{}.Resolve()}); err == nil {
		t.Error("registration with an unwritable tenant directory succeeded")
	}
	os.Remove(table.NewPaths(dir).TenantDir("n5"))
	if after := tree(t, dir); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Errorf("refusals left files:\nbefore %v\nafter  %v", before, after)
	}
	tb, _ := table.OpenReadOnly(dir)
	defer tb.Close()
	if l := tb.List(); len(l) != 1 {
		t.Errorf("%d registrations after refusals, want 1", len(l))
	}
}

func TestNoGPUsKnown(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	t.Setenv("DETSHARE_SIMGPU", "")
	os.Unsetenv("DETSHARE_SIMGPU")
	_, err := Register(context.Background(), dir, Request{ID: "x", Quota: quota.Inputs{}.Resolve()})
	if err == nil || !strings.Contains(err.Error(), "no GPUs are recorded") {
		t.Fatalf("without GPUs: %v", err)
	}
}

func TestAutoPlacementAndPlacer(t *testing.T) {
	dir := simRunDir(t, 2)
	lc := map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "64"}
	r1, err := Register(context.Background(), dir, Request{ID: "a", Quota: quota.Inputs{Annotations: lc}.Resolve()})
	if err != nil || r1.Registration.GPU != 0 {
		t.Fatalf("a: %+v %v", r1.Registration, err)
	}
	r2, err := Register(context.Background(), dir, Request{ID: "b", Quota: quota.Inputs{Annotations: lc}.Resolve()})
	if err != nil || r2.Registration.GPU != 1 {
		t.Fatalf("b should go to GPU 1: %+v %v", r2.Registration, err)
	}
	_, err = Register(context.Background(), dir, Request{ID: "c", Quota: quota.Inputs{Annotations: lc}.Resolve()})
	if err == nil || !strings.Contains(err.Error(), "no GPU can take") {
		t.Fatalf("c: %v", err)
	}
	var sawActive int
	r3, err := Register(context.Background(), dir, Request{ID: "d",
		Quota: quota.Inputs{}.Resolve(), Placer: placerFunc(func(id string, q quota.Quota, gpus []table.GPUState, act *quota.Existing) (int, error) {
			sawActive = act.Len()
			return 1, nil
		})})
	if err != nil || r3.Registration.GPU != 1 || sawActive != 2 {
		t.Fatalf("custom placer: %+v %v saw %d", r3.Registration, err, sawActive)
	}
}

type placerFunc func(string, quota.Quota, []table.GPUState, *quota.Existing) (int, error)

func (f placerFunc) Place(id string, q quota.Quota, g []table.GPUState, a *quota.Existing) (int, error) {
	return f(id, q, g, a)
}

// TestConcurrentAdmission: admission runs under the registration lock, so parallel registrations can never
// over-commit: 8 tenants asking 4 of 15 groups -> exactly 3 are admitted.
func TestConcurrentAdmission(t *testing.T) {
	dir := simRunDir(t, 1)
	q := quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "32"}}.Resolve()
	if ok, refused := registerRacing(t, dir, "t", 8, q); ok != 3 || refused != 5 {
		t.Fatalf("admitted %d refused %d, want 3 and 5", ok, refused)
	}
}

// registerRacing registers n tenants (prefix0, prefix1, ...) with quota q at once and counts those admitted and
// those refused by admission; any other error fails the test.
func registerRacing(t *testing.T, dir, prefix string, n int, q quota.Resolved) (ok, refused int) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, err := Register(context.Background(), dir, Request{ID: fmt.Sprint(prefix, i), Quota: q})
			mu.Lock()
			defer mu.Unlock()
			var ae *quota.AdmissionError
			switch {
			case err == nil:
				ok++
			case errors.As(err, &ae):
				refused++
			default:
				t.Errorf("%s%d: %v", prefix, i, err)
			}
		}(i)
	}
	wg.Wait()
	return ok, refused
}

func TestHostTenant(t *testing.T) {
	dir := simRunDir(t, 1)
	res, err := Register(context.Background(), dir, Request{ID: "host",
		Quota: quota.Inputs{Flags: map[quota.Field]string{quota.FieldTier: "burstable", quota.FieldSMs: "16"}}.Resolve(), OwnerPID: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Registration.HostTenant() || res.Registration.OwnerPID != os.Getpid() || res.Quota.SourceOf(quota.FieldTier) != quota.SourceFlag {
		t.Errorf("%+v", res.Registration)
	}
}

// BenchmarkRegister measures one end-to-end registration + deregistration as the hook/shim do it (open the table,
// resolve, admit, slot, client page, two quota files; then remove them).
func BenchmarkRegister(b *testing.B) {
	b.Setenv("DETSHARE_SIMGPU", "1")
	dir := filepath.Join(b.TempDir(), "run")
	req := Request{ID: "bench", Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "32",
		"detshare.io/memory": "8Gi"}}.Resolve()}
	for i := 0; i < b.N; i++ {
		if _, err := Register(context.Background(), dir, req); err != nil {
			b.Fatal(err)
		}
		if err := Deregister(dir, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}

// On a host whose GPUs cannot be discovered the registration is refused before a scheduler is started: a refused
// container must leave no scheduler process behind (issue 15).
func TestNoGPUsStartsNoScheduler(t *testing.T) {
	dir := t.TempDir()
	started := false
	reg := &Registrar{DiscoverGPUs: func() ([]table.GPUInfo, error) { return nil, errors.New("NVML: driver not loaded") },
		EnsureScheduler: func(string) error { started = true; return nil }}
	_, err := reg.Register(context.Background(), dir, Request{ID: "ctr1", Quota: quota.Inputs{}.Resolve()})
	if err == nil || !strings.Contains(err.Error(), "NVML: driver not loaded") {
		t.Fatalf("Register on a GPU-less host: %v, want the discovery error", err)
	}
	if started {
		t.Error("a scheduler was started for a registration refused for want of GPUs")
	}
	reg.DiscoverGPUs = nil
	if _, err := reg.Register(context.Background(), dir, Request{ID: "ctr2", Quota: quota.Inputs{}.Resolve()}); !errors.Is(err, ErrNoGPUs) {
		t.Fatalf("Register without discovery: %v, want ErrNoGPUs", err)
	}
	if started {
		t.Error("a scheduler was started for a registration refused for want of GPUs")
	}
}
