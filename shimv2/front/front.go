// Package front is what containerd-shim-detshare-v1 does itself: the shim binary's `start` and `delete` actions,
// which containerd runs for every container (containerd executes the shim binary three times per container:
// `start`, the serving shim that `start` spawns, and `delete` after the serving shim disconnects). It re-implements,
// for those two actions, containerd 1.7's shim library (runtime/v2/shim: flags, socket address, address file) and
// its runc manager (runtime/v2/runc/manager: Start and Stop) with DetShare's deregistration added to Stop, so that
// the binary containerd executes twice per container links no containerd, grpc or ttrpc code and starts about as
// fast as a Go hello world. The serving shim (containerd's runc task service with DetShare's Create and Delete,
// package shimv2) is a separate binary, ServeName, next to the front; the front spawns it for `start` and execs it
// for every other invocation.
//
// It imports nothing from github.com/containerd (cmd/containerd-shim-detshare-v1's deps test keeps it so); its
// tests compare it with containerd's own functions and types.
package front

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// RuntimeName is the containerd runtime type of the shim (shimv2.RuntimeName names the same; a test keeps them
// equal).
const RuntimeName = "io.containerd.detshare.v1"

// BinaryName is the front's binary: containerd derives it from RuntimeName.
const BinaryName = "containerd-shim-detshare-v1"

// ServeName is the serving shim's binary, installed in the front's directory.
const ServeName = "containerd-shim-detshare-v1-serve"

// ttrpcAddressEnv is the environment variable containerd passes its ttrpc address in (runtime/v2/shim).
const ttrpcAddressEnv = "TTRPC_ADDRESS"

// Flags are containerd's shim flags (runtime/v2/shim parseFlags) and the action (the first argument left).
type Flags struct {
	Debug         bool
	Version       bool
	Namespace     string
	ID            string
	Socket        string
	Bundle        string
	Address       string
	PublishBinary string
	Action        string
}

// ParseFlags parses args (without the program name) as containerd's shim library does. An error means the
// arguments are not containerd's; the caller hands them to the serving shim, which reports them.
func ParseFlags(args []string) (Flags, error) {
	var f Flags
	fs := flag.NewFlagSet(BinaryName, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&f.Debug, "debug", false, "enable debug output in logs")
	fs.BoolVar(&f.Version, "v", false, "show the shim version and exit")
	fs.StringVar(&f.Namespace, "namespace", "", "namespace that owns the shim")
	fs.StringVar(&f.ID, "id", "", "id of the task")
	fs.StringVar(&f.Socket, "socket", "", "socket path to serve")
	fs.StringVar(&f.Bundle, "bundle", "", "path to the bundle if not workdir")
	fs.StringVar(&f.Address, "address", "", "grpc address back to main containerd")
	fs.StringVar(&f.PublishBinary, "publish-binary", "", "path to publish binary (unused)")
	if err := fs.Parse(args); err != nil {
		return Flags{}, err
	}
	f.Action = fs.Arg(0)
	return f, nil
}

// ServePath returns the serving shim's path: ServeName in the directory of the executable exe (symbolic links
// resolved, so a front linked from elsewhere finds the daemon installed beside the real file). The error names the
// path and says what is missing.
func ServePath(exe string) (string, error) {
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	p := filepath.Join(filepath.Dir(exe), ServeName)
	st, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("serving shim %s: %w (install %s next to %s; `make install` installs both)", p, err, ServeName, BinaryName)
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("serving shim %s: not an executable file (mode %v)", p, st.Mode())
	}
	return p, nil
}

// ErrNoNamespace is containerd's error for a start or delete without -namespace.
var ErrNoNamespace = errors.New("shim namespace cannot be empty")

// Handles reports whether the front itself runs f (containerd's start and delete actions); everything else goes
// to the serving shim.
func Handles(f Flags) bool {
	return !f.Version && (f.Action == "start" || f.Action == "delete")
}

// serveArgs are the serving shim's arguments as containerd's runc manager gives them (newCommand).
func serveArgs(ns, id, containerdAddress string, debug bool) []string {
	args := []string{"-namespace", ns, "-id", id, "-address", containerdAddress}
	if debug {
		args = append(args, "-debug")
	}
	return args
}

// filterEnv drops the variables named (prefix NAME=) from env.
func filterEnv(env []string, names ...string) []string {
	out := make([]string, 0, len(env))
next:
	for _, v := range env {
		for _, n := range names {
			if strings.HasPrefix(v, n+"=") {
				continue next
			}
		}
		out = append(out, v)
	}
	return out
}
