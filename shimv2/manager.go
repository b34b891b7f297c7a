package shimv2

import (
	"context"

	"github.com/containerd/containerd/runtime/v2/runc/manager"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook"
)

// Manager is the runc shim manager with deregistration added to Stop. containerd runs Stop (the shim binary's
// `delete` action) to clean up after a shim that died, so a container whose shim crashed is deregistered too; with
// Service.Delete this covers every deletion, and the spec needs no poststop hook (one process start less per
// container).
type Manager struct {
	shim.Manager
	cfg hook.Config
}

// NewManager returns the manager for RuntimeName.
func NewManager() *Manager {
	// Stop only deregisters: no Registrar is needed.
	return &Manager{Manager: manager.NewShimManager(RuntimeName), cfg: hook.ConfigFromEnv(tenant.Registrar{})}
}

// Stop delegates, then deregisters id (a no-op for containers that were never registered).
func (m *Manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	st, err := m.Manager.Stop(ctx, id)
	if err == nil {
		if derr := hook.Poststop(m.cfg, id); derr != nil {
			logrus.WithError(derr).WithField("id", id).Warn("deregistration at shim delete failed")
		}
	}
	return st, err
}
