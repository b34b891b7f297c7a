package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// OwnTierScript reads the tier of the slot its quota file names, not of slot 0: two tenants, the second
// latency-critical, each seen through its own quota file.
func TestOwnTierScriptReadsItsOwnSlot(t *testing.T) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox not found (the workload image's shell): %v", err)
	}
	dir := t.TempDir()
	tb, err := table.Create(filepath.Join(dir, "run"))
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	for _, c := range []struct {
		id   string
		tier table.Tier
	}{{"be", table.TierBestEffort}, {"lc", table.TierLatencyCritical}} {
		reg, err := tb.Register(table.RegisterRequest{ID: c.id, Tier: c.tier, Weight: 1})
		if err != nil {
			t.Fatal(err)
		}
		qf := filepath.Join(dir, c.id+".quota")
		if err := os.WriteFile(qf, []byte("version=1\nid="+c.id+"\nslot="+strconv.Itoa(reg.Slot)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		script := strings.NewReplacer(table.ContainerQuotaPath, qf, table.ContainerTablePath, tb.Paths().Table(),
			"busybox ", bb+" ").Replace(OwnTierScript())
		out, err := exec.Command(bb, "sh", "-c", script).CombinedOutput()
		if err != nil || string(out) != TierLine(c.tier) {
			t.Errorf("%s (slot %d): %q %v, want %q", c.id, reg.Slot, out, err, TierLine(c.tier))
		}
	}
}
