// Package hook is the container side of DetShare shared by the containerd shim, the runc wrapper and the
// detshare-hook binary: it decides whether a container wants DetShare, registers it (cgroupgpu/tenant), edits its
// spec (hook/specmod), and deregisters it when the container is deleted (Poststop).
//
// Two ways in:
//   - managed (shim, runc wrapper): Prepare runs before `runc create`. Registration and admission happen there, so a
//     bad quota fails the create with the quota's own message and nothing is created; the mounts go into the spec
//     (runc owns and undoes them). The caller deregisters itself, since every deletion passes through it (the
//     shim's Delete and its manager's Stop, the wrapper's `runc delete`), so it puts no poststop hook into the spec
//     (Request.NoPoststopHook; one exception there).
//   - standalone (hooks.d for podman/CRI-O): the createContainer hook registers and performs the same bind mounts
//     itself inside the container's mount namespace, before pivot_root; the poststop hook of
//     configs/hooks.d/detshare-poststop.json deregisters. That path is what `detshare-hook poststop` is for.
//
// Failure policy (README "When DetShare cannot serve a container"): a container that carries no DetShare setting is
// never touched. A container that asked for DetShare (any quota key) and cannot get it — its quota is wrong or not
// admitted, or DetShare itself fails (table or run directory full, no library, no GPU, no scheduler) — is refused
// with an error naming the cause, unless the host configured fail-open ([tenants] fail_open in
// /etc/detshare/config.toml, or DETSHARE_FAIL_OPEN=1): then a failure of DetShare itself lets it run unshared, with
// a warning on the container's stderr (Notice) and a count in the metrics (internal/failopen).
package hook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook/specmod"
	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/internal/layout"
	"github.com/detshare/detshare/internal/table"
)

// Environment variables that configure the container components (the shim and the wrapper inherit them from
// containerd/dockerd; the wrapper also takes them as flags).
const (
	EnvLib        = layout.EnvLib
	EnvHook       = "DETSHARE_HOOK"
	EnvFailClosed = "DETSHARE_FAIL_CLOSED" // 1: refuse even when the host config says fail_open
	EnvFailOpen   = "DETSHARE_FAIL_OPEN"   // 1: fail open whatever the host config says (tests, one-off engines)
)

// PreloadFileName is the file in the run directory whose content is the in-container library path; it is mounted
// read-only at /etc/ld.so.preload so every process of the container, `exec`'d ones included, loads the library.
const PreloadFileName = "ld.so.preload"

// Config locates DetShare's files on the host.
type Config struct {
	RunDir   string // run directory (table, clients/, tenants/)
	LibPath  string // host path of libdetshare.so
	HookPath string // host path of detshare-hook (absolute)
	FailOpen bool   // run containers unshared (loudly) when DetShare itself fails; default: refuse them
	// Registrar registers containers with the dependencies the binary's main chose (cmd/internal/wiring).
	Registrar tenant.Registrar
	// Devices gives a registered container the GPU it was placed on (cgroupgpu/cdi; the binary's main chooses
	// the host's or the simulated GPU's). nil gives no device: the container keeps whatever GPU its engine gave it.
	// Only the managed path (Prepare) applies it; the standalone hook leaves devices to the engine's CDI support.
	Devices cdi.Source
}

// ConfigFromEnv fills Config from the environment, the host configuration and the layout (internal/layout): the
// library and the hook are found next to the running binary, installed or in build/. reg is the binary's Registrar.
func ConfigFromEnv(reg tenant.Registrar) Config {
	c := Config{RunDir: table.RunDir(""), LibPath: layout.LibPath(), HookPath: os.Getenv(EnvHook),
		FailOpen: FailOpenPolicy(), Registrar: reg}
	if c.HookPath == "" {
		c.HookPath = layout.Sibling("detshare-hook")
	}
	return c
}

// FailOpenPolicy is the host's choice for tenants that asked for DetShare and cannot get it: DETSHARE_FAIL_CLOSED=1
// refuses, DETSHARE_FAIL_OPEN=1 runs them unshared, else [tenants] fail_open of the host configuration
// ($DETSHARE_CONFIG or /etc/detshare/config.toml). A configuration that cannot be read refuses (fail-closed).
func FailOpenPolicy() bool {
	switch {
	case os.Getenv(EnvFailClosed) == "1":
		return false
	case os.Getenv(EnvFailOpen) == "1":
		return true
	}
	c, err := config.Load(config.PathFromEnv())
	if err != nil {
		logrus.WithError(err).Warn("host configuration unreadable: tenants that cannot get DetShare are refused")
		return false
	}
	return c.Tenants.FailOpen
}

