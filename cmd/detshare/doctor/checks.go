package doctor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/internal/kubeletdevices"
	"github.com/detshare/detshare/internal/layout"
	"github.com/detshare/detshare/sched/ensure"
	"github.com/detshare/detshare/shimv2/front"
)

// Env is what the checks look at; tests replace its parts.
type Env struct {
	// LibDir holds simgpu/, the simulated GPU (a test double): build/lib of a build tree, $PREFIX/lib/detshare
	// installed.
	LibDir string
	// BinDir holds the detshare binary; `detshare run` preloads the library found next to it (internal/layout).
	BinDir string
	// DockerConfig and ContainerdConfig are the engines' configuration files (containerd's imports and
	// conf.d/*.toml next to it are read too).
	DockerConfig, ContainerdConfig string
	// RunDir is DetShare's run directory; SchedulerRunning tells whether a scheduler leads it.
	RunDir           string
	SchedulerRunning func(runDir string) bool
	// SchedulerPID is the leading scheduler's PID (0: none); ProcRoot is /proc, where its exe is read.
	SchedulerPID func(runDir string) int
	ProcRoot     string
	// Simulated selects the simulated GPU (test double) instead of the NVIDIA driver.
	Simulated bool
	// LookPath and Output run host tools; Output returns combined output.
	LookPath func(string) (string, error)
	Output   func(name string, args ...string) (string, error)
	// ReadFile reads configuration files (daemon.json, config.toml).
	ReadFile func(string) ([]byte, error)
	// Driver reports the NVIDIA driver through NVML.
	Driver func() DriverInfo
	// HostConfig is the scheduler's configuration file (config.PathFromEnv); "" or missing: the defaults.
	HostConfig string
	// CDIDirs are where CDI specs are looked for; DevicePluginDir is kubelet's device-plugin directory (its
	// checkpoint lists what each device plugin advertises); PluginsRegistry where kubelet plugins (DRA drivers)
	// register.
	CDIDirs                          []string
	DevicePluginDir, PluginsRegistry string
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
		LibDir:           libDir,
		BinDir:           layout.BinDir(),
		DockerConfig:     "/etc/docker/daemon.json",
		ContainerdConfig: "/etc/containerd/config.toml",
		RunDir:           "/run/detshare",
		SchedulerRunning: ensure.LeaderRunning,
		SchedulerPID:     LeaderPID,
		ProcRoot:         "/proc",
		Simulated:        simulated,
		LookPath:         exec.LookPath,
		Output: func(name string, args ...string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
			return string(out), err
		},
		ReadFile:        os.ReadFile,
		Driver:          nvmlDriverInfo,
		HostConfig:      config.PathFromEnv(),
		CDIDirs:         []string{"/etc/cdi", "/var/run/cdi"},
		DevicePluginDir: kubeletdevices.DefaultDevicePluginDir,
		PluginsRegistry: kubeletdevices.DefaultPluginsRegistry,
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
	r.Checks = append(r.Checks, checkExclusive(env))
	r.Checks = append(r.Checks, checkLibrary("libdetshare (run)", layout.LibPathFor(os.Getenv(layout.EnvLib), env.BinDir)))
	r.Checks = append(r.Checks, checkEngines(env)...)
	r.Checks = append(r.Checks, checkScheduler(env))
	if c, ok := checkSchedulerExe(env); ok {
		r.Checks = append(r.Checks, c)
	}
	r.Checks = append(r.Checks, checkFailOpens(env))
	r.Checks = append(r.Checks, checkPlatform(env)...)
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

// checkExclusive warns while the scheduler's configuration leaves the GPUs out of EXCLUSIVE_PROCESS compute mode
// (mps.exclusive, issue 27): a tenant process can then leave MPS, and its server-side memory limit, by unsetting or
// changing CUDA_MPS_PIPE_DIRECTORY.
func checkExclusive(env Env) Check {
	c := Check{Name: "mps exclusive", Need: "[mps] exclusive = true: every tenant process stays an MPS client"}
	cfg := config.Default()
	if env.HostConfig != "" {
		data, err := env.ReadFile(env.HostConfig)
		if err == nil {
			cfg, err = config.Parse(env.HostConfig, data)
		} else if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err != nil {
			c.Status, c.Found = Fail, err.Error()
			c.Fix = "fix " + env.HostConfig + " (configs/detshare/config.toml documents every key)"
			return c
		}
	}
	switch {
	case cfg.MPS.Enable && cfg.MPS.Exclusive:
		c.Status, c.Found = OK, "mps.exclusive = true: the scheduler keeps the GPUs in EXCLUSIVE_PROCESS compute mode"
	case !cfg.MPS.Enable:
		c.Status, c.Found = Warn, "mps.enable = false: a process that bypasses libdetshare is bounded by nothing"
		c.Fix = "set [mps] enable = true and exclusive = true in " + env.HostConfig + " where tenants are hostile"
	default:
		c.Status = Warn
		c.Found = "mps.exclusive = false: a tenant process that unsets or changes CUDA_MPS_PIPE_DIRECTORY leaves MPS " +
			"and its server-side memory limit"
		c.Fix = "set [mps] exclusive = true in " + env.HostConfig + " and restart the scheduler (the GPUs are then " +
			"used through MPS only while it runs)"
	}
	return c
}

func checkSimulated(env Env) Check {
	p := filepath.Join(env.LibDir, "simgpu", "libcuda.so.1")
	if _, err := os.Stat(p); err != nil {
		return Check{Name: "simulated gpu", Status: Fail, Found: "not found: " + p,
			Need: "the simulated GPU driver (test double)",
			Fix:  "reinstall DetShare (`make install` and the .deb put it in <lib>/detshare/simgpu), or point --lib-dir at a build tree's lib/ (`make build`)"}
	}
	return Check{Name: "simulated gpu", Status: OK, Found: "test double at " + p + " (set LD_LIBRARY_PATH=" + filepath.Dir(p) + ")"}
}

// checkLibrary checks the library a component preloads or bind-mounts into containers: a readable regular file.
func checkLibrary(name, p string) Check {
	c := Check{Name: name, Need: "libdetshare.so readable where the runtime mounts it from",
		Fix: "reinstall DetShare (`make install` or the .deb) so that " + p + " exists, or set DETSHARE_LIB for the engines"}
	f, err := os.Open(p)
	if err != nil {
		c.Status, c.Found = Fail, "not readable: "+err.Error()
		return c
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		c.Status, c.Found = Fail, p+": not a regular file"
		return c
	}
	c.Status, c.Found, c.Fix = OK, p, ""
	return c
}

// checkChain follows one engine's registration to the files it needs: the registered binary must be an executable
// file, and the library next to it (what it bind-mounts into containers) readable.
func checkChain(engine, bin string) []Check {
	bc := Check{Name: engine + " runtime binary", Need: "the registered binary, executable"}
	if !layout.IsExecutable(bin) {
		bc.Status, bc.Found = Fail, "registered "+bin+" is not an executable file"
		bc.Fix = "install DetShare (`make install` or the .deb), then detshare install " + engine
		return []Check{bc}
	}
	if filepath.Base(bin) == front.BinaryName {
		// the front execs or starts the serving shim installed beside it
		if _, err := front.ServePath(bin); err != nil {
			bc.Status, bc.Found = Fail, "registered "+bin+": "+err.Error()
			bc.Fix = "install DetShare (`make install` or the .deb install both shim binaries)"
			return []Check{bc}
		}
	}
	bc.Status, bc.Found = OK, bin
	return []Check{bc, checkLibrary(engine+" library", layout.LibPathFor(os.Getenv(layout.EnvLib), filepath.Dir(bin)))}
}

// checkScheduler: a leader holds the run directory's lock, or the runtime can start one on demand (a detshare
// binary next to the detshare tools).
func checkScheduler(env Env) Check {
	c := Check{Name: "scheduler", Need: "a running `detshare sched`, or a detshare binary the runtime starts on demand"}
	if env.SchedulerRunning != nil && env.SchedulerRunning(env.RunDir) {
		c.Status, c.Found = OK, "running (holds "+filepath.Join(env.RunDir, "sched.lock")+")"
		return c
	}
	if bin := filepath.Join(env.BinDir, "detshare"); layout.IsExecutable(bin) {
		c.Status, c.Found = OK, "not running; the first tenant starts it on demand ("+bin+" sched)"
		return c
	}
	c.Status, c.Found = Fail, "not running, and no detshare binary in "+env.BinDir+" to start it"
	c.Fix = "systemctl enable --now detshare-sched (installed by `make install` and the .deb)"
	return c
}

// checkFailOpens reports tenants that ran without DetShare under [tenants] fail_open.
func checkFailOpens(env Env) Check {
	n := failopen.Count(env.RunDir)
	if n == 0 {
		return Check{Name: "fail-open events", Status: OK, Found: "none"}
	}
	c := Check{Name: "fail-open events", Status: Warn, Found: fmt.Sprintf("%d tenants ran WITHOUT DetShare", n),
		Fix: "see " + filepath.Join(env.RunDir, failopen.FileName)}
	if e, ok := failopen.Last(env.RunDir); ok {
		c.Found += fmt.Sprintf("; last %s at %s: %s", e.ID, e.Time, e.Reason)
	}
	return c
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
	registered := 0
	var chain []Check
	// engine reports one installed engine: whether its configuration registers DetShare's runtime (bin) and, if so,
	// the chain from the engine to the library.
	engine := func(name, found string, runtime func(Env) (string, bool), configPath, restart string) {
		c := Check{Name: name, Found: found}
		if bin, ok := runtime(env); ok {
			registered++
			c.Status, c.Found = OK, c.Found+", detshare runtime registered"
			chain = append(chain, checkChain(name, bin)...)
		} else {
			c.Status, c.Found = Warn, c.Found+", detshare runtime not registered in "+configPath
			c.Fix = "detshare install " + name + " (then restart " + restart + ")"
		}
		out = append(out, c)
	}
	if hasCtrd {
		engine("containerd", "containerd "+ctrdV, containerdShim, env.ContainerdConfig, "containerd")
	} else {
		out = append(out, Check{Name: "containerd", Status: Info, Found: "not found (needed for ctr, Kubernetes and Docker)",
			Fix: "apt-get install containerd"})
	}
	if hasDock {
		engine("docker", "dockerd "+dockV, dockerRuntime, env.DockerConfig, "dockerd")
	} else {
		out = append(out, Check{Name: "docker", Status: Info, Found: "not found"})
	}
	if (hasCtrd || hasDock) && registered == 0 {
		out = append(out, Check{Name: "runtime registration", Status: Fail,
			Found: "no container engine has the detshare runtime", Fix: "detshare install containerd (and/or docker)"})
	}
	out = append(out, chain...)
	if !hasRunc && !hasCtrd && !hasDock {
		out = append(out, Check{Name: "container engines", Status: Warn,
			Found: "none: only `detshare run` tenants are possible", Fix: "apt-get install containerd runc"})
	}
	return out
}

// dockerRuntime returns the binary daemon.json registers as the detshare runtime: "path" (runc wrapper) or an
// absolute "runtimeType" (shim, Docker >= 24); a shim type name is looked up on PATH.
func dockerRuntime(env Env) (string, bool) {
	b, err := env.ReadFile(env.DockerConfig)
	if err != nil {
		return "", false
	}
	var cfg struct {
		Runtimes map[string]struct {
			Path        string `json:"path"`
			RuntimeType string `json:"runtimeType"`
		} `json:"runtimes"`
	}
	if json.Unmarshal(b, &cfg) != nil {
		return "", false
	}
	rt, ok := cfg.Runtimes["detshare"]
	if !ok {
		return "", false
	}
	switch {
	case rt.Path != "":
		if !filepath.IsAbs(rt.Path) {
			if p, err := env.LookPath(rt.Path); err == nil {
				return p, true
			}
		}
		return rt.Path, true
	case filepath.IsAbs(rt.RuntimeType):
		return rt.RuntimeType, true
	}
	p, err := env.LookPath("containerd-shim-detshare-v1")
	if err != nil {
		return "containerd-shim-detshare-v1 (not on PATH)", true
	}
	return p, true
}

// containerdShim returns the shim the detshare CRI handler runs: its runtime_path, else containerd-shim-detshare-v1
// on PATH. The config, its imports and conf.d/*.toml beside it are read, in containerd 1.x and 2.x dialects.
func containerdShim(env Env) (string, bool) {
	files := []string{env.ContainerdConfig}
	var imports []string
	if b, err := env.ReadFile(env.ContainerdConfig); err == nil {
		var top struct {
			Imports []string `toml:"imports"`
		}
		if _, err := toml.Decode(string(b), &top); err == nil {
			imports = top.Imports
		}
	}
	for _, imp := range append(imports, filepath.Join(filepath.Dir(env.ContainerdConfig), "conf.d", "*.toml")) {
		if m, _ := filepath.Glob(imp); m != nil {
			files = append(files, m...)
		}
	}
	for _, f := range files {
		b, err := env.ReadFile(f)
		if err != nil {
			continue
		}
		var m map[string]any
		if _, err := toml.Decode(string(b), &m); err != nil {
			continue
		}
		for _, plugin := range []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"} {
			rt, ok := LookupTOML(m, "plugins", plugin, "containerd", "runtimes", "detshare")
			if !ok {
				continue
			}
			if p, _ := rt.(map[string]any)["runtime_path"].(string); p != "" {
				return p, true
			}
			if p, err := env.LookPath("containerd-shim-detshare-v1"); err == nil {
				return p, true
			}
			return "containerd-shim-detshare-v1 (not on PATH)", true
		}
	}
	return "", false
}

// LookupTOML walks a decoded TOML document along keys (the installer edits what doctor reads).
func LookupTOML(m map[string]any, keys ...string) (any, bool) {
	var cur any = m
	for _, k := range keys {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}
