// Command containerd-shim-detshare-v1 is DetShare's containerd shim (runtime type io.containerd.detshare.v1) as
// containerd executes it: a small front (package shimv2/front) that does the binary's `start` and `delete` actions
// itself and hands every other invocation to the serving shim, containerd-shim-detshare-v1-serve (containerd's runc
// shim with DetShare's Create and Delete, package shimv2), installed in the same directory.
//
// containerd executes the shim binary three times per container (start, the serving shim, delete); two of them are
// the front's, which links no containerd, grpc or ttrpc code and starts several times faster than a binary built on
// containerd's shim library (TestFrontLinksNoContainerd; BENCHMARKS.md, "Issue 28: container start with a front
// binary").
package main

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/shimv2/front"
)

const name = front.BinaryName

const helpText = name + ` - DetShare's containerd shim (runtime type io.containerd.detshare.v1)

containerd starts it, not people: a runtime entry with runtime_type = "io.containerd.detshare.v1" (written by
` + "`detshare install containerd`" + `) makes containerd run this binary, with its own flags (-namespace, -address,
-id, -publish-binary, start/delete), for every container of that runtime. It is containerd's runc shim with
DetShare's Create and Delete: on create it registers the container with DetShare (quota from the container's
DETSHARE_* environment, detshare.io/* annotations or labels) and edits its OCI spec; on delete it deregisters.

This binary does containerd's start and delete actions itself; the shim that serves containers is
` + front.ServeName + `, which must be installed in the same directory (any other invocation is handed to it).

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

// fail reports err as containerd's shim library does (containerd logs the start/delete action's stderr).
func fail(err error) {
	fmt.Fprintf(os.Stderr, "%s: %s", front.RuntimeName, err)
	os.Exit(1)
}

func main() {
	if ownFlag(os.Args[1:], os.Stdout) {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		fail(fmt.Errorf("find own executable: %w", err))
	}
	f, perr := front.ParseFlags(os.Args[1:])
	if perr != nil || !front.Handles(f) {
		serve, err := front.ServePath(exe)
		if err != nil {
			fail(err)
		}
		fail(fmt.Errorf("exec %s: %w", serve, syscall.Exec(serve, append([]string{serve}, os.Args[1:]...), os.Environ())))
	}
	cwd, err := os.Getwd()
	if err != nil {
		fail(err)
	}
	switch f.Action {
	case "start":
		if f.Namespace == "" {
			fail(front.ErrNoNamespace)
		}
		serve, err := front.ServePath(exe)
		if err != nil {
			fail(err)
		}
		st, err := front.Start(front.StartConfig{Namespace: f.Namespace, ID: f.ID, Address: f.Address, Debug: f.Debug,
			Serve: serve, Dir: cwd, Env: os.Environ(), Stdin: os.Stdin})
		if err != nil {
			fail(err)
		}
		if _, err := os.Stdout.WriteString(st.Address); err != nil {
			fail(err)
		}
	case "delete":
		if f.Debug {
			logrus.SetLevel(logrus.DebugLevel)
		}
		log := logrus.WithFields(logrus.Fields{"runtime": front.RuntimeName, "pid": os.Getpid(), "namespace": f.Namespace})
		st, err := front.Delete(front.DeleteConfig{Namespace: f.Namespace, ID: f.ID, Dir: cwd, RunDir: table.RunDir(""), Log: log})
		if err != nil {
			fail(err)
		}
		if _, err := os.Stdout.Write(front.DeleteResponse(st.Pid, st.ExitStatus, st.ExitedAt)); err != nil {
			fail(err)
		}
	}
}
