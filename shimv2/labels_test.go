package shimv2

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// containersServer is containerd's containers service as grpc-go serves it (the server side of containerd's
// socket), holding containers per namespace.
type containersServer struct {
	containersapi.UnimplementedContainersServer
	byNS  map[string]map[string]*containersapi.Container
	delay time.Duration
}

func (c *containersServer) Get(ctx context.Context, r *containersapi.GetContainerRequest) (*containersapi.GetContainerResponse, error) {
	time.Sleep(c.delay)
	md, _ := metadata.FromIncomingContext(ctx)
	ns := md.Get("containerd-namespace")
	if len(ns) != 1 {
		return nil, status.Errorf(codes.FailedPrecondition, "namespace is required: %v", ns)
	}
	ctr, ok := c.byNS[ns[0]][r.ID]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q in namespace %q: not found (100%%)", r.ID, ns[0])
	}
	return &containersapi.GetContainerResponse{Container: ctr}, nil
}

func serveContainers(t *testing.T, srv *containersServer) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	containersapi.RegisterContainersServer(g, srv)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return sock
}

// ContainerdLabels speaks containerd's gRPC (the containers service of a real grpc-go server): it sends the
// namespace, returns the labels of the container asked for in that namespace (also when the record, with its
// spec, is far larger than HTTP/2's default window and frame size), reports a missing container with the daemon's
// status and message, and gives up at the context's deadline.
func TestContainerdLabelsOverGRPC(t *testing.T) {
	bigSpec := &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Spec",
		Value: []byte(strings.Repeat("x", 300<<10))}
	many := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		many["example.com/"+k] = strings.Repeat(k, 500)
	}
	many["detshare.io/tier"] = "best-effort"
	srv := &containersServer{byNS: map[string]map[string]*containersapi.Container{
		"default": {
			"c1":  {ID: "c1", Labels: map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16"}, Spec: bigSpec},
			"big": {ID: "big", Labels: many, Spec: bigSpec},
			"nol": {ID: "nol", Runtime: &containersapi.Container_Runtime{Name: RuntimeName}},
		},
		"other": {"c1": {ID: "c1", Labels: map[string]string{"detshare.io/tier": "latency-critical"}}},
	}}
	sock := serveContainers(t, srv)
	ctx := context.Background()
	for _, tc := range []struct {
		ns, id string
		want   map[string]string
	}{
		{"default", "c1", map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16"}},
		{"other", "c1", map[string]string{"detshare.io/tier": "latency-critical"}},
		{"default", "big", many},
		{"default", "nol", map[string]string{}},
	} {
		got, err := ContainerdLabels(sock, tc.ns)(ctx, tc.id)
		if err != nil {
			t.Fatalf("%s/%s: %v", tc.ns, tc.id, err)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("%s/%s: labels %v, want %v", tc.ns, tc.id, got, tc.want)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Fatalf("%s/%s: label %s = %q, want %q", tc.ns, tc.id, k, got[k], v)
			}
		}
	}

	_, err := ContainerdLabels(sock, "default")(ctx, "missing")
	var se *StatusError
	if !errors.As(err, &se) || se.Code != int(codes.NotFound) || !strings.Contains(se.Message, `container "missing" in namespace "default": not found (100%)`) {
		t.Fatalf("missing container: %v; want the daemon's NotFound status and message", err)
	}

	srv.delay = 2 * time.Second
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := ContainerdLabels(sock, "default")(tctx, "c1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow daemon: %v; want the context's deadline", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("gave up after %v, want at the 100 ms deadline", d)
	}

	if _, err := ContainerdLabels(filepath.Join(t.TempDir(), "none.sock"), "default")(ctx, "c1"); err == nil ||
		!strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("no daemon: %v; want an error naming the socket", err)
	}
	if _, err := ContainerdLabels("", "default")(ctx, "c1"); err == nil {
		t.Fatal("no address: want an error")
	}
}

// decodeLabels rejects a truncated response instead of returning partial labels.
func TestDecodeLabelsTruncated(t *testing.T) {
	msg := []byte{0x0a, 0x10, 0x12, 0x0e} // Container of 16 bytes announced, 2 given
	if _, err := decodeLabels(msg); err == nil {
		t.Fatal("truncated response decoded")
	}
	if _, err := decodeLabels(nil); err == nil {
		t.Fatal("empty response decoded")
	}
}

// PrefetchAtStart starts the lookup only for the long-lived shim's command line (no start/delete action, not -v),
// outside CRI's namespace and with labels on, for the container and namespace of that command line.
func TestPrefetchAtStart(t *testing.T) {
	srv := &containersServer{byNS: map[string]map[string]*containersapi.Container{
		"default": {"c1": {ID: "c1", Labels: map[string]string{"detshare.io/tier": "burstable"}}},
	}}
	sock := serveContainers(t, srv)
	t.Cleanup(func() { earlyPrefetch.Store(nil) })
	for _, tc := range []struct {
		args   []string
		labels string // DETSHARE_SHIM_LABELS
		want   bool
	}{
		{[]string{"-namespace", "default", "-id", "c1", "-address", sock, "-debug"}, "", true},
		{[]string{"-namespace=default", "--id=c1", "-address", sock}, "", true},
		{[]string{"-namespace", "default", "-address", sock, "-publish-binary", "/usr/bin/containerd", "-id", "c1", "start"}, "", false},
		{[]string{"-namespace", "default", "-address", sock, "-id", "c1", "-bundle", "/b", "delete"}, "", false},
		{[]string{"-namespace", CRINamespace, "-id", "c1", "-address", sock}, "", false},
		{[]string{"-namespace", "default", "-id", "c1", "-address", sock}, "0", false},
		{[]string{"-v"}, "", false},
		{[]string{"-namespace", "default", "-id", "c1", "-address", sock, "-unknown-flag"}, "", false},
	} {
		earlyPrefetch.Store(nil)
		t.Setenv(EnvLabels, tc.labels)
		PrefetchAtStart(tc.args)
		p := earlyPrefetch.Load()
		if (p != nil) != tc.want {
			t.Fatalf("%v (labels %q): prefetch started %v, want %v", tc.args, tc.labels, p != nil, tc.want)
		}
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%v: prefetch did not finish", tc.args)
		}
		if p.id != "c1" || p.err != nil || p.labels["detshare.io/tier"] != "burstable" {
			t.Fatalf("%v: prefetch %+v, want c1's labels from namespace default", tc.args, p)
		}
	}
}
