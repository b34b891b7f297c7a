// Command detshare-runtime is DetShare's runc-compatible wrapper for Docker "path" runtimes
// ("runtimes": {"detshare": {"path": "/usr/bin/detshare-runtime"}}). Logic lives in hook/runcwrap.
package main

import (
	"os"

	"github.com/detshare/detshare/hook/runcwrap"
	// Starts the host scheduler on demand when a tenant registers (tenant.EnsureScheduler); free of NVML.
	_ "github.com/detshare/detshare/sched/ensure"
)

func main() { os.Exit(runcwrap.Main(os.Args[1:])) }
