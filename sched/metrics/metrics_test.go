package metrics

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/detshare/detshare/sched/view"
)

func sampleSnap() (view.Snapshot, Extra) {
	s := view.Snapshot{Scheduler: view.Leader{PID: 1, Alive: true, Epoch: 3},
		GPUs: []view.GPU{{Index: 0, UUID: "SIM-0", SMs: 132, Groups: make([]uint32, 15), Mode: "spatial", Simulated: true, GrantChanges: 9}},
		Tenants: []view.Tenant{{ID: `we"ird\id`, GPU: 0, Tier: "latency-critical", Role: "decode", GrantedSMs: 32, GuaranteedSMs: 32,
			BusyNs: 1500000000, Launches: 42, MemUsed: 1 << 30, MemLimit: 2 << 30, QueueDelayNs: 2000000, GrantEpoch: 5,
			SLOP99Ms: 5, LatencyCount: 100, LatencyP99Ms: 4.096, SLOWithin: 97, GateDepth: 0, NarrowGroups: 3,
			MemGPUKnown: true, MemGPU: 3 << 30, MemOutside: 2 << 30,
			SLOState: "infeasible", SLOHolding: true, SLOGivenBackGroups: 4, SLOWindowP99Ms: 6.5, SLOFloorMs: 6}}}
	return s, Extra{Passes: 7, GrantChanges: 5, SLOViolations: map[string]uint64{`we"ird\id`: 2}}
}

// lineRE is the text exposition grammar for one sample line (name, optional labels, value).
var lineRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? [-+0-9.eE]+$`)

func TestWrite(t *testing.T) {
	var b strings.Builder
	s, ex := sampleSnap()
	if err := Write(&b, s, ex); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "# HELP ") || strings.HasPrefix(l, "# TYPE ") {
			continue
		}
		if !lineRE.MatchString(l) {
			t.Errorf("not valid exposition: %q", l)
		}
	}
	for _, want := range []string{
		`detshare_tenant_sms_granted{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 32`,
		`detshare_tenant_busy_seconds_total{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 1.5`,
		`detshare_tenant_slo_violations_total{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 2`,
		`detshare_tenant_memory_used_bytes{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 1073741824`,
		`detshare_tenant_memory_gpu_bytes{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 3221225472`,
		`detshare_tenant_memory_outside_bytes{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 2147483648`,
		`detshare_gpu_sms{gpu="0",uuid="SIM-0",simulated="true"} 132`,
		`detshare_tenant_slo_p99_seconds{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 0.005`,
		`detshare_tenant_slo_within_total{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 97`,
		`detshare_tenant_latency_completions_total{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 100`,
		`detshare_tenant_narrow_groups{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 3`,
		`detshare_tenant_slo_infeasible{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 1`,
		`detshare_tenant_slo_holding{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 1`,
		`detshare_tenant_slo_given_back_groups{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 4`,
		`detshare_tenant_slo_floor_seconds{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="",namespace="",container="",tier="latency-critical",role="decode"} 0.006`,
		`detshare_scheduler_up 1`,
		"# TYPE detshare_tenant_grant_changes_total counter",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// A Kubernetes tenant carries DCGM exporter's labels, so dashboards join DetShare's series with DCGM's.
func TestWriteDCGMLabels(t *testing.T) {
	s, ex := sampleSnap()
	s.Tenants[0].Pod, s.Tenants[0].Namespace, s.Tenants[0].Container = "infer-0", "team-a", "server"
	var b strings.Builder
	if err := Write(&b, s, ex); err != nil {
		t.Fatal(err)
	}
	want := `detshare_tenant_sms_guaranteed{tenant="we\"ird\\id",gpu="0",UUID="SIM-0",pod="infer-0",namespace="team-a",container="server",tier="latency-critical",role="decode"} 32`
	if !strings.Contains(b.String(), want+"\n") {
		t.Errorf("missing %q in:\n%s", want, b.String())
	}
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := Serve(ctx, "127.0.0.1:0", func() (view.Snapshot, Extra) { return sampleSnap() })
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") ||
		!strings.Contains(string(body), "detshare_scheduler_passes_total 7") {
		t.Fatalf("%d %q\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if _, err := Serve(ctx, "not an address", nil); err == nil || !strings.Contains(err.Error(), "metrics.listen") {
		t.Fatalf("bad address: %v", err)
	}
}

// TestDashboardUsesExportedMetrics keeps configs/grafana/detshare-dashboard.json in step with what Write exports.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "configs", "grafana", "detshare-dashboard.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	known := map[string]bool{}
	for _, n := range Names() {
		known[n] = true
	}
	used := 0
	re := regexp.MustCompile(`detshare_[a-z_]+`)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range re.FindAllString(tg.Expr, -1) {
				used++
				if !known[m] {
					t.Errorf("dashboard uses %s, which is not exported", m)
				}
			}
		}
	}
	if used < 10 {
		t.Fatalf("dashboard uses only %d metrics", used)
	}
}

// Tenants that ran without DetShare under [tenants] fail_open are counted where operators look (issue 13 item 6).
func TestFailOpenCounterExported(t *testing.T) {
	var b strings.Builder
	if err := Write(&b, view.Snapshot{}, Extra{FailOpens: 3}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "# TYPE detshare_fail_open_total counter\ndetshare_fail_open_total 3\n") {
		t.Errorf("no fail-open counter:\n%s", b.String())
	}
}
