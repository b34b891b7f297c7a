// Package gpu holds DetShare's real-GPU benchmark suite (Python and bash scripts run by run_all.sh on a GPU
// machine) and the Go tests that check those scripts without a GPU: the Python table writer against the Go
// mirror of the table and against libdetshare on the simulated GPU (a test double), the report arithmetic on
// recorded inputs, and the whole harness on CPU with tiny models when a PyTorch is installed.
package gpu