// Validate checks that the paths are usable; the hook only when it will be put into specs.
func (c Config) Validate(needHook bool) error {
	for name, p := range map[string]string{"run dir": c.RunDir, "library (DETSHARE_LIB)": c.LibPath} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%s %q: must be an absolute host path", name, p)
		}
	}
	if f, err := os.Open(c.LibPath); err != nil {
		return fmt.Errorf("libdetshare.so not readable (install it with `make install` or the .deb, or set DETSHARE_LIB): %w", err)
	} else {
		f.Close()
	}
	if needHook && (!filepath.IsAbs(c.HookPath) || !layout.IsExecutable(c.HookPath)) {
		return fmt.Errorf("hook (DETSHARE_HOOK) %q: not an executable file given by absolute path", c.HookPath)
	}
	return nil
}

// IsQuotaError tells whether err is the user's quota being wrong or not admitted (refuse the container) rather
// than a failure of DetShare (run the container unshared).
func IsQuotaError(err error) bool {
	var fe *quota.FieldError
	var ae *quota.AdmissionError
	return errors.As(err, &fe) || errors.As(err, &ae)
}

// Prepared is the outcome of Prepare.
type Prepared struct {
	Registered bool          // the container is a DetShare tenant; its spec was edited
	Result     tenant.Result // valid when Registered
	FailedOpen error         // DetShare failed and the container runs unshared (nil otherwise)
	Phases     Phases        // how long each step took (valid when Registered)
}

// Phases are the durations of Prepare's steps for one registered container; the shim logs them at debug level
// with its own (BENCHMARKS.md, issue 28: where a container start's added time goes).
type Phases struct {
	Setup    time.Duration // host checks and the preload file
	Register time.Duration // tenant.Registrar.Register (its own steps in Tenant)
	Tenant   tenant.Phases
	Devices  time.Duration // the placed GPU's device edit (cgroupgpu/cdi)
	Apply    time.Duration // the spec edit and its write (managed), or the bind mounts (standalone)
}

// Request is one container to prepare.
type Request struct {
	ID     string            // container ID; also the tenant ID
	Bundle string            // bundle directory holding config.json
	Labels map[string]string // engine labels (Docker labels, containerd container labels); may be nil
	// Spec is the bundle's config.json when the caller has read it already (the shim reads it once per create);
	// nil: Prepare reads it.
	Spec *specmod.Spec
	// NoPoststopHook leaves the poststop hook (`detshare-hook poststop --id`, which needs Config.HookPath) out of the
	// spec, for callers that see every deletion themselves (the runc wrapper is run for every `runc delete`; the
	// shim's Delete and its manager's Stop, which containerd runs to clean up after a dead shim); it saves a process
	// start per container. The wrapper always sets it, the shim for every spec it has read; only when the shim could
	// not read the spec does Prepare read it itself and, if it can, add the hook (the shim's Delete deregisters then
	// too).
	NoPoststopHook bool
}

// Prepare registers the container of req when its spec or labels carry DetShare settings and edits its
// config.json; a container without settings is left exactly as it is. On error nothing is left behind.
func Prepare(ctx context.Context, cfg Config, req Request) (Prepared, error) {
	specPath := filepath.Join(req.Bundle, "config.json")
	spec := req.Spec
	if spec == nil {
		var err error
		if spec, err = specmod.Load(specPath); err != nil {
			// Whether it asked for DetShare cannot be told; runc reads the same spec and reports the problem.
			logrus.WithError(err).WithField("id", req.ID).Warn("spec unreadable; container left to runc")
			return Prepared{}, nil
		}
	}
	c := container{id: req.ID, spec: spec, labels: req.Labels, managed: true}
	if !req.NoPoststopHook {
		c.hookPath, c.needHook = cfg.HookPath, true
	}
	return attach(ctx, cfg, c,
		func(t specmod.Tenant) error { // the managed applier: runc performs the mounts the spec now lists
			if err := specmod.ForTenant(t).Modify(spec); err != nil {
				return err
			}
			return spec.WriteFile(specPath)
		})
}

