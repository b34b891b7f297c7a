// Package workload records which Kubernetes pod and container a tenant is, so that metrics and `detshare status`
// can label a tenant as DCGM exporter labels a GPU process (pod, namespace, container). The runtime reads the
// identity from the CRI annotations in the container's OCI spec (containerd's io.kubernetes.cri.*, CRI-O's and
// kubelet's io.kubernetes.pod.* / io.kubernetes.container.name) and writes it, host-side, beside the tenant's quota
// file; readers take it from there. It lives in internal/ because both wings use it: registration
// (cgroupgpu/tenant) writes the record, the scheduler's view (sched/view) reads it.
//
// The annotations are written by the engine, but an engine user (ctr, Docker) can set any annotation, so the values
// are only labels: they are bounded, must look like Kubernetes names, and never change a quota.
package workload

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/table"
)

// Identity is the pod and container a tenant runs as; empty fields are unknown.
type Identity struct {
	Pod, Namespace, Container string
}

// IsZero reports whether nothing is known.
func (i Identity) IsZero() bool { return i == Identity{} }

// The annotation keys, containerd's first.
var (
	podKeys       = []string{"io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"}
	namespaceKeys = []string{"io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"}
	containerKeys = []string{"io.kubernetes.cri.container-name", "io.kubernetes.container.name"}
)

// maxName is the longest Kubernetes object name (a DNS subdomain).
const maxName = 253

// FromAnnotations reads the identity from OCI spec annotations; values that are not Kubernetes-like names are
// dropped.
func FromAnnotations(ann map[string]string) Identity {
	pick := func(keys []string) string {
		for _, k := range keys {
			if v, ok := ann[k]; ok && validName(v) {
				return v
			}
		}
		return ""
	}
	return Identity{Pod: pick(podKeys), Namespace: pick(namespaceKeys), Container: pick(containerKeys)}
}

// validName accepts what Kubernetes accepts for pod, namespace and container names: lower-case alphanumerics, '-'
// and '.', at most 253 characters.
func validName(s string) bool {
	if s == "" || len(s) > maxName {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// File is where tenant id's identity lives (removed with the tenant directory on deregistration).
func File(p table.Paths, id string) string { return filepath.Join(p.TenantDir(id), "workload") }

// Write stores the identity of tenant id (nothing for an unknown one).
func Write(p table.Paths, id string, i Identity) error {
	if i.IsZero() {
		return nil
	}
	body := fmt.Sprintf("pod=%s\nnamespace=%s\ncontainer=%s\n", i.Pod, i.Namespace, i.Container)
	if err := atomicfile.Write(File(p, id), []byte(body), table.QuotaFileMode, false); err != nil {
		return fmt.Errorf("write workload identity of %s: %w", id, err)
	}
	return nil
}

// Read returns tenant id's identity; a missing or unreadable file is an unknown identity, and values failing the
// name check are dropped.
func Read(p table.Paths, id string) Identity {
	data, err := os.ReadFile(File(p, id))
	if err != nil || len(data) > 4*maxName {
		return Identity{}
	}
	var i Identity
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, "=")
		if !validName(v) {
			continue
		}
		switch k {
		case "pod":
			i.Pod = v
		case "namespace":
			i.Namespace = v
		case "container":
			i.Container = v
		}
	}
	return i
}
