// Package e2e is DetShare's Kubernetes end-to-end test on real components: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kubelet (v1.36.3 with its DRA feature gates; the versions are in
// integration/kubernetes/versions.env, DETSHARE_K8S_VERSION picks another cached one), containerd v2.2.9 with the
// DetShare runtime handler (config version 3), DetShare's device plugin and DRA driver, all on loopback, with pods running on the simulated GPU (a test
// double). integration/kubernetes/build-components.sh builds the components into /var/cache/detshare-k8s
// (DETSHARE_K8S_CACHE); `make build` builds DetShare's side.
//
// Missing components fail the tests with the command that builds them; DETSHARE_SKIP_K8S=1 skips them instead.
package e2e
