package runcwrap

import (
	"fmt"
	"io"
	"slices"

	"github.com/detshare/detshare/internal/loglevel"
)

// helpText is detshare-runtime's own --help. runc's help stays reachable (`detshare-runtime help <command>`,
// `detshare-runtime <command> --help` pass through).
const helpText = `detshare-runtime - DetShare's runc wrapper for Docker

USAGE:
   detshare-runtime [DetShare flags] [runc global flags] <runc command> [args...]

Docker runs it as a "path" runtime (daemon.json "runtimes": {"detshare": {"path": "%[1]s"}}, written by
` + "`detshare install docker`" + `; select it with docker run --runtime=detshare or as the default runtime). On
"create" and "run" it registers the container with DetShare and edits the bundle's config.json (quota from the
container's DETSHARE_* environment or detshare.io/* labels), then runs runc with the same arguments; on "delete" it
deregisters after runc; every other command is runc's, unchanged.

DetShare flags (Docker's "runtimeArgs"; removed before runc sees them):
   %[2]s PATH         the real runc (env DETSHARE_RUNC; default: runc on PATH, never this wrapper)
   %[3]s DIR       DetShare run directory (env DETSHARE_RUN_DIR; default /run/detshare)
   %[4]s PATH          host path of libdetshare.so (env DETSHARE_LIB; default: next to this binary)
   %[5]s PATH         host path of detshare-hook (env DETSHARE_HOOK; default: next to this binary)
   %[6]s DIR   Docker's data-root, where container labels are read (default /var/lib/docker)
   %[7]s       refuse containers when DetShare itself fails (env DETSHARE_FAIL_CLOSED=1;
                                  DETSHARE_FAIL_OPEN=1 or [tenants] fail_open in $DETSHARE_CONFIG lets them run)
   %[8]s LEVEL   %[9]s

   --help, -h                     show this help (runc's: detshare-runtime help <command>)
   --version, -v                  print the DetShare version, then runc's
`

// ownHelpOrVersion answers --help/-h/help and --version/-v given without a runc command; handled is false for
// everything else, which goes to runc.
func ownHelpOrVersion(inv Invocation, w io.Writer, exe, ver string) (handled, version bool) {
	if inv.Command == "help" && len(inv.RuncArgs) > 0 && inv.RuncArgs[len(inv.RuncArgs)-1] == "help" {
		inv.Command = ""
		inv.RuncArgs = []string{"--help"}
	}
	if inv.Command != "" {
		return false, false
	}
	switch {
	case slices.Contains(inv.RuncArgs, "--help") || slices.Contains(inv.RuncArgs, "-h"):
		fmt.Fprintf(w, helpText, exe, FlagRunc, FlagRunDir, FlagLib, FlagHook, FlagDockerRoot, FlagFailClosed,
			FlagLogLevel, "log level (env DETSHARE_LOG_LEVEL; default warning): "+loglevel.Allowed)
		return true, false
	case slices.Contains(inv.RuncArgs, "--version") || slices.Contains(inv.RuncArgs, "-v"):
		// Docker's `docker info` parses "<name> version <v>" and "commit: <c>" lines of the default runtime's
		// --version; runc's lines come last and win, as they did before the wrapper.
		fmt.Fprintf(w, "detshare-runtime version %s\n", ver)
		return true, true
	}
	return false, false
}
