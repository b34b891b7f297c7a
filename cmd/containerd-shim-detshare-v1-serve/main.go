// Command containerd-shim-detshare-v1-serve is DetShare's serving containerd shim: containerd's runc task service
// (containerd 1.7's shim library) with DetShare's Create and Delete (package shimv2). containerd does not run it
// itself: containerd-shim-detshare-v1 (the front, package shimv2/front), installed in the same directory, spawns it
// from its `start` action with the shim socket as fd 3, and execs it for any invocation other than start, delete,
// --help and --version.
//
// It does not link containerd 1.7's pause sandbox plugin (a stub of the sandbox API that no containerd release uses
// by default; its generated code pulls in grpc-go, net/http and crypto/tls): each package linked costs every
// container start its initialisation and pages (TestShimLinksNoGRPCClientOrHTTP).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/runtime/v2/shim"

	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/shimv2"
	"github.com/detshare/detshare/shimv2/front"
)

func main() {
	if len(os.Args) == 2 {
		switch os.Args[1] {
		case "-h", "-help", "--help", "help":
			fmt.Printf("%s - DetShare's serving containerd shim, started by %s (see its --help)\n", front.ServeName, front.BinaryName)
			return
		case "-v", "-version", "--version", "version":
			fmt.Printf("%s version %s\n", front.ServeName, version.Version)
			return
		}
	}
	// Registration starts the host scheduler on demand (sched/ensure) and stays free of NVML (cmd/internal/wiring).
	shimv2.PrefetchAtStart(os.Args[1:])
	shimv2.RegisterPlugin(wiring.Container(), wiring.Devices)
	shim.RunManager(context.Background(), shimv2.NewManager())
}
