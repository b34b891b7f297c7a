package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/detshare/detshare/internal/table"
)

// When the scheduler records GPU 0's MPS as failed (simulated: the test writes that state into the node's table, as
// the scheduler's MPS watcher does when the control daemon cannot be restarted), the device plugin the chart runs
// sends its units Unhealthy and kubelet's allocatable detshare.io/gpu drops to 0, so no new pod lands there; when it
// is recorded running again the units come back.
func TestMPSFailureMakesTheGPUUnallocatable(t *testing.T) {
	c := need(t)
	fail, restore := c.simulateMPSFailure(t)
	allocatable := func(want int64, what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		var got int64 = -1
		for time.Now().Before(deadline) {
			n, err := c.client.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{})
			if err == nil {
				q := n.Status.Allocatable["detshare.io/gpu"]
				if got = q.Value(); got == want {
					return
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Fatalf("%s: allocatable detshare.io/gpu = %d after 60 s, want %d", what, got, want)
	}
	allocatable(15, "before")
	fail()
	allocatable(0, "MPS failed")
	restore()
	allocatable(15, "MPS running again")
}

// simulateMPSFailure gives fail, which records GPU 0's MPS as failed in the node's table as the scheduler's MPS
// watcher does when the control daemon cannot be restarted, and restore, which puts back what was there (also when
// the test ends).
func (c *cluster) simulateMPSFailure(t *testing.T) (fail, restore func()) {
	t.Helper()
	tb, err := table.Create(c.runDir)
	if err != nil {
		t.Fatal(err)
	}
	g := tb.GPUs()[0]
	restore = func() { _ = tb.SetMPS(g.Index, g.MPSState, g.Mode, g.MPSPipeDir) }
	t.Cleanup(func() { restore(); tb.Close() })
	return func() {
		t.Helper()
		if err := tb.SetMPS(g.Index, table.MPSFailed, table.ModeTemporal, ""); err != nil {
			t.Fatal(err)
		}
	}, restore
}