// container is what attach needs to know of one container.
type container struct {
	id       string
	spec     *specmod.Spec     // its config.json, read once per create
	labels   map[string]string // engine labels; may be nil
	hookPath string            // the poststop hook put into the spec ("" for none)
	needHook bool              // the spec gets cfg.HookPath: it must be an executable
	ownerPID int               // host PID whose death deregisters it (0: deregistered by poststop/Delete)
	managed  bool              // its spec is edited before create (Prepare): devices can be added
}

// applier puts a registered tenant's files into its container: edit the spec (Prepare) or bind-mount them into the
// rootfs (CreateContainer). On error it leaves nothing of its own behind.
type applier func(specmod.Tenant) error

// attach is the one container path behind Prepare and CreateContainer: decide from the settings whether the
// container wants DetShare, check the host, register (replacing a stale registration of the same ID), apply, and on
// failure roll back and apply the failure policy.
func attach(ctx context.Context, cfg Config, c container, apply applier) (Prepared, error) {
	ann := c.spec.Annotations()
	in := quota.Inputs{Annotations: ann, Labels: c.labels, Env: c.spec.Env()}.Resolve()
	if !in.Asked {
		// Only misspelt keys (a DETSHARE_ or detshare.io/ name DetShare does not know): the container meant to ask,
		// so running it unshared would be wrong.
		if in.Unknown != nil {
			return Prepared{}, fmt.Errorf("detshare: %w", in.Unknown)
		}
		return Prepared{}, nil
	}
	log := logrus.WithField("id", c.id)
	var ph Phases
	t0 := time.Now()
	for _, m := range in.Capped { // the container asked above what the cluster allocated it
		log.WithField("capped", m).Warn("quota capped to the allocation")
	}
	if err := cfg.Validate(c.needHook); err != nil {
		return failOpen(cfg, c.id, err)
	}
	preload, err := EnsurePreloadFile(cfg.RunDir)
	if err != nil {
		return failOpen(cfg, c.id, err)
	}
	treq := tenant.Request{ID: c.id, Quota: in, Annotations: ann, OwnerPID: c.ownerPID}
	t1 := time.Now()
	ph.Setup = t1.Sub(t0)
	res, err := cfg.Registrar.Register(ctx, cfg.RunDir, treq)
	if errors.Is(err, table.ErrExists) {
		// runc refuses to create two containers with one ID, so a registration under this ID belongs to an earlier
		// container whose poststop never ran (engine crash): it is stale.
		log.Warn("stale registration under this container ID replaced")
		if derr := tenant.Deregister(cfg.RunDir, c.id); derr != nil && !errors.Is(derr, table.ErrNotFound) {
			return failOpen(cfg, c.id, derr)
		}
		res, err = cfg.Registrar.Register(ctx, cfg.RunDir, treq)
	}
	if err != nil {
		if IsQuotaError(err) || ctx.Err() != nil {
			return Prepared{}, fmt.Errorf("detshare: %w", err)
		}
		return failOpen(cfg, c.id, err)
	}
	t2 := time.Now()
	ph.Register, ph.Tenant = t2.Sub(t1), res.Phases
	t := specmod.Tenant{ID: c.id, RunDir: cfg.RunDir, LibPath: cfg.LibPath, PreloadFile: preload,
		QuotaFile: res.ContainerQuotaFile, MPSPipeDir: res.GPU.MPSPipeDir, HookPath: c.hookPath}
	if cfg.Devices != nil && c.managed {
		e, err := cfg.Devices.Edit(cdi.GPU{Index: res.GPU.Index, UUID: res.GPU.UUID})
		switch {
		case err == nil:
			t.GPU = &e
		case specmod.GPUProvided(c.spec):
			// NVIDIA's runtime gives this container its GPU; ForGPU would only have checked it is the placed one.
			log.WithError(err).Warn("no DetShare GPU edit; the container keeps the GPU NVIDIA's runtime gives it")
		default:
			Rollback(cfg, c.id)
			return failOpen(cfg, c.id, fmt.Errorf("give the container GPU %d (%s): %w", res.GPU.Index, res.GPU.UUID, err))
		}
	}
	t3 := time.Now()
	ph.Devices = t3.Sub(t2)
	if err := apply(t); err != nil {
		Rollback(cfg, c.id)
		return failOpen(cfg, c.id, err)
	}
	ph.Apply = time.Since(t3)
	log.WithFields(logrus.Fields{"slot": res.Registration.Slot, "gpu": res.Registration.GPU,
		"tier": res.Quota.Tier}).Info("container registered with DetShare")
	return Prepared{Registered: true, Result: res, Phases: ph}, nil
}

