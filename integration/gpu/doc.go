// Package gpu holds DetShare's real-GPU benchmark suite (Python and bash scripts run by run_all.sh on a GPU
// machine) and the Go tests that check those scripts without a GPU. The benchmark (bench.py) drives the real
// `detshare sched` and `detshare run` (build/bin/detshare, carried to the GPU machine); dstable.py is only a test
// fixture that writes the table to move grants on purpose (conformance.sh, determinism.py, rebind.py) or to register
// one tenant (memquota.py). The tests check that fixture against the Go mirror of the table and against libdetshare
// on the simulated GPU (a test double), the report arithmetic on recorded inputs, and the whole harness on CPU with
// tiny models under the real scheduler on the simulated GPU when a PyTorch is installed.
package gpu
