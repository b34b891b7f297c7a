package table

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/detshare/detshare/internal/quote"
)

// DefaultRunDir is where the table lives unless DETSHARE_RUN_DIR or --run-dir say otherwise.
const DefaultRunDir = "/run/detshare"

// RunDirEnv names the environment variable that overrides DefaultRunDir.
const RunDirEnv = "DETSHARE_RUN_DIR"

// RunDir picks the run directory: flag (when non-empty), else $DETSHARE_RUN_DIR, else DefaultRunDir.
func RunDir(flag string) string {
	if flag != "" {
		return flag
	}
	if v := os.Getenv(RunDirEnv); v != "" {
		return v
	}
	return DefaultRunDir
}

// Paths names the files of one run directory (docs/internals.md "Run directory").
type Paths struct{ Dir string }

// NewPaths returns the paths under dir.
func NewPaths(dir string) Paths { return Paths{Dir: dir} }

// Table is the global table file.
func (p Paths) Table() string { return filepath.Join(p.Dir, "table") }

// Lock is the flock file serialising registration.
func (p Paths) Lock() string { return filepath.Join(p.Dir, "table.lock") }

// SchedLock is the flock file held by the scheduler leader.
func (p Paths) SchedLock() string { return filepath.Join(p.Dir, "sched.lock") }

// Doorbell is the doorbell file.
func (p Paths) Doorbell() string { return filepath.Join(p.Dir, "doorbell") }

// ClientsDir holds the client pages.
func (p Paths) ClientsDir() string { return filepath.Join(p.Dir, "clients") }

// ClientPage is the client page of tenant id.
func (p Paths) ClientPage(id string) string { return filepath.Join(p.Dir, "clients", id+".page") }

// TenantsDir holds one directory per tenant.
func (p Paths) TenantsDir() string { return filepath.Join(p.Dir, "tenants") }

// TenantDir is tenant id's directory (quota files).
func (p Paths) TenantDir(id string) string { return filepath.Join(p.Dir, "tenants", id) }

// QuotaFile is the quota file with host paths (used by `detshare run`).
func (p Paths) QuotaFile(id string) string { return filepath.Join(p.TenantDir(id), "quota") }

// ContainerQuotaFile is the quota file with in-container paths (mounted by the hook at ContainerQuotaPath).
func (p Paths) ContainerQuotaFile(id string) string {
	return filepath.Join(p.TenantDir(id), "container-quota")
}

// MPSPipeDir is the MPS pipe directory of GPU index gpu.
func (p Paths) MPSPipeDir(gpu int) string {
	return filepath.Join(p.Dir, "mps", fmt.Sprintf("gpu%d", gpu), "pipe")
}

// MPSLogDir is the MPS log directory of GPU index gpu.
func (p Paths) MPSLogDir(gpu int) string {
	return filepath.Join(p.Dir, "mps", fmt.Sprintf("gpu%d", gpu), "log")
}

// Paths inside a container, as the hook mounts them (docs/internals.md "Inside a container").
const (
	ContainerLibPath        = "/usr/lib/detshare/libdetshare.so"
	ContainerLdPreloadPath  = "/etc/ld.so.preload"
	ContainerQuotaPath      = "/run/detshare/quota"
	ContainerTablePath      = "/run/detshare/table"
	ContainerClientPagePath = "/run/detshare/client.page"
	ContainerDoorbellPath   = "/run/detshare/doorbell"
	ContainerMPSPipeDir     = "/run/detshare/mps"
)

// ErrInvalidID is returned (wrapped) for a tenant ID that cannot be used.
var ErrInvalidID = errors.New("invalid tenant id")

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// ValidateID checks a tenant/container ID: it names files (clients/<id>.page, tenants/<id>/), so it must be a
// plain file name that fits ds_container.id.
func ValidateID(id string) error {
	if len(id) == 0 || len(id) > IDLen-1 || !idRE.MatchString(id) {
		return fmt.Errorf("%w %s: must be 1..%d characters of A-Z a-z 0-9 _ . - and start with a letter or digit",
			ErrInvalidID, quote.Q(id), IDLen-1)
	}
	return nil
}
