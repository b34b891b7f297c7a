package deviceplugin

import (
	"context"
	"fmt"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/internal/table"
)

// When the scheduler reports a GPU's MPS server failed (recorded in its table, as its MPS watcher does when the control daemon cannot be restarted; simulated
// here by writing the table), ListAndWatch sends that GPU's units again as Unhealthy, so kubelet places no new pod
// there; when the scheduler records it running again they are sent Healthy. The other GPU's units stay healthy.
func TestMPSFaultMarksUnitsUnhealthyUntilRecovery(t *testing.T) {
	runDir := t.TempDir()
	tb, err := table.Create(runDir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	if err := tb.SetGPUs([]table.GPUInfo{{Index: 0, UUID: "SIM-0", SMCount: 132, MemTotal: 80 << 30},
		{Index: 1, UUID: "SIM-1", SMCount: 132, MemTotal: 80 << 30}}); err != nil {
		t.Fatal(err)
	}
	for _, g := range []int{0, 1} {
		if err := tb.SetMPS(g, table.MPSRunning, table.ModeSpatial, ""); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	p, err := New(ResourceMemory, dir, testInventory())
	if err != nil {
		t.Fatal(err)
	}
	p.Health, p.HealthInterval = TableHealth(runDir), 20*time.Millisecond
	_, conn := serve(t, dir, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	// health counts each GPU's unhealthy units in one ListAndWatch response.
	health := func(what string) map[string]int {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(r.Devices) != 160 {
			t.Fatalf("%s: %d units, want 160", what, len(r.Devices))
		}
		out := map[string]int{}
		for _, d := range r.Devices {
			g, _, _, _ := parseDeviceID(d.ID)
			out[fmt.Sprintf("%s/gpu%d", d.Health, g)]++
		}
		return out
	}
	if h := health("start"); h["Healthy/gpu0"] != 80 || h["Healthy/gpu1"] != 80 {
		t.Fatalf("at start: %v, want every unit healthy", h)
	}
	if err := tb.SetMPS(0, table.MPSFailed, table.ModeSpatial, ""); err != nil {
		t.Fatal(err)
	}
	if h := health("after the fault"); h["Unhealthy/gpu0"] != 80 || h["Healthy/gpu1"] != 80 {
		t.Errorf("GPU 0's MPS server failed: %v, want GPU 0's 80 units Unhealthy and GPU 1's healthy", h)
	}
	if err := tb.SetMPS(0, table.MPSRunning, table.ModeSpatial, ""); err != nil {
		t.Fatal(err)
	}
	if h := health("after recovery"); h["Healthy/gpu0"] != 80 || h["Healthy/gpu1"] != 80 {
		t.Errorf("GPU 0's MPS server running again: %v, want every unit healthy", h)
	}
}
