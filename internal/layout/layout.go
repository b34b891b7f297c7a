// Package layout says where DetShare's own files are on this host. It is the one place that resolves the
// interception library, the OCI hook and the sibling binaries, for both layouts DetShare runs from:
//
//   - installed (`make install`, the .deb): $PREFIX/bin/<binaries> and $PREFIX/lib/detshare/libdetshare.so
//   - build tree (`make build`): build/bin/<binaries> and build/lib/libdetshare.so
//
// Every component (shim, runc wrapper, hook, `detshare run`, `detshare doctor`) finds the library through LibPath,
// relative to its own executable, so what doctor checks is what the hook mounts into containers.
package layout

import (
	"os"
	"path/filepath"
)

// EnvLib overrides the library's host path (tests, unusual installs).
const EnvLib = "DETSHARE_LIB"

// LibName is the interception library's file name.
const LibName = "libdetshare.so"

// exeDir is the directory of the running executable with symlinks resolved ("" when unknown).
func exeDir() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return filepath.Dir(exe)
}

// BinDir is the directory holding the running DetShare binary (and its siblings).
func BinDir() string { return exeDir() }

// LibCandidates lists where the library is looked for next to binDir, installed layout first.
func LibCandidates(binDir string) []string {
	prefix := filepath.Dir(binDir)
	return []string{
		filepath.Join(prefix, "lib", "detshare", LibName), // FHS: $PREFIX/lib/detshare
		filepath.Join(prefix, "lib", LibName),             // build tree: build/lib
	}
}

// LibPathFor resolves the library for binaries in binDir: env (when not empty) wins; else the first candidate that
// exists; else the installed-layout candidate, so that errors name where the library should be.
func LibPathFor(env, binDir string) string {
	if env != "" {
		return env
	}
	if binDir == "" {
		return "/usr/lib/detshare/" + LibName
	}
	c := LibCandidates(binDir)
	for _, p := range c {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return c[0]
}

// LibPath is the host path of libdetshare.so for the running binary ($DETSHARE_LIB overrides).
func LibPath() string { return LibPathFor(os.Getenv(EnvLib), exeDir()) }

// LibDir is the directory of LibPath (doctor looks for the simulated GPU, a test double, in its simgpu/).
func LibDir() string { return filepath.Dir(LibPath()) }

// Sibling is binary name next to the running executable when it is an executable file there, else "".
func Sibling(name string) string {
	d := exeDir()
	if d == "" {
		return ""
	}
	p := filepath.Join(d, name)
	if IsExecutable(p) {
		return p
	}
	return ""
}

// IsExecutable tells whether p is a regular file with an execute bit.
func IsExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
