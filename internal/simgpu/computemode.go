package simgpu

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/detshare/detshare/internal/atomicfile"
)

// EnvState names the simulated GPU's state file (integration/simgpu/README.md); by default
// /dev/shm/detshare-simgpu-<uid>.
const EnvState = "DETSHARE_SIMGPU_STATE"

// StatePath is the simulated GPU's state file as env selects it.
func StatePath(env []string) string {
	if p := envMap(env)[EnvState]; p != "" {
		return p
	}
	return fmt.Sprintf("/dev/shm/detshare-simgpu-%d", os.Getuid())
}

// ComputeModes are the simulated GPUs' compute modes (a test double of `nvidia-smi -c`): GPU N's mode is the file
// <state file>.compute-mode-<N>, "default" or "exclusive_process" (absent: default), which the simulated libcuda.so.1
// reads when a process creates a context. In EXCLUSIVE_PROCESS mode a process that is not a client of the simulated
// MPS (CUDA_MPS_PIPE_DIRECTORY unset, or naming no directory with a control file) is refused a context with
// CUDA_ERROR_DEVICE_UNAVAILABLE, as the real driver refuses it while the MPS server holds the GPU. The scheduler sets
// it for mps.exclusive (sched/daemon ComputeModes).
type ComputeModes struct {
	State string // the state file (StatePath)
}

func (c ComputeModes) path(gpu int) string { return fmt.Sprintf("%s.compute-mode-%d", c.State, gpu) }

// ComputeMode reads GPU gpu's mode.
func (c ComputeModes) ComputeMode(gpu int) (string, error) {
	b, err := os.ReadFile(c.path(gpu))
	if errors.Is(err, os.ErrNotExist) {
		return "default", nil
	}
	if err != nil {
		return "", fmt.Errorf("simulated GPU %d compute mode: %w", gpu, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// SetComputeMode sets GPU gpu's mode: "default" or "exclusive_process" (the modes the simulated GPU models).
func (c ComputeModes) SetComputeMode(gpu int, mode string) error {
	switch mode {
	case "default":
		if err := os.Remove(c.path(gpu)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("simulated GPU %d compute mode: %w", gpu, err)
		}
		return nil
	case "exclusive_process":
		if err := atomicfile.Write(c.path(gpu), []byte(mode+"\n"), 0o644, false); err != nil {
			return fmt.Errorf("simulated GPU %d compute mode: %w", gpu, err)
		}
		return nil
	}
	return fmt.Errorf("simulated GPU %d compute mode %q: allowed values are default, exclusive_process", gpu, mode)
}
