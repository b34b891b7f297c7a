package daemon

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// The reaper publishes each GPU's pressure every round (what gpu=auto placement reads instead of every page): a
// best-effort tenant that reports itself busy for half its life shows as about 0.5 on its GPU within a few rounds.
func TestReaperPublishesGPUPressure(t *testing.T) {
	dir, tb := newRunDir(t)
	be := register(t, tb, "be", table.TierBestEffort, table.RoleNone, 0, false, 0)
	cl, err := table.OpenClientPage(be.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	startSched(t, dir, testConfig(), nil)
	time.Sleep(1200 * time.Millisecond) // older than a second: measured, not counted by role
	age := time.Since(time.Unix(0, int64(be.RegisteredNs)))
	atomic.StoreUint64(&cl.Page().BusyNs, uint64(age/2))
	var p table.Pressure
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p = tb.GPUs()[0].Pressure; p.Compute > 0.3 && time.Since(p.At) < table.PressureFresh {
			break
		}
	}
	if p.Compute < 0.3 || p.Compute > 0.55 || time.Since(p.At) > table.PressureFresh {
		t.Fatalf("GPU 0's published pressure %+v, want compute about 0.5, published within %v", p, table.PressureFresh)
	}
}
