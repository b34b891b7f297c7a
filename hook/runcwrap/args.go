// Package runcwrap is the logic of detshare-runtime, the runc-compatible wrapper that Docker 20.10 runs as a
// "path" runtime (it cannot name a containerd shim). On `create` it registers the container and edits the bundle's
// config.json through package hook, then runs runc with the same arguments; on `delete` it deregisters after runc;
// every other verb execs runc untouched.
package runcwrap

import (
	"fmt"
	"strings"
)

// Own flags, given before runc's arguments (Docker's daemon.json "runtimeArgs"), removed before runc sees them.
const (
	FlagRunc       = "--detshare-runc"        // path of the real runc (default: runc on PATH)
	FlagRunDir     = "--detshare-run-dir"     // DetShare run directory
	FlagLib        = "--detshare-lib"         // host path of libdetshare.so
	FlagHook       = "--detshare-hook"        // host path of detshare-hook
	FlagDockerRoot = "--detshare-docker-root" // Docker's data-root, for container labels
	FlagFailClosed = "--detshare-fail-closed" // refuse containers when DetShare fails (no value)
	FlagLogLevel   = "--detshare-log-level"
)

var ownValueFlags = map[string]bool{FlagRunc: true, FlagRunDir: true, FlagLib: true, FlagHook: true,
	FlagDockerRoot: true, FlagLogLevel: true}

// runc's global flags that take a value (runc 1.1 main.go).
var runcGlobalValue = map[string]bool{"log": true, "log-format": true, "root": true, "criu": true, "rootless": true}

// create/run flags that take a value (runc 1.1 create.go, run.go).
var createValue = map[string]bool{"bundle": true, "b": true, "console-socket": true, "pid-file": true,
	"preserve-fds": true}

// delete flags that take a value (none in runc 1.1; kept for symmetry with newer versions).
var deleteValue = map[string]bool{}

// Invocation is a parsed command line.
type Invocation struct {
	Own       map[string]string // own flags (FlagFailClosed maps to "true")
	RuncArgs  []string          // what runc gets (own flags removed, order kept)
	Command   string            // runc subcommand ("" only when none, e.g. --version; Parse refuses an empty one)
	ID        string            // container ID of create/run/delete
	Bundle    string            // --bundle of create/run ("" = runc's default, the working directory)
	Log       string            // runc --log
	LogFormat string            // runc --log-format
}

// flagName splits "-x", "--x", "--x=v" into name and inline value.
func flagName(a string) (name, value string, hasValue bool) {
	n := strings.TrimLeft(a, "-")
	if k, v, ok := strings.Cut(n, "="); ok {
		return k, v, true
	}
	return n, "", false
}

// Parse splits args (without argv[0]).
func Parse(args []string) (Invocation, error) {
	inv := Invocation{Own: map[string]string{}}
	i := 0
	// Global flags, our own among them, up to the subcommand.
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		if strings.HasPrefix(a, "--detshare-") {
			name, val, inline := flagName(a)
			full := "--" + name
			switch {
			case full == FlagFailClosed:
				inv.Own[full] = "true"
			case ownValueFlags[full]:
				if !inline {
					if i+1 >= len(args) {
						return inv, fmt.Errorf("flag %s needs a value", full)
					}
					i++
					val = args[i]
				}
				inv.Own[full] = val
			default:
				return inv, fmt.Errorf("unknown flag %s: allowed DetShare flags are %s, %s, %s, %s, %s, %s, %s", full,
					FlagRunc, FlagRunDir, FlagLib, FlagHook, FlagDockerRoot, FlagFailClosed, FlagLogLevel)
			}
			continue
		}
		inv.RuncArgs = append(inv.RuncArgs, a)
		name, val, inline := flagName(a)
		if runcGlobalValue[name] {
			if !inline && i+1 < len(args) {
				i++
				val = args[i]
				inv.RuncArgs = append(inv.RuncArgs, val)
			}
			switch name {
			case "log":
				inv.Log = val
			case "log-format":
				inv.LogFormat = val
			}
		}
	}
	if i >= len(args) {
		return inv, nil
	}
	if args[i] == "" {
		// Command "" means "no subcommand" (--version, --help); an empty argument in the subcommand's place
		// would make the rest of the line look like global flags that were never parsed as such.
		return inv, fmt.Errorf("argument %d is empty where runc's subcommand belongs: want a subcommand such as "+
			"create, run, start, delete, kill, state", i+1)
	}
	inv.Command = args[i]
	inv.RuncArgs = append(inv.RuncArgs, args[i:]...)
	var valueFlags map[string]bool
	switch inv.Command {
	case "create", "run":
		valueFlags = createValue
	case "delete":
		valueFlags = deleteValue
	default:
		return inv, nil
	}
	rest := args[i+1:]
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			if j+1 < len(rest) {
				inv.ID = rest[j+1]
			}
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			name, val, inline := flagName(a)
			if valueFlags[name] {
				if !inline && j+1 < len(rest) {
					j++
					val = rest[j]
				}
				if name == "bundle" || name == "b" {
					inv.Bundle = val
				}
			}
			continue
		}
		if inv.ID == "" {
			inv.ID = a
		}
	}
	return inv, nil
}
