package main

import (
	"os/exec"
	"strings"
	"testing"
)

// containerd executes the shim binary three times per container (start, the shim itself, delete), so every
// package it links costs each container start its initialisation and its pages (BENCHMARKS.md, issue 28,
// 2026-11-27). The packages below added a third to the binary and ~8 ms to each process start: grpc-go's client
// (with net/http, crypto/tls and html/template behind it; the label lookup speaks the one call it needs itself,
// shimv2.ContainerdLabels) and containerd's pause sandbox plugin (a stub sandbox service of containerd 1.7, which
// pulls grpc-go in through the sandbox API's generated code).
func TestShimLinksNoGRPCClientOrHTTP(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	if !deps["github.com/detshare/detshare/shimv2"] {
		t.Fatalf("go list -deps did not list shimv2: %s", out)
	}
	for _, p := range []string{"google.golang.org/grpc", "net/http", "crypto/tls", "html/template",
		"github.com/containerd/containerd/runtime/v2/runc/pause", "github.com/containerd/containerd/api/runtime/sandbox/v1"} {
		if deps[p] {
			t.Errorf("the shim links %s", p)
		}
	}
}
