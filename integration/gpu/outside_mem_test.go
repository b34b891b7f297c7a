package gpu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOutsideMemoryScriptOnSimulatedGPU runs integration/gpu/outside_mem.sh (issue 27's H100 script) on the
// simulated GPU and its NVML double (test doubles), with the real `detshare sched` and `detshare run`: memory a
// tenant's processes take past the library shows in status and metrics, and a process that takes the tenant past
// its quota plus the context allowance is killed by the scheduler while the tenant's other processes keep running.
func TestOutsideMemoryScriptOnSimulatedGPU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("outside_mem.sh registers tenants under /run-like tmpfs pages: run as root (CI does)")
	}
	for _, f := range []string{"bin/detshare", "tests/ds_probe_rt"} {
		if _, err := os.Stat(filepath.Join(buildDir(t), f)); err != nil {
			t.Fatalf("%s missing (%v): run `make build` first", f, err)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(here(t), "outside_mem.sh"), out)
	cmd.Env = append(os.Environ(), "OM_SIM=1", "OM_METRICS_PORT=19477")
	log, err := cmd.CombinedOutput()
	summary, _ := os.ReadFile(filepath.Join(out, "summary.txt"))
	if err != nil {
		t.Fatalf("outside_mem.sh: %v\n%s\n--- summary\n%s", err, log, summary)
	}
	for _, want := range []string{"ok   C status text flags it", "ok   D killed by the scheduler",
		"ok   B, C and the honest A still run"} {
		if !strings.Contains(string(summary), want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
}
