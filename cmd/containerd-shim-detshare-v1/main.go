// Command containerd-shim-detshare-v1 is DetShare's containerd shim (runtime type io.containerd.detshare.v1): the
// runc shim with DetShare's Create/Delete (package shimv2).
//
// Unlike containerd's containerd-shim-runc-v2 it does not link containerd 1.7's pause sandbox plugin (a stub of the
// sandbox API that no containerd release uses by default; its generated code pulls in grpc-go, net/http and
// crypto/tls): containerd runs this binary three times per container, and each run pays for every package linked
// (TestShimLinksNoGRPCClientOrHTTP).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/containerd/containerd/runtime/v2/shim"

	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/shimv2"
)

const name = "containerd-shim-detshare-v1"

const helpText = name + ` - DetShare's containerd shim (runtime type io.containerd.detshare.v1)

containerd starts it, not people: a runtime entry with runtime_type = "io.containerd.detshare.v1" (written by
` + "`detshare install containerd`" + `) makes containerd run this binary, with its own flags (-namespace, -address,
-id, -publish-binary, start/delete), for every container of that runtime. It is containerd's runc shim with
DetShare's Create and Delete: on create it registers the container with DetShare (quota from the container's
DETSHARE_* environment, detshare.io/* annotations or labels) and edits its OCI spec; on delete it deregisters.

Environment (of the containerd daemon): DETSHARE_RUN_DIR (default /run/detshare), DETSHARE_LIB, DETSHARE_HOOK,
DETSHARE_CONFIG (default /etc/detshare/config.toml), DETSHARE_FAIL_OPEN=1 / DETSHARE_FAIL_CLOSED=1.

   --help, -h      show this help
   --version, -v   print the DetShare version
`

// ownFlag answers --help and --version (containerd's shim library would print containerd's version and its bare
// flag list); handled is false for containerd's own invocations.
func ownFlag(args []string, w io.Writer) (handled bool) {
	if len(args) != 1 {
		return false
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(w, helpText)
	case "-v", "-version", "--version", "version":
		fmt.Fprintf(w, "%s version %s\n", name, version.Version)
	default:
		return false
	}
	return true
}

func main() {
	if ownFlag(os.Args[1:], os.Stdout) {
		return
	}
	// Registration starts the host scheduler on demand (sched/ensure) and stays free of NVML (cmd/internal/wiring).
	shimv2.PrefetchAtStart(os.Args[1:])
	shimv2.RegisterPlugin(wiring.Container(), wiring.Devices)
	shim.RunManager(context.Background(), shimv2.NewManager())
}
