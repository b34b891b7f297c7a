// Package tenant registers and deregisters a DetShare tenant end to end: resolve its quota (cgroupgpu/quota), make
// sure the scheduler runs, pick a GPU, admit, take a table slot with its client page (internal/table), and write its
// quota files. The OCI hook, the shim, the runc wrapper and `detshare run` all register through this package; none
// re-implements a step.
//
// Register is all-or-nothing: on any error nothing is left behind (no slot, no client page, no quota files), and a
// registrar killed midway is rolled back by the next registration (internal/table's recovery).
//
// Registration needs three things only a binary can choose, so each main builds a Registrar with them: how to start
// the scheduler on demand (sched/ensure), where GPUs come from when the table lists none (NVML through
// sched/gpuinfo, or nothing for the NVML-free hook, shim and wrapper) and how `gpu=auto` is placed
// (cgroupgpu/placement). This package chooses none of them and knows no GPU backend.
package tenant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/quote"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/internal/workload"
)

// Registrar registers tenants with the dependencies its binary chose. The zero Registrar starts no scheduler, takes
// GPUs only from the table and places gpu=auto first-fit.
type Registrar struct {
	// EnsureScheduler makes sure the host scheduler runs for runDir (nil: not started on demand). An error is logged
	// and registration goes on: without a scheduler tenants run fail-static (memory quotas are enforced by the
	// library, SMs are not partitioned).
	EnsureScheduler func(runDir string) error
	// DiscoverGPUs lists the host's GPUs when the table does not know any yet (nil: registration fails until the
	// scheduler records them).
	DiscoverGPUs func() ([]table.GPUInfo, error)
	// Placer places gpu=auto tenants when a Request names none (nil: FirstFit).
	Placer Placer
}

// ErrNoGPUs is returned when the table lists no GPUs and the Registrar cannot discover any.
var ErrNoGPUs = errors.New("no GPUs are recorded in the table and this program cannot discover any: " +
	"start the scheduler (`detshare sched`)")

// Placer picks the GPU for a tenant whose quota says gpu=auto. It is called under the registration lock with every
// GPU and the active tenants (what each GPU has reserved, and the tenants to explain a refusal; valid only during
// the call); it returns the index of a GPU from gpus or an error explaining why none fits. It must not register,
// deregister or set GPUs itself (those take the same lock). Admission is checked again on the GPU it picks.
type Placer interface {
	Place(id string, q quota.Quota, gpus []table.GPUState, existing *quota.Existing) (int, error)
}

// FirstFit places a tenant on the first GPU where its guarantee is admitted.
type FirstFit struct{}

