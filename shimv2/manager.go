package shimv2

import (
	"context"

	"github.com/containerd/containerd/runtime/v2/runc/manager"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/internal/table"
)

// Manager is the runc shim manager with deregistration added to Stop. containerd runs Stop (the shim binary's
// `delete` action) to clean up after a shim that died, so a container whose shim crashed is deregistered too; with
// Service.Delete this covers every deletion, and the spec needs no poststop hook (one process start less per
// container).
type Manager struct {
	shim.Manager
	runDir string
}

// NewManager returns the manager for RuntimeName. Stop only deregisters, which needs the run directory alone: the
// binary's start and delete actions (two of its three executions per container) read no host configuration.
func NewManager() *Manager {
	return &Manager{Manager: manager.NewShimManager(RuntimeName), runDir: table.RunDir("")}
}

// Stop delegates, then deregisters id (a no-op for containers that were never registered).
func (m *Manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	st, err := m.Manager.Stop(ctx, id)
	if err == nil {
		if derr := hook.Poststop(hook.Config{RunDir: m.runDir}, id); derr != nil {
			logrus.WithError(derr).WithField("id", id).Warn("deregistration at shim delete failed")
		}
	}
	return st, err
}
