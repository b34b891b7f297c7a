package workload

import (
	"os"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

func TestFromAnnotations(t *testing.T) {
	containerd := map[string]string{"io.kubernetes.cri.sandbox-name": "infer-7f9", "io.kubernetes.cri.sandbox-namespace": "team-a",
		"io.kubernetes.cri.container-name": "server", "io.kubernetes.cri.container-type": "container"}
	if got, want := FromAnnotations(containerd), (Identity{"infer-7f9", "team-a", "server"}); got != want {
		t.Errorf("containerd annotations: %+v, want %+v", got, want)
	}
	crio := map[string]string{"io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "c"}
	if got, want := FromAnnotations(crio), (Identity{"p", "default", "c"}); got != want {
		t.Errorf("CRI-O annotations: %+v, want %+v", got, want)
	}
	if !FromAnnotations(map[string]string{"detshare.io/tier": "burstable"}).IsZero() {
		t.Error("no Kubernetes annotations: want an unknown identity")
	}
}

// Anyone running a container through ctr or Docker can set these annotations: values that are not Kubernetes names
// (label injection, huge strings) are dropped rather than exported.
func TestHostileAnnotationsDropped(t *testing.T) {
	for _, v := range []string{"a\"} 1\nfake_metric{x=\"", strings.Repeat("a", 254), "UPPER", "a b", "", "a/b"} {
		if got := FromAnnotations(map[string]string{"io.kubernetes.pod.name": v}); got.Pod != "" {
			t.Errorf("pod name %q accepted", v)
		}
	}
}

func TestWriteRead(t *testing.T) {
	p := table.NewPaths(t.TempDir())
	if err := os.MkdirAll(p.TenantDir("c1"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := Identity{"infer", "default", "server"}
	if err := Write(p, "c1", want); err != nil {
		t.Fatal(err)
	}
	if got := Read(p, "c1"); got != want {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	if got := Read(p, "missing"); !got.IsZero() {
		t.Errorf("missing tenant: %+v", got)
	}
	os.WriteFile(File(p, "c1"), []byte("pod=ok\nnamespace=BAD NS\ncontainer=x\"y\n"), 0o644)
	if got := Read(p, "c1"); got != (Identity{Pod: "ok"}) {
		t.Errorf("tampered file: %+v, want only the valid pod name", got)
	}
}
