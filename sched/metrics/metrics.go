// Package metrics exports the scheduler's view in the Prometheus text exposition format (version 0.0.4), written by
// hand to keep the scheduler free of heavy dependencies. Scrapes read the table and the client pages read-only at
// scrape time; nothing is computed on the scheduler's decision path.
package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/sched/view"
)

// Extra are the counters only the scheduler process knows.
type Extra struct {
	Passes, GrantChanges, Reaped, MemoryKills, TokenHandoffs, Reloads uint64
	// FailOpens counts tenants that asked for DetShare and ran without it under [tenants] fail_open
	// (<run dir>/fail-open.log, internal/failopen).
	FailOpens       uint64
	LastPassSeconds float64
	// Per tenant ID.
	SLOViolations map[string]uint64
	Reasons       map[string]string
}

// Source produces what one scrape exports.
type Source func() (view.Snapshot, Extra)

type family struct {
	name, help, typ string
	samples         []sample
}

type sample struct {
	labels [][2]string
	value  float64
}

func (f *family) add(v float64, labels ...string) {
	s := sample{value: v}
	for i := 0; i+1 < len(labels); i += 2 {
		s.labels = append(s.labels, [2]string{labels[i], labels[i+1]})
	}
	f.samples = append(f.samples, s)
}

// Write renders snap and ex in the text format.
func Write(w io.Writer, snap view.Snapshot, ex Extra) error {
	var fams []*family
	nf := func(name, typ, help string) *family {
		f := &family{name: name, typ: typ, help: help}
		fams = append(fams, f)
		return f
	}
	up := nf("detshare_scheduler_up", "gauge", "1 when a scheduler leader is alive (heartbeat fresh)")
	up.add(b2f(snap.Scheduler.Alive))
	ep := nf("detshare_scheduler_epoch", "gauge", "leader takeovers so far")
	ep.add(float64(snap.Scheduler.Epoch))
	nf("detshare_scheduler_passes_total", "counter", "decision passes").add(float64(ex.Passes))
	nf("detshare_scheduler_grant_changes_total", "counter", "grants published").add(float64(ex.GrantChanges))
	nf("detshare_scheduler_reaped_total", "counter", "dead processes, tenants and registrations cleaned up").add(float64(ex.Reaped))
	nf("detshare_scheduler_memory_kills_total", "counter", "tenant processes killed because the tenant held device memory past the library beyond its quota (tenants.memory_outside = kill)").add(float64(ex.MemoryKills))
	nf("detshare_scheduler_token_handoffs_total", "counter", "temporal tokens handed over").add(float64(ex.TokenHandoffs))
	nf("detshare_scheduler_reloads_total", "counter", "configuration reloads (SIGHUP)").add(float64(ex.Reloads))
	nf("detshare_fail_open_total", "counter", "tenants that asked for DetShare and ran without it (host policy fail_open)").add(float64(ex.FailOpens))
	nf("detshare_scheduler_last_pass_seconds", "gauge", "duration of the last decision pass").add(ex.LastPassSeconds)

	gsm := nf("detshare_gpu_sms", "gauge", "SMs of the GPU")
	ggr := nf("detshare_gpu_sm_groups", "gauge", "SM groups of the GPU's split")
	gmode := nf("detshare_gpu_spatial", "gauge", "1 when the GPU is partitioned spatially (MPS), 0 when temporal")
	gch := nf("detshare_gpu_grant_changes_total", "counter", "grants published on the GPU")
	uuid := map[int]string{} // tenants carry their GPU's UUID (DCGM's label)
	for _, g := range snap.GPUs {
		uuid[g.Index] = g.UUID
		l := []string{"gpu", strconv.Itoa(g.Index), "uuid", g.UUID, "simulated", strconv.FormatBool(g.Simulated)}
		gsm.add(float64(g.SMs), l...)
		ggr.add(float64(len(g.Groups)), l...)
		gmode.add(b2f(g.Mode == "spatial"), l...)
		gch.add(float64(g.GrantChanges), l...)
	}
	tg := nf("detshare_tenant_sms_granted", "gauge", "SMs granted to the tenant")
	tq := nf("detshare_tenant_sms_guaranteed", "gauge", "SMs guaranteed to the tenant")
	tb := nf("detshare_tenant_busy_seconds_total", "counter", "time the tenant had work queued")
	tl := nf("detshare_tenant_launches_total", "counter", "kernel launches")
	tm := nf("detshare_tenant_memory_used_bytes", "gauge", "device memory held")
	tml := nf("detshare_tenant_memory_limit_bytes", "gauge", "device memory quota (0 = unlimited)")
	tmg := nf("detshare_tenant_memory_gpu_bytes", "gauge", "device memory NVML reports for the tenant's processes (absent without NVML)")
	tmo := nf("detshare_tenant_memory_outside_bytes", "gauge", "device memory the tenant's processes hold that the library did not charge (NVML's figure minus memory_used; absent without NVML)")
	tqd := nf("detshare_tenant_queue_delay_seconds_total", "counter", "cumulative wait for SMs or the token")
	tgc := nf("detshare_tenant_grant_changes_total", "counter", "grant changes of the tenant's slot")
	tslo := nf("detshare_tenant_slo_violations_total", "counter", "latency-tier demand answered later than scheduler.latency_slo")
	tdem := nf("detshare_tenant_demand", "gauge", "processes of the tenant with queued work")
	tlc := nf("detshare_tenant_latency_completions_total", "counter", "completions observed by the library (synchronisations that waited for work)")
	tlp := nf("detshare_tenant_latency_p99_seconds", "gauge", "P99 of the observed completion latency since registration (histogram bucket upper edge)")
	tst := nf("detshare_tenant_slo_p99_seconds", "gauge", "the tenant's latency target (slo-p99), 0 = none")
	tsw := nf("detshare_tenant_slo_within_total", "counter", "completions certainly within the tenant's slo-p99")
	tgd := nf("detshare_tenant_gate_depth", "gauge", "dispatch gate: kernels in flight per stream (0 = no gate)")
	tng := nf("detshare_tenant_narrow_groups", "gauge", "SM groups of its grant its memory-bound kernels run on beside a latency-critical tenant (0 = all)")
	tgw := nf("detshare_tenant_gate_waits_total", "counter", "launches the dispatch gate held back")
	tsb := nf("detshare_tenant_slo_given_back_groups", "gauge", "SLO controller: SM groups of a latency-critical tenant's expansion left to lower tiers while it is busy")
	tsp := nf("detshare_tenant_slo_window_p99_seconds", "gauge", "SLO controller: P99 of its last window")
	tsf := nf("detshare_tenant_slo_floor_seconds", "gauge", "SLO controller: P99 measured at the most protective share (0 = not measured)")
	tsi := nf("detshare_tenant_slo_infeasible", "gauge", "SLO controller: 1 when the SLO is missed even at the most protective share")
	tsh := nf("detshare_tenant_slo_holding", "gauge", "SLO controller: 1 while an SLO not attainable holds the largest share whose P99 was within 10% of the floor")
	for _, t := range snap.Tenants {
		// DCGM exporter's labels (gpu, UUID, pod, namespace, container; empty outside Kubernetes) plus DetShare's.
		l := []string{"tenant", t.ID, "gpu", strconv.Itoa(t.GPU), "UUID", uuid[t.GPU], "pod", t.Pod, "namespace", t.Namespace,
			"container", t.Container, "tier", t.Tier, "role", t.Role}
		tg.add(float64(t.GrantedSMs), l...)
		tq.add(float64(t.GuaranteedSMs), l...)
		tb.add(float64(t.BusyNs)/1e9, l...)
		tl.add(float64(t.Launches), l...)
		tm.add(float64(t.MemUsed), l...)
		tml.add(float64(t.MemLimit), l...)
		if t.MemGPUKnown {
			tmg.add(float64(t.MemGPU), l...)
			tmo.add(float64(t.MemOutside), l...)
		}
		tqd.add(float64(t.QueueDelayNs)/1e9, l...)
		tgc.add(float64(t.GrantEpoch), l...)
		tslo.add(float64(ex.SLOViolations[t.ID]), l...)
		tdem.add(float64(t.Demand), l...)
		tlc.add(float64(t.LatencyCount), l...)
		tlp.add(t.LatencyP99Ms/1e3, l...)
		tst.add(t.SLOP99Ms/1e3, l...)
		tsw.add(float64(t.SLOWithin), l...)
		tgd.add(float64(t.GateDepth), l...)
		tng.add(float64(t.NarrowGroups), l...)
		tgw.add(float64(t.GateWaits), l...)
		if t.SLOState != "" {
			tsb.add(float64(t.SLOGivenBackGroups), l...)
			tsp.add(t.SLOWindowP99Ms/1e3, l...)
			tsf.add(t.SLOFloorMs/1e3, l...)
			tsi.add(b2f(t.SLOState == "infeasible"), l...)
			tsh.add(b2f(t.SLOHolding), l...)
		}
	}
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		for _, s := range f.samples {
			bw.WriteString(f.name)
			if len(s.labels) > 0 {
				bw.WriteByte('{')
				for i, l := range s.labels {
					if i > 0 {
						bw.WriteByte(',')
					}
					fmt.Fprintf(bw, "%s=\"%s\"", l[0], escape(l[1]))
				}
				bw.WriteByte('}')
			}
			bw.WriteByte(' ')
			bw.WriteString(formatValue(s.value))
			bw.WriteByte('\n')
		}
	}
	return bw.Flush()
}

// formatValue writes integers (bytes, counts) in full rather than in exponent form.
func formatValue(v float64) string {
	if v == float64(int64(v)) && v < 1e18 && v > -1e18 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Handler serves /metrics.
func Handler(src Source) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		snap, ex := src()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = Write(w, snap, ex)
	})
	return mux
}

// Serve listens on addr ("host:port") until ctx ends. It returns the bound address (useful with port 0) once
// listening; serving errors are logged, never fatal to the scheduler.
func Serve(ctx context.Context, addr string, src Source) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics.listen %q: %w", addr, err)
	}
	srv := &http.Server{Handler: Handler(src), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logrus.WithError(err).Warn("metrics endpoint stopped")
		}
	}()
	return ln.Addr(), nil
}

// Names lists the metric family names Write emits (for the dashboard test).
func Names() []string {
	var b strings.Builder
	_ = Write(&b, view.Snapshot{GPUs: []view.GPU{{}}, Tenants: []view.Tenant{{}}}, Extra{})
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "# TYPE ") {
			out = append(out, strings.Fields(line)[2])
		}
	}
	sort.Strings(out)
	return out
}
