package shimv2

import (
	"context"

	"github.com/containerd/containerd/runtime/v2/runc/manager"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/internal/table"
)

// Manager is the runc shim manager with deregistration added to Stop. containerd does not run it: the front
// (containerd-shim-detshare-v1, package shimv2/front) does the binary's `start` and `delete` actions, and its Delete
// deregisters as Stop does here, through the same tenant.DeregisterIfRegistered. It serves only an invocation of the
// serving binary itself with start or delete (a person running it by hand), so that it, too, cleans up a container
// whose shim died.
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