// Place implements Placer.
func (FirstFit) Place(id string, q quota.Quota, gpus []table.GPUState, existing *quota.Existing) (int, error) {
	var errs []error
	for _, g := range gpus {
		p, err := q.Place(g)
		if err == nil {
			err = quota.Admit(g, existing, id, q.Tier, p)
		}
		if err == nil {
			return g.Index, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return -1, errors.New("no GPUs")
	}
	return -1, fmt.Errorf("no GPU can take %s (gpu=auto): %w", quote.Q(id), errors.Join(errs...))
}

// Request is one tenant registration.
type Request struct {
	ID string
	// Quota is the tenant's inputs as the caller resolved them once (quota.Inputs.Resolve); Register reports its
	// Err and never reads the inputs again.
	Quota quota.Resolved
	// Annotations name the Kubernetes pod and container the tenant is, for metrics labels (sched/workload); the
	// quota is in Quota only.
	Annotations map[string]string
	OwnerPID    int    // host tenant owner (`detshare run`); 0 for containers
	Placer      Placer // nil: the Registrar's
}

// Result is a successful registration.
type Result struct {
	Registration       table.Registration
	Quota              quota.Quota
	Placement          quota.Placement
	GPU                table.GPUState
	QuotaFile          string // host paths (DETSHARE_QUOTA_FILE for `detshare run`)
	ContainerQuotaFile string // in-container paths (mounted by the hook at /run/detshare/quota)
	// Phases is how long each step of the registration took (the shim logs them per container start, issue 28).
	Phases Phases
}

// Phases are the durations of a registration's steps.
type Phases struct {
	OpenTable       time.Duration // table.Create: the run directory, the table and doorbell files, their mapping
	EnsureScheduler time.Duration // sched/ensure: is a scheduler leading (and starting one when not)
	Register        time.Duration // table.Register: lock, admission, slot, client page, quota files
}

// Register resolves, admits and registers one tenant. Validation and admission errors name the field, value, source
// and what is allowed or in use. An already registered ID returns the existing registration with an error wrapping
// table.ErrExists.
func (r Registrar) Register(ctx context.Context, runDir string, req Request) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if err := table.ValidateID(req.ID); err != nil {
		return Result{}, err
	}
	if !req.Quota.IsResolved() {
		return Result{}, fmt.Errorf("register %s: the request carries no resolved quota (quota.Inputs.Resolve)", req.ID)
	}
	if err := req.Quota.Err; err != nil {
		return Result{}, fmt.Errorf("quota of %s: %w", req.ID, err)
	}
	q := req.Quota.Quota
	var ph Phases
	t0 := time.Now()
	t, err := table.Create(runDir)
	if err != nil {
		return Result{}, fmt.Errorf("register %s: %w", req.ID, err)
	}
	defer t.Close()
	ph.OpenTable = time.Since(t0)
	if len(t.GPUs()) == 0 {
		if r.DiscoverGPUs == nil {
			return Result{}, fmt.Errorf("register %s: %w", req.ID, ErrNoGPUs)
		}
		infos, err := r.DiscoverGPUs()
		if err != nil {
			return Result{}, fmt.Errorf("register %s: %w", req.ID, err)
		}
		if err := t.SetGPUs(infos); err != nil {
			return Result{}, fmt.Errorf("register %s: %w", req.ID, err)
		}
	}
	// Only once the host is known to have GPUs: a registration refused for want of them must not leave a
	// scheduler running behind it.
	if r.EnsureScheduler != nil {
		t1 := time.Now()
		if err := r.EnsureScheduler(runDir); err != nil {
			logrus.WithError(err).WithField("run_dir", runDir).Warn("scheduler not running; tenant registered fail-static")
		}
		ph.EnsureScheduler = time.Since(t1)
	}
	placer := req.Placer
	if placer == nil {
		placer = r.Placer
	}
	if placer == nil {
		placer = FirstFit{}
	}
	res := Result{Quota: q}
	paths := t.Paths()
	treq := table.RegisterRequest{
		ID: req.ID, Tier: q.Tier, Role: q.Role, Weight: q.Weight, Lend: q.Lend,
		Pinned: q.Pinned, SLOP99Us: uint32(q.SLOP99 / time.Microsecond), OwnerPID: req.OwnerPID,
		Check: func(active *table.Active, tr *table.RegisterRequest) error {
			gpus := t.GPUs()
			existing := quota.FromTable(active)
			gpu, err := selectGPU(req.ID, q, gpus, existing, placer)
			if err != nil {
				return err
			}
			p, err := q.Place(gpu)
			if err != nil {
				return fmt.Errorf("quota of %s: %w", req.ID, err)
			}
			if err := quota.Admit(gpu, existing, req.ID, q.Tier, p); err != nil {
				return err
			}
			res.GPU, res.Placement = gpu, p
			tr.GPU, tr.SMGroups, tr.SMs, tr.MemLimit = gpu.Index, p.Groups, p.SMs, p.MemLimit
			return nil
		},
		Prepare: func(reg table.Registration) error {
			if err := writeQuotaFiles(paths, reg, res.GPU); err != nil {
				return err
			}
			// The pod and container the tenant is, for metrics labels (Kubernetes only).
			return workload.Write(paths, reg.ID, workload.FromAnnotations(req.Annotations))
		},
	}
	t2 := time.Now()
	reg, err := t.Register(treq)
	ph.Register = time.Since(t2)
	if err != nil {
		if errors.Is(err, table.ErrExists) {
			return Result{Registration: reg, QuotaFile: paths.QuotaFile(reg.ID),
				ContainerQuotaFile: paths.ContainerQuotaFile(reg.ID)}, err
		}
		return Result{}, err
	}
	// The scheduler sleeps on the doorbell: ring it so the new tenant gets its first grant now rather than at the
	// next tick (the library holds the tenant's first launches until that grant arrives).
	t.RingDoorbell()
	res.Registration, res.Phases = reg, ph
	res.QuotaFile = paths.QuotaFile(reg.ID)
	res.ContainerQuotaFile = paths.ContainerQuotaFile(reg.ID)
	logrus.WithFields(logrus.Fields{"id": reg.ID, "slot": reg.Slot, "gpu": reg.GPU, "tier": q.Tier,
		"sms": res.Placement.SMs, "memory": res.Placement.MemLimit}).Info("tenant registered")
	return res, nil
}

