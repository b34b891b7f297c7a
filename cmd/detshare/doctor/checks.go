package doctor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Env is what the checks look at; tests replace its parts.
type Env struct {
	// LibDir holds libdetshare.so and simgpu/ (default: ../lib next to the detshare binary).
	LibDir string
	// Simulated selects the simulated GPU (test double) instead of the NVIDIA driver.
	Simulated bool
	// LookPath and Output run host tools; Output returns combined output.
	LookPath func(string) (string, error)
	Output   func(name string, args ...string) (string, error)
	// ReadFile reads configuration files (daemon.json, config.toml).
	ReadFile func(string) ([]byte, error)
	// Driver reports the NVIDIA driver through NVML.
	Driver func() DriverInfo
}

// DriverInfo is what NVML says about the driver and GPUs.
type DriverInfo struct {
	Err           error // nil when NVML answered
	DriverVersion string
	CUDAVersion   int // e.g. 13000
	GPUs          []GPU
}

// GPU is one device as NVML reports it.
type GPU struct {
	Index    int    `json:"index"`
	Name     string `json:"name"`
	UUID     string `json:"uuid"`
	MemBytes uint64 `json:"mem_bytes"`
}

// DefaultEnv inspects the real host.
func DefaultEnv(libDir string, simulated bool) Env {
	return Env{
		LibDir:    libDir,
		Simulated: simulated,
		LookPath:  exec.LookPath,
		Output: func(name string, args ...string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
			return string(out), err
		},
		ReadFile: os.ReadFile,
		Driver:   nvmlDriverInfo,
	}
}

// Run performs every check.
func Run(env Env) *Report {
	r := &Report{SimulatedGPU: env.Simulated}
	if env.Simulated {
		r.Checks = append(r.Checks, checkSimulated(env))
	} else {
		r.Checks = append(r.Checks, checkDriver(env)...)
		r.Checks = append(r.Checks, checkMPS(env))
	}
	r.Checks = append(r.Checks, checkLibrary(env))
	r.Checks = append(r.Checks, checkEngines(env)...)
	r.Finish()
	return r
}

func cudaString(v int) string { return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10) }

func checkDriver(env Env) []Check {
	d := env.Driver()
	if d.Err != nil {
		return []Check{{Name: "nvidia driver", Status: Fail, Found: "no NVIDIA driver: " + d.Err.Error(),
			Need: "NVIDIA driver with CUDA >= 12.5 (green-context streams)",
			Fix:  "install the NVIDIA driver (R555 or newer), or try DetShare with the simulated GPU: detshare doctor --simulated-gpu"}}
	}
	out := []Check{}
	c := Check{Name: "nvidia driver", Found: fmt.Sprintf("driver %s, CUDA %s", d.DriverVersion, cudaString(d.CUDAVersion)),
		Need: "CUDA >= 12.4 for green contexts, >= 12.5 for green-context streams"}
	switch {
	case d.CUDAVersion >= 12050:
		c.Status = OK
	case d.CUDAVersion >= 12040:
		c.Status = Warn
		c.Fix = "upgrade the driver to CUDA 12.5+ (R555+): without green-context streams DetShare falls back to temporal quanta"
	default:
		c.Status = Warn
		c.Fix = "upgrade the driver to CUDA 12.5+ (R555+); until then only temporal quanta and memory quotas work"
	}
	out = append(out, c)
	g := Check{Name: "gpus", Status: OK}
	if len(d.GPUs) == 0 {
		g.Status, g.Found, g.Fix = Fail, "NVML lists no GPU", "check `nvidia-smi`; the GPU may be hidden by CUDA_VISIBLE_DEVICES or MIG"
	} else {
		var names []string
		for _, gpu := range d.GPUs {
			names = append(names, fmt.Sprintf("%d: %s %s (%d MiB)", gpu.Index, gpu.Name, gpu.UUID, gpu.MemBytes>>20))
		}
		g.Found = strings.Join(names, "; ")
	}
	return append(out, g)
}

func checkMPS(env Env) Check {
	c := Check{Name: "mps", Need: "nvidia-cuda-mps-control and nvidia-cuda-mps-server for spatial SM partitions"}
	ctl, err1 := env.LookPath("nvidia-cuda-mps-control")
	srv, err2 := env.LookPath("nvidia-cuda-mps-server")
	if err1 != nil || err2 != nil {
		c.Status, c.Found = Warn, "MPS binaries not found: DetShare will use temporal quanta (one tenant at a time)"
		c.Fix = "install the NVIDIA driver's MPS utilities (package nvidia-cuda-mps or the driver's full installer)"
		return c
	}
	c.Status, c.Found = OK, ctl+", "+srv
	return c
}

