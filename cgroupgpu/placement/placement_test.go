package placement

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
)

func TestMain(m *testing.M) {
	logrus.SetLevel(logrus.ErrorLevel)
	os.Setenv("DETSHARE_BIN", "/bin/false") // no scheduler here: placement only
	os.Exit(m.Run())
}

func reg(t *testing.T, dir string, pl tenant.Placer, id string, env ...string) tenant.Result {
	t.Helper()
	res, err := (&tenant.Registrar{DiscoverGPUs: simgpu.Discover}).Register(context.Background(), dir, tenant.Request{ID: id,
		Quota: quota.Inputs{Env: env}.Resolve(), Placer: pl})
	if err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
	return res
}

// prefillBesideDecode registers, on two simulated GPUs (test doubles) of 64 SMs, a prefill tenant on GPU 0 and a
// decode one on GPU 1, and returns the run directory and the placer.
func prefillBesideDecode(t *testing.T) (string, *Placer) {
	t.Helper()
	t.Setenv("DETSHARE_SIMGPU_COUNT", "2")
	t.Setenv("DETSHARE_SIMGPU_SMS", "64")
	dir := filepath.Join(t.TempDir(), "run")
	pl := &Placer{RunDir: dir}
	reg(t, dir, pl, "pf", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=prefill", "DETSHARE_GPU=0")
	reg(t, dir, pl, "dc", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=decode", "DETSHARE_GPU=1")
	return dir, pl
}

// TestComplementsNeighbours: on two simulated GPUs (test doubles), a prefill neighbour on GPU 0 and a decode one on
// GPU 1: a new prefill tenant goes beside the decode one and a new decode tenant beside the prefill one.
func TestComplementsNeighbours(t *testing.T) {
	dir, pl := prefillBesideDecode(t)
	if r := reg(t, dir, pl, "pf2", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=prefill", "DETSHARE_GPU=auto"); r.Registration.GPU != 1 {
		t.Fatalf("prefill placed on GPU %d (%s), want 1 beside the decode tenant", r.Registration.GPU, pl.LastReason())
	}
	if !strings.Contains(pl.LastReason(), "GPU 1") || !strings.Contains(pl.LastReason(), "compute-heavy") {
		t.Errorf("reason %q", pl.LastReason())
	}
	// GPU 1 now has a decode and a prefill; GPU 0 a prefill: a decode newcomer goes to GPU 0.
	if r := reg(t, dir, pl, "dc2", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=decode", "DETSHARE_GPU=auto"); r.Registration.GPU != 0 {
		t.Fatalf("decode placed on GPU %d (%s), want 0", r.Registration.GPU, pl.LastReason())
	}
}

// TestGuaranteeMustFit: the complementing GPU is skipped when the guarantee does not fit there; when it fits nowhere
// the refusal names every GPU's reason.
func TestGuaranteeMustFit(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU_COUNT", "2")
	t.Setenv("DETSHARE_SIMGPU_SMS", "64")
	dir := filepath.Join(t.TempDir(), "run")
	pl := &Placer{RunDir: dir}
	reg(t, dir, pl, "dc", "DETSHARE_TIER=latency-critical", "DETSHARE_ROLE=decode", "DETSHARE_SMS=48", "DETSHARE_GPU=1")
	reg(t, dir, pl, "pf", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=prefill", "DETSHARE_GPU=0")
	r := reg(t, dir, pl, "pf2", "DETSHARE_TIER=burstable", "DETSHARE_ROLE=prefill", "DETSHARE_SMS=32", "DETSHARE_GPU=auto")
	if r.Registration.GPU != 0 {
		t.Fatalf("placed on GPU %d where 32 SMs do not fit (%s)", r.Registration.GPU, pl.LastReason())
	}
	if !strings.Contains(pl.LastReason(), "refused") {
		t.Errorf("reason should mention the refused GPU: %q", pl.LastReason())
	}
	_, err := (&tenant.Registrar{DiscoverGPUs: simgpu.Discover}).Register(context.Background(), dir, tenant.Request{ID: "big",
		Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=latency-critical", "DETSHARE_SMS=48", "DETSHARE_GPU=auto"}}.Resolve(), Placer: pl})
	if err == nil || !strings.Contains(err.Error(), "gpu=auto") || !strings.Contains(err.Error(), "GPU 0") || !strings.Contains(err.Error(), "GPU 1") {
		t.Fatalf("refusal must explain every GPU: %v", err)
	}
}

func TestScore(t *testing.T) {
	busy := Pressure{Compute: 1}
	full := Pressure{Memory: 1}
	if !(Score("compute-heavy", full, 4, 8) < Score("compute-heavy", busy, 4, 8)) {
		t.Error("compute-heavy should prefer the memory-loaded GPU")
	}
	if !(Score("memory-heavy", busy, 4, 8) < Score("memory-heavy", full, 4, 8)) {
		t.Error("memory-heavy should prefer the compute-loaded GPU")
	}
	if !(Score("unknown", Pressure{}, 8, 8) < Score("unknown", Pressure{}, 2, 8)) {
		t.Error("with equal pressure, more free groups wins")
	}
	if Kind(table.RolePrefill) != "compute-heavy" || Kind(table.RoleNone) != "unknown" {
		t.Error("kind")
	}
}

// TestPublishedPressureDecides: while the scheduler's published pressure is fresh, placement follows it without
// reading a client page (issue 28: reading every page made a registration cost grow with the tenants); a stale or
// missing publication makes it measure the pages itself. The published figures here contradict the pages, so
// the GPU chosen tells which was used.
func TestPublishedPressureDecides(t *testing.T) {
	dir, pl := prefillBesideDecode(t)
	tb, err := table.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	publish := func(at time.Time, compute0, compute1 float64) {
		for g, c := range []float64{compute0, compute1} {
			e := tb.GPU(g)
			e.PressureComputePPM, e.PressureMemBytes = uint64(c*1e6), 0
			e.PressureNs = uint64(at.UnixNano())
		}
	}
	// published: GPU 1 is the busy one; the pages say GPU 0 (its prefill neighbour)
	publish(time.Now(), 0, 3)
	if r := reg(t, dir, pl, "pf2", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=prefill", "DETSHARE_GPU=auto"); r.Registration.GPU != 0 {
		t.Fatalf("with a fresh publication saying GPU 1 is busy: placed on GPU %d (%s)", r.Registration.GPU, pl.LastReason())
	}
	publish(time.Now().Add(-10*time.Second), 0, 3) // stale: measured from the pages
	if r := reg(t, dir, pl, "pf3", "DETSHARE_TIER=best-effort", "DETSHARE_ROLE=prefill", "DETSHARE_GPU=auto"); r.Registration.GPU != 1 {
		t.Fatalf("with a stale publication: placed on GPU %d (%s), want 1 (measured: beside the decode tenant)", r.Registration.GPU, pl.LastReason())
	}
}
