// Command detshare-runtime is DetShare's runc-compatible wrapper for Docker "path" runtimes
// ("runtimes": {"detshare": {"path": "/usr/bin/detshare-runtime"}}). Logic lives in hook/runcwrap; --help is its own
// and --version prints the DetShare version before runc's.
package main

import (
	"os"

	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/hook/runcwrap"
)

// Registration starts the host scheduler on demand (sched/ensure) and stays free of NVML (cmd/internal/wiring).
func main() {
	os.Exit(runcwrap.Main(os.Args[1:], wiring.Container(), wiring.Devices, version.Version))
}