// failOpen applies the host's policy to a container that asked for DetShare and cannot get it.
func failOpen(cfg Config, id string, err error) (Prepared, error) {
	if !cfg.FailOpen {
		return Prepared{}, RefusalError(err)
	}
	if rerr := failopen.Record(cfg.RunDir, id, err); rerr != nil {
		logrus.WithError(rerr).Debug("fail-open event")
	}
	logrus.WithError(err).WithField("id", id).Warn("DetShare failed; the container runs unshared (host policy fail_open)")
	return Prepared{FailedOpen: err}, nil
}

// RefusalError is the create error of a tenant refused because DetShare failed under the default policy.
func RefusalError(err error) error {
	return fmt.Errorf("detshare: refused: this container asked for DetShare (a quota key such as tier, sms or memory) "+
		"and cannot get it: %w (host policy fail-closed: fix the cause, or set [tenants] fail_open = true in %s "+
		"to run such containers unshared)", err, config.PathFromEnv())
}

// Notice is the line put on the stderr of a container that runs unshared under fail-open, where its user looks.
func Notice(err error) string {
	msg := err.Error()
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return "detshare: WARNING: this tenant asked for DetShare but runs WITHOUT it (no SM partition, no GPU " +
		"memory quota; host policy fail_open): " + msg + "\n"
}

// Rollback deregisters id after a failed create. Errors are logged: the scheduler's reaper is the backstop.
func Rollback(cfg Config, id string) {
	if _, err := tenant.DeregisterIfRegistered(cfg.RunDir, id); err != nil {
		logrus.WithError(err).WithField("id", id).Warn("rollback of DetShare registration failed")
	}
}

// Poststop deregisters id. A container that was never registered (or was already deregistered) is not an error:
// the shim, its manager and the runc wrapper call it for every deletion, the hooks.d poststop hook runs for every
// container of podman or CRI-O, and a deletion may be seen twice (shim Delete, then its manager's Stop).
func Poststop(cfg Config, id string) error {
	if _, err := tenant.DeregisterIfRegistered(cfg.RunDir, id); err != nil {
		return fmt.Errorf("deregister %s: %w", id, err)
	}
	return nil
}

// EnsurePreloadFile writes <runDir>/ld.so.preload naming the in-container library path (atomically, only when its
// content differs) and returns its path.
func EnsurePreloadFile(runDir string) (string, error) {
	p := filepath.Join(runDir, PreloadFileName)
	want := []byte(table.ContainerLibPath + "\n")
	if got, err := os.ReadFile(p); err == nil && bytes.Equal(got, want) {
		return p, nil
	}
	if err := os.MkdirAll(runDir, table.RunDirMode); err != nil {
		return "", fmt.Errorf("create run dir: %w", err)
	}
	if err := atomicfile.Write(p, want, 0o644, false); err != nil {
		return "", err
	}
	return p, nil
}

// State is the OCI container state a runtime passes to a hook on stdin.
type State struct {
	OCIVersion  string            `json:"ociVersion"`
	ID          string            `json:"id"`
	Status      string            `json:"status"`
	Pid         int               `json:"pid"`
	Bundle      string            `json:"bundle"`
	BundlePath  string            `json:"bundlePath"` // pre-1.0 runtimes
	Annotations map[string]string `json:"annotations"`
}

// ReadState decodes the state from r.
func ReadState(r io.Reader) (State, error) {
	var s State
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		return State{}, fmt.Errorf("read OCI state from stdin: %w", err)
	}
	if s.Bundle == "" {
		s.Bundle = s.BundlePath
	}
	if s.ID == "" {
		return State{}, errors.New("OCI state on stdin has no \"id\"")
	}
	return s, nil
}
