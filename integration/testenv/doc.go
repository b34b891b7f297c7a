// Package testenv is what DetShare's end-to-end tests share to run real engines: the workload and pause images,
// built locally (no registry) with internal/ociimage in the `docker save` format that `ctr images import` and
// `docker load` read, containerd configuration for
// containerd 1.x (config version 2) and 2.x (version 3) with the DetShare runtime handler, and starting, stopping and
// cleaning up after daemons. integration/containers and the Kubernetes end-to-end test (k8s/e2e) use it.
package testenv
