package specmod

import (
	"fmt"
	"path/filepath"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/internal/table"
)

// TenantIDAnnotation records in a mutated spec which DetShare tenant the container was registered as. Its presence
// tells the standalone hook (hooks.d) that a shim or the runc wrapper already did the work. It is deliberately
// outside the detshare.io/ prefix, which is reserved for quota keys.
const TenantIDAnnotation = "io.detshare.tenant-id"

// Tenant describes what a registered tenant's container needs in its spec. All paths are host paths.
type Tenant struct {
	ID          string
	RunDir      string // DetShare run directory (table, doorbell, clients/, tenants/)
	LibPath     string // installed libdetshare.so
	PreloadFile string // file whose content is the in-container library path (mounted at /etc/ld.so.preload)
	QuotaFile   string // the tenant's container-quota file
	MPSPipeDir  string // the GPU's MPS pipe directory; empty when MPS is not running
	HookPath    string // absolute path of detshare-hook for a poststop hook; empty (the shim and the wrapper) adds none
	// GPU is the edit that gives the container the GPU the tenant was placed on (ForGPU); nil adds no device.
	GPU *cdi.Edit
}

// TenantMounts lists the bind mounts that give a container DetShare (docs/internals.md "Inside a container").
// The standalone hook performs the same list itself when it runs without a shim.
func TenantMounts(t Tenant) []Mount {
	p := table.NewPaths(t.RunDir)
	ms := []Mount{
		BindMount(t.LibPath, table.ContainerLibPath, false),
		BindMount(t.PreloadFile, table.ContainerLdPreloadPath, false),
		BindMount(t.QuotaFile, table.ContainerQuotaPath, false),
		BindMount(p.Table(), table.ContainerTablePath, false),
		BindMount(p.ClientPage(t.ID), table.ContainerClientPagePath, true),
		BindMount(p.Doorbell(), table.ContainerDoorbellPath, true),
	}
	if t.MPSPipeDir != "" {
		// Read-only: a client only connects to the daemon's sockets (allowed on a read-only mount); a writable
		// directory let any container delete them, which restarts the daemon under every tenant of the GPU.
		ms = append(ms, BindMount(t.MPSPipeDir, table.ContainerMPSPipeDir, false))
	}
	return ms
}

// PoststopHook is the hook that deregisters tenant id when its container is deleted, for a caller that does not see
// the deletion itself (hook.Request.NoPoststopHook false); DetShare's shim and runc wrapper see every deletion.
func PoststopHook(hookPath, runDir, id string) Hook {
	return Hook{Path: hookPath, Args: []string{"detshare-hook", "--run-dir", runDir, "poststop", "--id", id},
		Timeout: 30}
}

// ForTenant is the DetShare edit of a registered container: the bind mounts, the poststop hook when t.HookPath is set,
// the bookkeeping annotation and, when t.GPU is set, the placed GPU itself (ForGPU: its device nodes, allowed in
// the device cgroup, and the driver's libraries).
func ForTenant(t Tenant) Modifier {
	return ModifierFunc(func(s *Spec) error {
		if err := table.ValidateID(t.ID); err != nil {
			return err
		}
		for name, p := range map[string]string{"run dir": t.RunDir, "library": t.LibPath,
			"preload file": t.PreloadFile, "quota file": t.QuotaFile} {
			if !filepath.IsAbs(p) {
				return fmt.Errorf("tenant %s: %s %q must be an absolute host path", t.ID, name, p)
			}
		}
		mods := []Modifier{AddMounts(TenantMounts(t)...), SetAnnotations(map[string]string{TenantIDAnnotation: t.ID})}
		if t.HookPath != "" {
			mods = append(mods, AddHook("poststop", PoststopHook(t.HookPath, t.RunDir, t.ID)))
		}
		if t.GPU != nil {
			mods = append(mods, ForGPU(*t.GPU))
		}
		return Chain(mods...).Modify(s)
	})
}
