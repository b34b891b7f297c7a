package deviceplugin

import (
	"context"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/internal/table"
)

// An H100-shaped simulated GPU (test double): 132 SMs (15 groups of 8), 80 GiB.
func testInventory() Inventory {
	return FromInfo([]table.GPUInfo{{Index: 0, UUID: "SIM-0", SMCount: 132, MemTotal: 80 << 30},
		{Index: 1, UUID: "SIM-1", SMCount: 132, MemTotal: 80 << 30}})
}

func TestDevicesCountGroupsAndGiB(t *testing.T) {
	inv := testInventory()
	sm, _ := inv.Devices(ResourceShares)
	mem, _ := inv.Devices(ResourceMemory)
	if len(sm) != 30 || len(mem) != 160 {
		t.Fatalf("got %d share units and %d GiB units, want 30 (2x15 groups) and 160", len(sm), len(mem))
	}
	if _, err := inv.Devices("nvidia.com/gpu"); err == nil || !strings.Contains(err.Error(), ResourceShares) {
		t.Errorf("unknown resource: err = %v, want one naming the allowed resources", err)
	}
}

func TestAllocationAnnotations(t *testing.T) {
	inv := testInventory()
	ann, err := inv.Allocation(ResourceShares, []string{"gpu1-sm-0", "gpu1-sm-1", "gpu1-sm-2"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"alloc.detshare.io/gpu": "1", "alloc.detshare.io/sms": "24", "alloc.detshare.io/tier": "burstable",
		"alloc.detshare.io/weight": "1", "alloc.detshare.io/role": "none"}
	if !reflect.DeepEqual(ann, want) {
		t.Errorf("shares: got %v, want %v", ann, want)
	}
	ann, err = inv.Allocation(ResourceMemory, []string{"gpu0-mem-5", "gpu0-mem-9"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"alloc.detshare.io/gpu": "0", "alloc.detshare.io/memory": "2Gi",
		"alloc.detshare.io/weight": "1", "alloc.detshare.io/role": "none"}; !reflect.DeepEqual(ann, want) {
		t.Errorf("memory: got %v, want %v", ann, want)
	}
}

// Device IDs reach Allocate from kubelet's checkpoint; anything we did not advertise is refused with a reason.
func TestAllocationRefusesWhatWasNotAdvertised(t *testing.T) {
	inv := testInventory()
	for _, c := range []struct {
		res  string
		ids  []string
		want string
	}{
		{ResourceShares, nil, "no devices"},
		{ResourceShares, []string{"gpu0-sm-15"}, "no such unit"},
		{ResourceShares, []string{"gpu7-sm-0"}, "no such unit"},
		{ResourceShares, []string{"gpu0-mem-0"}, "is not a detshare.io/gpu unit"},
		{ResourceShares, []string{"gpu0-sm-0", "gpu1-sm-0"}, "one container runs on one GPU"},
		{ResourceShares, []string{"gpu0-sm-0", "gpu0-sm-0"}, "allocated twice"},
		{ResourceMemory, []string{"../../etc/passwd"}, "want gpu<index>"},
		{ResourceMemory, []string{"gpu-1-mem-0"}, "want gpu<index>"},
		{ResourceMemory, []string{"gpu0-mem--1"}, "want gpu<index>"},
		{"detshare.io/other", []string{"gpu0-mem-0"}, "unknown resource"},
	} {
		if _, err := inv.Allocation(c.res, c.ids); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Allocation(%s, %v): err = %v, want %q", c.res, c.ids, err, c.want)
		}
	}
}

func TestPreferredStaysOnOneGPU(t *testing.T) {
	inv := testInventory()
	avail := []string{"gpu0-sm-3", "gpu1-sm-2", "gpu1-sm-0", "gpu1-sm-1", "gpu0-sm-4"}
	got, _ := inv.Preferred(ResourceShares, avail, nil, 2)
	if want := []string{"gpu1-sm-0", "gpu1-sm-1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("preferred = %v, want %v (the GPU with most free units, lowest first)", got, want)
	}
	got, _ = inv.Preferred(ResourceShares, avail, []string{"gpu0-sm-4"}, 2)
	if want := []string{"gpu0-sm-4", "gpu0-sm-3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("preferred with must-include = %v, want %v", got, want)
	}
}

// fakeKubelet records registrations as kubelet's registration service does.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- r
	return &pluginapi.Empty{}, nil
}

// serve serves p (made by New in dir) beside a fake kubelet in dir and returns the registration it sent and a client
// connection to its socket, all stopped when the test ends.
func serve(t *testing.T, dir string, p *Plugin) (*pluginapi.RegisterRequest, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{got: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	if err := p.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	reg := <-k.got
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return reg, conn
}

// The plugin registers with kubelet's socket, lists its units and allocates over gRPC as kubelet calls it.
func TestServeRegistersListsAndAllocates(t *testing.T) {
	dir := t.TempDir()
	p, err := New(ResourceShares, dir, testInventory())
	if err != nil {
		t.Fatal(err)
	}
	reg, conn := serve(t, dir, p)
	if reg.ResourceName != ResourceShares || reg.Version != pluginapi.Version || reg.Endpoint != "detshare-gpu.sock" {
		t.Fatalf("registration = %+v", reg)
	}
	c := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 30 || first.Devices[0].Health != pluginapi.Healthy {
		t.Fatalf("ListAndWatch sent %d devices (first %+v), want 30 healthy", len(first.Devices), first.Devices[0])
	}
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"gpu0-sm-0", "gpu0-sm-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Annotations["alloc.detshare.io/sms"]; got != "16" {
		t.Errorf("Allocate of 2 units: alloc.detshare.io/sms = %q, want 16", got)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"gpu0-sm-99"}}}}); err == nil {
		t.Error("Allocate of a unit never advertised succeeded")
	}
}
