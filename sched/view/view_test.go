package view

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// newTable creates a table on one simulated GPU (a test double) with one tenant registered as req.
func newTable(t *testing.T, req table.RegisterRequest) (string, *table.Table, table.Registration) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	tb, err := table.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	tb.SetGPUs([]table.GPUInfo{{Index: 0, UUID: "SIM-view", Name: "simulated GPU (test double)", SMCount: 64, MemTotal: 1 << 30}})
	reg, err := tb.Register(req)
	if err != nil {
		t.Fatal(err)
	}
	return dir, tb, reg
}

func TestTakeAndRates(t *testing.T) {
	dir, tb, reg := newTable(t, table.RegisterRequest{ID: "lc", Tier: table.TierLatencyCritical, Role: table.RoleDecode, Weight: 2,
		SMGroups: 2, SMs: 16, MemLimit: 1 << 20, Lend: true})
	tb.PublishGrant(reg.Slot, table.Grant{Groups: 0x3, SMs: 16, Mode: table.ModeSpatial})
	cl, err := table.OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id, _ := table.SelfIdentity()
	i, _ := cl.AttachProcess(id)
	cl.ChargeMemory(i, 4096, 1<<20)
	cl.SetBusy(i, true)

	ro, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	s1 := Take(ro)
	if len(s1.GPUs) != 1 || !s1.GPUs[0].Simulated || len(s1.GPUs[0].Groups) != 8 {
		t.Fatalf("gpus %+v", s1.GPUs)
	}
	if len(s1.Tenants) != 1 {
		t.Fatalf("tenants %+v", s1.Tenants)
	}
	v := s1.Tenants[0]
	if v.ID != "lc" || v.Tier != "latency-critical" || v.Role != "decode" || !v.Lend || v.GrantedSMs != 16 ||
		v.GrantMode != "spatial" || v.MemUsed != 4096 || v.MemLimit != 1<<20 || v.Demand != 1 || v.Processes != 1 || v.GuaranteedSMs != 16 {
		t.Fatalf("tenant %+v", v)
	}
	// Rates: 50 ms later with 10 more launches and a 25 ms busy period that has ended.
	cl.SetBusy(i, false)
	p := &cl.Page().Procs[i]
	p.Launches += 10
	p.BusyNs += uint64(25 * time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	s2 := Take(ro)
	Rates(&s1, &s2)
	r := s2.Tenants[0]
	if r.LaunchesSec < 50 || r.LaunchesSec > 220 || r.BusyPct < 15 || r.BusyPct > 55 {
		t.Fatalf("rates: %.1f launches/s, %.1f%% busy", r.LaunchesSec, r.BusyPct)
	}
	if _, err := Open(filepath.Join(dir, "nope")); err == nil {
		t.Fatal("missing table accepted")
	}
}

// A tenant busy without pause has no completed busy period (the library adds one to busy_ns when it drains): the
// running period must count, or BUSY% reads 0 while the tenant works (issue 15).
func TestBusyPercentCountsTheRunningBusyPeriod(t *testing.T) {
	dir, _, reg := newTable(t, table.RegisterRequest{ID: "busy", Tier: table.TierBestEffort, Weight: 1})
	cl, err := table.OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id, _ := table.SelfIdentity()
	i, _ := cl.AttachProcess(id)
	cl.SetBusy(i, true)
	ro, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	prev := Take(ro)
	for frame := 0; frame < 3; frame++ {
		time.Sleep(30 * time.Millisecond)
		cur := Take(ro)
		Rates(&prev, &cur)
		if b := cur.Tenants[0].BusyPct; b < 90 {
			t.Fatalf("frame %d: %.1f%% busy for a tenant busy the whole time", frame, b)
		}
		prev = cur
	}
}

// The latency the library observed becomes P99 and SLO attainment for status, top and metrics; the gate the
// scheduler set is shown with its waits.
func TestLatencySLOAttainment(t *testing.T) {
	dir, tb, reg := newTable(t, table.RegisterRequest{ID: "lc", Tier: table.TierLatencyCritical, Weight: 1,
		SMGroups: 2, SMs: 16, SLOP99Us: 5000, Pinned: true})
	if err := tb.SetGate(reg.Slot, 4, 300); err != nil {
		t.Fatal(err)
	}
	cl, err := table.OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pg := cl.Page()
	pg.LatHist[11] = 90 // [2.048, 4.096) ms: within 5 ms
	pg.LatHist[12] = 10 // [4.096, 8.192) ms: straddles 5 ms, counted as missed
	pg.GateWaits, pg.GateWaitNs = 7, 3_000_000
	ro, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	v := Take(ro).Tenants[0]
	if !v.Pinned || v.SLOP99Ms != 5 || v.LatencyCount != 100 || v.LatencyP99Ms != 8.192 || v.SLOWithin != 90 ||
		v.SLOAttainment != 0.9 || v.GateDepth != 4 || v.GateBudgetUs != 300 || v.GateWaits != 7 {
		t.Fatalf("latency view %+v", v)
	}
}
