// Package simgpu holds the tests of DetShare's simulated GPU, a test double of the CUDA driver
// (build/lib/simgpu/libcuda.so.1, sources in src/) and of its test programs (progs/, built into build/tests/).
// The tests run the programs as real processes against the double, so that scheduling, isolation and memory
// accounting are exercised across processes the way they are on a GPU. README.md describes the model.
package simgpu
