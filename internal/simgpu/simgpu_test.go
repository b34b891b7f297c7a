package simgpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// Moved from internal/table (TestDiscoverSimGPUs) with the simulated GPU's discovery.
func TestDiscoverSimGPUs(t *testing.T) {
	if Selected([]string{"PATH=/bin"}) {
		t.Error("selected without env")
	}
	env := []string{"DETSHARE_SIMGPU_COUNT=2", "DETSHARE_SIMGPU_SMS=64"}
	if !Selected(env) {
		t.Fatal("not selected")
	}
	g, err := GPUs(env)
	if err != nil || len(g) != 2 || g[1].SMCount != 64 || g[1].MemTotal != 80<<30 || !strings.HasPrefix(g[1].UUID, "SIM-") ||
		!strings.Contains(g[0].Name, "simulated") {
		t.Fatalf("%+v %v", g, err)
	}
	if _, err := GPUs([]string{"DETSHARE_SIMGPU_COUNT=99"}); err == nil || !strings.Contains(err.Error(), "DETSHARE_SIMGPU_COUNT") {
		t.Errorf("bad count: %v", err)
	}
}

// TestOrRealChoosesOnce: the backend choice the mains wire in. Moved from sched/gpuinfo (TestSimulated) for the
// simulated side; the real side must be called only when the environment does not select the test double.
func TestOrRealChoosesOnce(t *testing.T) {
	realCalls := 0
	real := func() ([]table.GPUInfo, error) { realCalls++; return nil, errors.New("no driver") }
	t.Setenv("DETSHARE_SIMGPU_COUNT", "2")
	t.Setenv("DETSHARE_SIMGPU_SMS", "64")
	g, err := OrReal(real)()
	if err != nil || len(g) != 2 || g[1].SMCount != 64 || !strings.HasPrefix(g[0].UUID, "SIM-") || realCalls != 0 {
		t.Fatalf("%+v %v (real called %d times)", g, err, realCalls)
	}
	t.Setenv("DETSHARE_SIMGPU_SMS", "lots")
	if _, err := OrReal(real)(); err == nil || !strings.Contains(err.Error(), "DETSHARE_SIMGPU_SMS") {
		t.Fatalf("bad simulated GPU config must be refused: %v", err)
	}
	t.Setenv("DETSHARE_SIMGPU", "0")
	if _, err := OrReal(real)(); err == nil || realCalls != 1 {
		t.Fatalf("not selected: want the real discovery, got %v (real called %d times)", err, realCalls)
	}
	if _, err := OrReal(nil)(); !errors.Is(err, ErrNotSelected) {
		t.Fatalf("no real discovery: %v", err)
	}
}
