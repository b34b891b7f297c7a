// Command containerd-shim-detshare-v1 is DetShare's containerd shim (runtime type io.containerd.detshare.v1): the
// runc shim with DetShare's Create/Delete (package shimv2).
package main

import (
	"context"

	_ "github.com/containerd/containerd/runtime/v2/runc/pause"
	"github.com/containerd/containerd/runtime/v2/shim"

	"github.com/detshare/detshare/shimv2"
	// Starts the host scheduler on demand when a tenant registers (tenant.EnsureScheduler); free of NVML.
	_ "github.com/detshare/detshare/sched/ensure"
)

func main() {
	shim.RunManager(context.Background(), shimv2.NewManager())
}