func checkSimulated(env Env) Check {
	p := filepath.Join(env.LibDir, "simgpu", "libcuda.so.1")
	if _, err := os.Stat(p); err != nil {
		return Check{Name: "simulated gpu", Status: Fail, Found: "not built: " + p,
			Need: "the simulated GPU driver (test double)", Fix: "run `make build` in the DetShare checkout"}
	}
	return Check{Name: "simulated gpu", Status: OK, Found: "test double at " + p + " (set LD_LIBRARY_PATH=" + filepath.Dir(p) + ")"}
}

func checkLibrary(env Env) Check {
	p := filepath.Join(env.LibDir, "libdetshare.so")
	if _, err := os.Stat(p); err != nil {
		return Check{Name: "libdetshare", Status: Fail, Found: "missing: " + p, Need: "the interception library",
			Fix: "run `make build` (or install the release tarball) so that libdetshare.so sits in " + env.LibDir}
	}
	return Check{Name: "libdetshare", Status: OK, Found: p}
}

var versionRE = regexp.MustCompile(`\d+\.\d+(\.\d+)?`)

func toolVersion(env Env, name string, args ...string) (string, bool) {
	if _, err := env.LookPath(name); err != nil {
		return "", false
	}
	out, _ := env.Output(name, args...)
	if v := versionRE.FindString(out); v != "" {
		return v, true
	}
	return strings.TrimSpace(firstLine(out)), true
}

func firstLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	if sc.Scan() {
		return sc.Text()
	}
	return ""
}

// checkEngines reports container engines and whether DetShare is registered with them. One engine is enough;
// a host with none still runs `detshare run` tenants, so that is a warning, not a failure.
func checkEngines(env Env) []Check {
	var out []Check
	runcV, hasRunc := toolVersion(env, "runc", "--version")
	ctrdV, hasCtrd := toolVersion(env, "containerd", "--version")
	dockV, hasDock := toolVersion(env, "dockerd", "--version")
	if hasRunc {
		out = append(out, Check{Name: "runc", Status: OK, Found: "runc " + runcV})
	} else {
		out = append(out, Check{Name: "runc", Status: Warn, Found: "not found", Need: "runc >= 1.1 for containers",
			Fix: "apt-get install runc"})
	}
	if hasCtrd {
		c := Check{Name: "containerd", Found: "containerd " + ctrdV}
		if containerdRegistered(env) {
			c.Status, c.Found = OK, c.Found+", detshare runtime registered"
		} else {
			c.Status, c.Found = Warn, c.Found+", detshare runtime not registered"
			c.Fix = "detshare install containerd (then restart containerd)"
		}
		out = append(out, c)
	} else {
		out = append(out, Check{Name: "containerd", Status: Info, Found: "not found (needed for ctr, Kubernetes and Docker)",
			Fix: "apt-get install containerd"})
	}
	if hasDock {
		c := Check{Name: "docker", Found: "dockerd " + dockV}
		if dockerRegistered(env) {
			c.Status, c.Found = OK, c.Found+", detshare runtime registered"
		} else {
			c.Status, c.Found = Warn, c.Found+", detshare runtime not registered"
			c.Fix = "detshare install docker (then restart dockerd)"
		}
		out = append(out, c)
	} else {
		out = append(out, Check{Name: "docker", Status: Info, Found: "not found"})
	}
	if !hasRunc && !hasCtrd && !hasDock {
		out = append(out, Check{Name: "container engines", Status: Warn,
			Found: "none: only `detshare run` tenants are possible", Fix: "apt-get install containerd runc"})
	}
	return out
}

func dockerRegistered(env Env) bool {
	b, err := env.ReadFile("/etc/docker/daemon.json")
	if err != nil {
		return false
	}
	var cfg struct {
		Runtimes map[string]json.RawMessage `json:"runtimes"`
	}
	if json.Unmarshal(b, &cfg) != nil {
		return false
	}
	_, ok := cfg.Runtimes["detshare"]
	return ok
}

func containerdRegistered(env Env) bool {
	files := []string{"/etc/containerd/config.toml"}
	if m, _ := filepath.Glob("/etc/containerd/conf.d/*.toml"); m != nil {
		files = append(files, m...)
	}
	for _, f := range files {
		if b, err := env.ReadFile(f); err == nil && strings.Contains(string(b), "io.containerd.detshare.v1") {
			return true
		}
	}
	return false
}
