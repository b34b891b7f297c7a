package deviceplugin

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/integration/simgpu"
	"github.com/detshare/detshare/sched/gpuinfo"
)

// A critical Xid makes its GPU unhealthy (xid-<n>) for the hold time after the last one; an ignored (application-
// caused) Xid does not; hold 0 keeps it until restart; a later Xid restarts the hold.
func TestXidHealthHoldsAndClears(t *testing.T) {
	now := time.Unix(1000, 0)
	ignored, err := ParseIgnoredXids("--xid-ignored", DefaultIgnoredXids)
	if err != nil {
		t.Fatal(err)
	}
	x := &XidHealth{Ignored: ignored, Hold: time.Minute, Now: func() time.Time { return now }}
	h := x.Health()
	if x.Observe(0, 13) || h() != nil {
		t.Fatalf("Xid 13 (application-caused, ignored by default) made GPU 0 unhealthy: %v", h())
	}
	if !x.Observe(1, 79) {
		t.Fatal("Xid 79 not counted")
	}
	if got := h(); !maps.Equal(got, map[int]string{1: "xid-79"}) {
		t.Fatalf("after Xid 79 on GPU 1: %v, want map[1:xid-79]", got)
	}
	now = now.Add(50 * time.Second)
	x.Observe(1, 48)
	now = now.Add(50 * time.Second) // 100 s after the first, 50 after the second
	if got := h(); !maps.Equal(got, map[int]string{1: "xid-48"}) {
		t.Fatalf("50 s after Xid 48 (hold 1 min): %v, want map[1:xid-48]", got)
	}
	now = now.Add(10 * time.Second)
	if got := h(); got != nil {
		t.Fatalf("60 s after the last critical Xid (hold 1 min): %v, want healthy", got)
	}
	// a GPU lost: every GPU of the node, over any Xid, until the hold passes
	x.GPUs = []int{0, 1, 2}
	x.Observe(1, 79)
	x.Observe(-1, 0)
	if got := h(); !maps.Equal(got, map[int]string{0: ReasonGPULost, 1: ReasonGPULost, 2: ReasonGPULost}) {
		t.Fatalf("after a GPU lost: %v, want every GPU %s", got, ReasonGPULost)
	}
	now = now.Add(time.Minute)
	if got := h(); got != nil {
		t.Fatalf("a minute after the GPU lost and the Xid (hold 1 min): %v, want healthy", got)
	}
	forever := &XidHealth{Now: func() time.Time { return now }}
	forever.Observe(0, 13) // nothing ignored
	now = now.Add(1000 * time.Hour)
	if got := forever.Health()(); !maps.Equal(got, map[int]string{0: "xid-13"}) {
		t.Fatalf("hold 0, 1000 h later: %v, want map[0:xid-13] until restart", got)
	}
}

func TestParseIgnoredXids(t *testing.T) {
	for v, want := range map[string][]uint64{"none": nil, "": nil, "79, 13": {13, 79}, DefaultIgnoredXids: {13, 31, 43, 45, 68, 109}} {
		got, err := ParseIgnoredXids("--xid-ignored", v)
		if err != nil || len(got) != len(want) {
			t.Errorf("%q: %v, %v; want %v", v, got, err, want)
		}
		for _, n := range want {
			if !got[n] {
				t.Errorf("%q: %v lacks %d", v, got, n)
			}
		}
	}
	if _, err := ParseIgnoredXids("--xid-ignored", "13,abc"); err == nil || !strings.Contains(err.Error(), "--xid-ignored") ||
		!strings.Contains(err.Error(), `"abc"`) || !strings.Contains(err.Error(), "none or a comma-separated list") {
		t.Errorf("bad value: %v, want an error naming the flag, the value and the allowed values", err)
	}
}

