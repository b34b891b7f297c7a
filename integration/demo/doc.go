// Package demo holds `make demo` (demo.sh: a private containerd with DetShare's shim, a latency-critical and a
// best-effort container on the simulated GPU, alone / shared without DetShare / shared with DetShare) and its
// test, which runs the demo as CI does and checks the table it ends with and that it cleans up after itself.
package demo
