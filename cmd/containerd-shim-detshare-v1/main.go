// Command containerd-shim-detshare-v1 is DetShare's containerd shim (runtime type io.containerd.detshare.v1): the
// runc shim with DetShare's Create/Delete (package shimv2).
package main

import (
	"context"

	_ "github.com/containerd/containerd/runtime/v2/runc/pause"
	"github.com/containerd/containerd/runtime/v2/shim"

	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/shimv2"
)

func main() {
	// Registration starts the host scheduler on demand (sched/ensure) and stays free of NVML (cmd/internal/wiring).
	shimv2.RegisterPlugin(wiring.Container(), wiring.Devices)
	shim.RunManager(context.Background(), shimv2.NewManager())
}
