package main

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

// --devices=auto publishes one shared device per GPU (consumable capacity) from Kubernetes 1.36 on, per SM group
// before; gpu and groups force it; anything else is refused naming the allowed values.
func TestDevicesModeFollowsTheAPIServer(t *testing.T) {
	for _, tc := range []struct {
		mode, major, minor string
		want               bool
	}{
		{"auto", "1", "34", false}, {"auto", "1", "35+", false}, {"auto", "1", "36", true}, {"auto", "1", "37+", true},
		{"gpu", "1", "34", true}, {"groups", "1", "37", false},
	} {
		client := fake.NewSimpleClientset()
		client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{Major: tc.major, Minor: tc.minor}
		got, err := consumable(tc.mode, client)
		if err != nil || got != tc.want {
			t.Errorf("--devices=%s on %s.%s: %v, %v; want %v", tc.mode, tc.major, tc.minor, got, err, tc.want)
		}
	}
	if _, err := consumable("shared", fake.NewSimpleClientset()); err == nil || !strings.Contains(err.Error(), "gpu, groups, auto") {
		t.Errorf("--devices=shared: %v, want a refusal listing gpu, groups, auto", err)
	}
}
