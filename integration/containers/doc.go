// Package containers holds DetShare's end-to-end container tests: real containerd, runc and Docker from Debian,
// started by the tests with private roots and sockets, running a simulated-GPU (test double) workload through
// `ctr run --runtime io.containerd.detshare.v1`, `docker run --runtime=detshare` (the runc wrapper) and a CRI pod
// driven over containerd's socket as kubelet drives it. Everything lives in the test files; this file only names
// the package.
//
// The tests need root, containerd, ctr, runc, dockerd, docker, busybox-static and a built tree (`make build`). A
// missing piece fails the test with the reason; DETSHARE_SKIP_CONTAINERS=1 skips them instead. DETSHARE_CONTAINERD_BIN
// names a directory with another containerd, ctr and containerd-shim-runc-v2 to test (containerd 2.x gets a config
// version 3; integration/kubernetes/build-components.sh builds v2.2.9).
package containers
