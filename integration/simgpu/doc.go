// Package simgpu is DetShare's simulated GPU, a test double of the CUDA driver and NVML
// (build/lib/simgpu/libcuda.so.1 and libnvidia-ml.so.1, sources in src/ and nvml/), and its test programs
// (progs/, built into build/tests/). The Go package offers what other components' tests need to run processes
// against a private simulated device (Env, LibDir, ProbePath); its tests run the programs as real processes, so
// scheduling, isolation and memory accounting are exercised across processes the way they are on a GPU.
// README.md describes the model. Only tests import it: the binaries' choice of the simulated GPU is
// internal/simgpu, its device source cgroupgpu/cdi.Simulated.
package simgpu
