// Package simgpu is the Go side of choosing the simulated GPU, a test double (its C sources, build and test
// programs live in integration/simgpu): whether the environment selects it (Selected), the GPUs it then describes
// (GPUs), and the one choice of GPU discovery the binaries wire in (OrReal; Discover for tests). Its device source
// is cgroupgpu/cdi.Simulated. It lives under internal/ because production code chooses through it: binaries must
// never import the test folder integration/.
package simgpu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/detshare/detshare/internal/quote"
	"github.com/detshare/detshare/internal/table"
)

// Variables that select the simulated GPU in DetShare's own binaries (docs/internals.md "Simulated GPU selection").
// The size variables (EnvCount, EnvSMs, EnvMem), which the simulated libcuda.so.1 reads too
// (integration/simgpu/README.md), select it as well.
const (
	EnvSelect    = "DETSHARE_SIMGPU"
	EnvSimulated = "DETSHARE_SIMULATED_GPU" // the name `detshare doctor --simulated-gpu` reads
	EnvCount     = "DETSHARE_SIMGPU_COUNT"
	EnvSMs       = "DETSHARE_SIMGPU_SMS"
	EnvMem       = "DETSHARE_SIMGPU_MEM"
)

// ErrNotSelected is returned by the discovery OrReal builds when the environment does not select the simulated GPU
// and the binary has no real discovery (the NVML-free hook, shim and runc wrapper).
var ErrNotSelected = errors.New("no GPUs are recorded in the table and none can be discovered here: " +
	"start the scheduler (`detshare sched`) or select the simulated GPU (DETSHARE_SIMGPU=1, a test double)")

// Selected tells whether env (KEY=VALUE list, e.g. os.Environ()) selects the simulated GPU (a test double):
// DETSHARE_SIMGPU=1 (or DETSHARE_SIMULATED_GPU=1), or any of DETSHARE_SIMGPU_SMS / _MEM / _COUNT set.
func Selected(env []string) bool {
	m := envMap(env)
	for _, k := range []string{EnvSelect, EnvSimulated} {
		if v, ok := m[k]; ok {
			return v == "1" || v == "true"
		}
	}
	for _, k := range []string{EnvSMs, EnvMem, EnvCount} {
		if _, ok := m[k]; ok {
			return true
		}
	}
	return false
}

// GPUs describes the simulated GPUs (test doubles) configured by env with the simulated GPU's defaults: 1 GPU,
// 132 SMs, 80 GiB. Their UUIDs start with "SIM-" and their name says they are simulated.
func GPUs(env []string) ([]table.GPUInfo, error) {
	m := envMap(env)
	num := func(key string, def uint64, lo, hi uint64) (uint64, error) {
		v, ok := m[key]
		if !ok || v == "" {
			return def, nil
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%s=%s: must be an integer in %d..%d", key, quote.Q(v), lo, hi)
		}
		return n, nil
	}
	count, err := num(EnvCount, 1, 1, table.MaxGPUs)
	if err != nil {
		return nil, err
	}
	sms, err := num(EnvSMs, 132, 1, 1<<16)
	if err != nil {
		return nil, err
	}
	mem, err := num(EnvMem, 80<<30, 1, 1<<50)
	if err != nil {
		return nil, err
	}
	out := make([]table.GPUInfo, count)
	for i := range out {
		out[i] = table.GPUInfo{Index: i, UUID: fmt.Sprintf("SIM-00000000-0000-0000-0000-%012d", i),
			Name: "DetShare simulated GPU (test double)", SMCount: uint32(sms), MemTotal: mem}
	}
	return out, nil
}

// OrReal is the one choice of GPU backend, which each binary's main wires in (cmd/internal/wiring, the k8s
// plugins): the returned discovery describes the simulated GPU (a test double) when the process environment
// selects it at the time of the call, and otherwise calls real (NVML discovery, sched/gpuinfo.Discover). A nil real
// (the NVML-free binaries: a real host gets its GPUs into the table from the scheduler) fails with ErrNotSelected.
func OrReal(real func() ([]table.GPUInfo, error)) func() ([]table.GPUInfo, error) {
	return func() ([]table.GPUInfo, error) {
		if env := os.Environ(); Selected(env) {
			g, err := GPUs(env)
			if err != nil {
				return nil, fmt.Errorf("simulated GPU (test double): %w", err)
			}
			return g, nil
		}
		if real == nil {
			return nil, ErrNotSelected
		}
		return real()
	}
}

// Discover describes the simulated GPUs the environment selects, or fails with ErrNotSelected: OrReal(nil), the
// discovery tests register tenants with.
func Discover() ([]table.GPUInfo, error) { return OrReal(nil)() }

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