// Against the NVML double: an Xid injected for GPU 1 turns into xid-79 through NVML's events; a driver without event
// support gives a Health reporting nothing (logged), not an error.
func TestXidHealthWatchesTheNVMLDouble(t *testing.T) {
	xid := simgpu.UseNVMLDouble(t, "2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := &XidHealth{Ignored: map[uint64]bool{13: true}}
	h := x.Watch(ctx, gpuinfo.WatchXid)
	if h == nil {
		t.Fatal("no Xid watch on the NVML double")
	}
	simgpu.InjectXid(t, xid, 0, 13)
	simgpu.InjectXid(t, xid, 1, 79)
	var got map[int]string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = h(); len(got) > 0 {
			break
		}
	}
	if !maps.Equal(got, map[int]string{1: "xid-79"}) {
		t.Fatalf("health after Xids 13 (ignored) on GPU 0 and 79 on GPU 1: %v, want map[1:xid-79]", got)
	}
	// A GPU lost (NVML's wait returns GPU_IS_LOST, naming no GPU): every GPU of the node is unhealthy, gpu-lost.
	x.GPUs = []int{0, 1}
	simgpu.InjectGPULost(t, xid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = h(); len(got) == 2 {
			break
		}
	}
	if !maps.Equal(got, map[int]string{0: ReasonGPULost, 1: ReasonGPULost}) {
		t.Fatalf("health after NVML reported a GPU lost: %v, want both GPUs %s", got, ReasonGPULost)
	}
	cancel()
	time.Sleep(1500 * time.Millisecond) // the watch shuts NVML down within its 1 s wait
	t.Setenv(simgpu.EnvNVMLEvents, "0")
	if h := (&XidHealth{}).Watch(context.Background(), gpuinfo.WatchXid); h != nil {
		t.Errorf("without event support: a Health %v, want none", h())
	}
}

// The device plugin's whole path against the NVML double: a critical Xid injected for GPU 1 makes ListAndWatch send
// GPU 1's units Unhealthy (GPU 0's stay healthy; an ignored Xid on GPU 0 changes nothing), and once the hold time
// passes without another they are Healthy again.
func TestXidMarksUnitsUnhealthyUntilTheHoldPasses(t *testing.T) {
	xid := simgpu.UseNVMLDouble(t, "2")
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); time.Sleep(1500 * time.Millisecond) }() // the watch shuts NVML down before the double is let go
	ignored, _ := ParseIgnoredXids("--xid-ignored", DefaultIgnoredXids)
	x := (&XidHealth{Ignored: ignored, Hold: 2 * time.Second}).Watch(ctx, gpuinfo.WatchXid)
	if x == nil {
		t.Fatal("no Xid watch on the NVML double")
	}
	dir := t.TempDir()
	p, err := New(ResourceShares, dir, testInventory())
	if err != nil {
		t.Fatal(err)
	}
	p.Health, p.HealthInterval = TableHealth(t.TempDir()).Or(x), 20*time.Millisecond
	_, conn := serve(t, dir, p)
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	unhealthy := func(what string) map[int]int {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out := map[int]int{}
		for _, d := range r.Devices {
			if g, _, _, _ := parseDeviceID(d.ID); d.Health == pluginapi.Unhealthy {
				out[g]++
			}
		}
		return out
	}
	if u := unhealthy("start"); len(u) != 0 {
		t.Fatalf("at start: unhealthy units %v, want none", u)
	}
	simgpu.InjectXid(t, xid, 0, 43)
	simgpu.InjectXid(t, xid, 1, 79)
	if u := unhealthy("after Xid 79 on GPU 1"); u[1] != 15 || u[0] != 0 {
		t.Fatalf("after Xid 43 (ignored) on GPU 0 and 79 on GPU 1: unhealthy units %v, want GPU 1's 15 only", u)
	}
	if u := unhealthy("after the hold"); len(u) != 0 {
		t.Errorf("2 s after the last critical Xid (hold 2 s): unhealthy units %v, want none", u)
	}
}
