// Package freshhost checks that DetShare and its demo work on a host where containerd, Docker and DetShare never
// ran (issue 25): in a private mount namespace with an empty tmpfs over /run and over the engines' directories
// (freshhost.sh), it runs `make demo` in CI mode and one container through DetShare's shim on a containerd whose
// root and state do not exist yet (shimrun.sh). The tests need root; they fail, not skip, without it.
package freshhost
