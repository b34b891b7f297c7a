package simgpu

import (
	"os"
	"path/filepath"
	"strings"
)

// Environment variables read by the simulated GPU (README.md); the size variables, which also select it in
// DetShare's binaries, are internal/simgpu's.
const (
	EnvState = "DETSHARE_SIMGPU_STATE"
	EnvMPS   = "DETSHARE_SIMGPU_MPS"
)

// EnvDeviceDir names the directory where the simulated libcuda.so.1 (a test double) looks for its device nodes
// (detshare-simgpu<N>). Unset, every simulated GPU is visible (host tests, like a host with the driver loaded);
// set (the container tests set /dev), cuInit fails with CUDA_ERROR_NO_DEVICE unless a node is there, as the real
// driver does in a container that was not given /dev/nvidia<N>.
const EnvDeviceDir = "DETSHARE_SIMGPU_DEVICE_DIR"

// LibDir is the directory holding the simulated libcuda.so.1 and libnvidia-ml.so.1 under a build directory.
func LibDir(buildDir string) string { return filepath.Join(buildDir, "lib", "simgpu") }

// ProbePath is simgpu-probe (the runtime-path test program) under a build directory; ProbePath+"-linked" is the
// build linked with -lcuda.
func ProbePath(buildDir string) string { return filepath.Join(buildDir, "tests", "simgpu-probe") }

// Env returns the current environment, minus any simulated-GPU, MPS and loader settings, plus what selects a
// private simulated GPU whose state lives in stateFile, plus extra ("KEY=value"). Tests of other components use
// it so that every process of one test shares one simulated device and tests do not see each other's.
func Env(buildDir, stateFile string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DETSHARE_SIMGPU_") || strings.HasPrefix(kv, "CUDA_MPS_") ||
			strings.HasPrefix(kv, "LD_LIBRARY_PATH=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LD_LIBRARY_PATH="+LibDir(buildDir), EnvState+"="+stateFile)
	return append(env, extra...)
}