func selectGPU(id string, q quota.Quota, gpus []table.GPUState, existing *quota.Existing, placer Placer) (table.GPUState, error) {
	if len(gpus) == 0 {
		return table.GPUState{}, errors.New("no GPUs recorded in the table")
	}
	src := q.SourceOf(quota.FieldGPU)
	switch {
	case q.GPU.Auto:
		idx, err := placer.Place(id, q, gpus, existing)
		if err != nil {
			return table.GPUState{}, err
		}
		for _, g := range gpus {
			if g.Index == idx {
				return g, nil
			}
		}
		return table.GPUState{}, fmt.Errorf("placer chose GPU %d, which does not exist", idx)
	case q.GPU.UUID != "":
		for _, g := range gpus {
			if g.UUID == q.GPU.UUID {
				return g, nil
			}
		}
		return table.GPUState{}, &quota.FieldError{Key: quota.KeyFor(quota.FieldGPU, src), Value: q.GPU.UUID, Source: src,
			Allowed: "no such GPU; present: " + gpuList(gpus)}
	default:
		for _, g := range gpus {
			if g.Index == q.GPU.Index {
				return g, nil
			}
		}
		return table.GPUState{}, &quota.FieldError{Key: quota.KeyFor(quota.FieldGPU, src), Value: fmt.Sprint(q.GPU.Index), Source: src,
			Allowed: "no such GPU; present: " + gpuList(gpus)}
	}
}

func gpuList(gpus []table.GPUState) string {
	s := ""
	for i, g := range gpus {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d (%s)", g.Index, g.UUID)
	}
	return s
}

// writeQuotaFiles writes the tenant's quota file twice from one File: with host paths (detshare run) and with the
// paths the hook mounts them at in the container. The copies differ only in their FilePaths.
func writeQuotaFiles(p table.Paths, reg table.Registration, gpu table.GPUState) error {
	dir := p.TenantDir(reg.ID)
	if err := os.MkdirAll(dir, table.RunDirMode); err != nil {
		return fmt.Errorf("create tenant directory: %w", err)
	}
	f := quota.File{ID: reg.ID, Slot: reg.Slot, SlotGen: reg.Gen, GPU: reg.GPU}
	host := quota.FilePaths{Table: p.Table(), ClientPage: p.ClientPage(reg.ID), Doorbell: p.Doorbell(), MPSPipeDir: gpu.MPSPipeDir}
	container := quota.FilePaths{Table: table.ContainerTablePath, ClientPage: table.ContainerClientPagePath,
		Doorbell: table.ContainerDoorbellPath}
	if gpu.MPSPipeDir != "" {
		container.MPSPipeDir = table.ContainerMPSPipeDir
	}
	for _, c := range []struct {
		path  string
		paths quota.FilePaths
	}{{p.QuotaFile(reg.ID), host}, {p.ContainerQuotaFile(reg.ID), container}} {
		f.FilePaths = c.paths
		if err := f.Validate(); err != nil {
			return err
		}
		if err := atomicfile.Write(c.path, quota.Render(f), table.QuotaFileMode, false); err != nil {
			return err
		}
	}
	return nil
}

// Deregister removes tenant id (slot, client page, quota files). An unknown ID returns an error wrapping
// table.ErrNotFound; a run directory without a table too.
func Deregister(runDir, id string) error {
	t, err := table.Open(runDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("deregister %s: %w (no table in %s)", id, table.ErrNotFound, runDir)
		}
		return fmt.Errorf("deregister %s: %w", id, err)
	}
	defer t.Close()
	return t.Deregister(id)
}

// DeregisterIfRegistered is Deregister for a container that may never have been registered (the hook's poststop,
// the shim's delete): a tenant or table that is not there is no error. deregistered tells whether id was registered.
func DeregisterIfRegistered(runDir, id string) (deregistered bool, err error) {
	err = Deregister(runDir, id)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, table.ErrNotFound) {
		return false, nil
	}
	return false, err
}

// Lookup returns tenant id's registration, its GPU and its quota file paths.
func Lookup(runDir, id string) (Result, bool, error) {
	t, err := table.OpenReadOnly(runDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Result{}, false, nil
		}
		return Result{}, false, err
	}
	defer t.Close()
	reg, ok := t.Lookup(id)
	if !ok {
		return Result{}, false, nil
	}
	p := t.Paths()
	res := Result{Registration: reg, QuotaFile: p.QuotaFile(id), ContainerQuotaFile: p.ContainerQuotaFile(id)}
	for _, g := range t.GPUs() {
		if g.Index == reg.GPU {
			res.GPU = g
		}
	}
	return res, true, nil
}
