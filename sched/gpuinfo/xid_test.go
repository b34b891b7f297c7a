package gpuinfo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/simgpu"
	"github.com/detshare/detshare/internal/gpufacts"
)

// (This file sorts after gpuinfo_test.go, whose TestHostDiscovery must see the host's own NVML, not the double.)

// WatchXid delivers the critical Xid errors the NVML double reports for each GPU (injected through its Xid file) in
// order, with the GPU's NVML index, and none from before the watch began; it ends when its context does.
func TestWatchXidOnTheNVMLDouble(t *testing.T) {
	xid := simgpu.UseNVMLDouble(t, "2")
	simgpu.InjectXid(t, xid, 1, 48) // before the watch: not delivered
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); time.Sleep(1500 * time.Millisecond) }() // NVML shut down before the double is let go
	type event struct {
		gpu int
		xid uint64
	}
	events := make(chan event, 4)
	if err := WatchXid(ctx, func(gpu int, xid uint64) { events <- event{gpu, xid} }); err != nil {
		t.Fatalf("WatchXid on the NVML double: %v", err)
	}
	simgpu.InjectXid(t, xid, 1, 79)
	simgpu.InjectXid(t, xid, 0, 13)
	for _, want := range []event{{1, 79}, {0, 13}} {
		select {
		case got := <-events:
			if got != want {
				t.Errorf("event %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event after 10 s, want %+v", want)
		}
	}
}

// A driver without event support (modelled by the double with DETSHARE_SIMGPU_NVML_EVENTS=0) is ErrNoEvents, not a
// crash or a silent watch.
func TestWatchXidWithoutEventSupport(t *testing.T) {
	simgpu.UseNVMLDouble(t, "1")
	t.Setenv(simgpu.EnvNVMLEvents, "0")
	err := WatchXid(context.Background(), func(int, uint64) { t.Error("an event without event support") })
	if !errors.Is(err, ErrNoEvents) {
		t.Fatalf("WatchXid without event support: %v, want ErrNoEvents", err)
	}
}

// Facts reads the driver's version, its CUDA version and each GPU's architecture and compute capability: the
// double's are 580.00-simgpu, 13000, hopper 9.0.
func TestFactsOnTheNVMLDouble(t *testing.T) {
	simgpu.UseNVMLDouble(t, "2")
	f, err := Facts()
	if err != nil {
		t.Fatal(err)
	}
	want := gpufacts.GPU{Architecture: "hopper", CCMajor: 9, CCMinor: 0}
	if f.Version != "580.00-simgpu" || f.CUDAVersion != 13000 || len(f.GPUs) != 2 || f.GPUs[0] != want || f.GPUs[1] != want {
		t.Errorf("Facts: %+v, want driver 580.00-simgpu, CUDA 13000, two GPUs %+v", f, want)
	}
}
