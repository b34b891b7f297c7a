#!/usr/bin/env bash
# deps.sh — what `make demo` and `make test` need on the host, and installing what is missing (Debian/Ubuntu).
#
#   integration/deps.sh [--yes] [--check] demo|test
#
# demo: containerd (containerd, ctr), runc, busybox-static, gcc, libc6-dev, make, iproute2 (ss), util-linux.
# test: all of demo, and docker.io (dockerd, docker), podman, python3 and python3-torch (the framework checks on the
#       simulated GPU), ca-certificates (the Go module proxy), mount, procps and psmisc.
# Both need Go (go.mod's version or later, from https://go.dev/dl: distributions ship older ones) and root.
#
# Missing Debian packages are installed with apt-get after asking on the terminal ([y/N]); without asking when
# --yes is given, DETSHARE_DEPS_YES=1 is set or stdin is not a terminal (CI). --check only reports what is missing
# (exit 1 when something is). Without apt-get it fails naming the packages to install. `make demo` and `make test`
# (its `deps` step) run it; so does .ci/run.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
yes=0 check=0 profile=""
[ "${DETSHARE_DEPS_YES:-0}" = 1 ] && yes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --yes|-y) yes=1 ;;
    --check) check=1 ;;
    demo|test) profile=$1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deps: unknown argument '$1' (allowed: demo, test, --yes, --check, --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$profile" ] || { echo "deps: say what for: demo or test (integration/deps.sh --help)" >&2; exit 2; }
die() { printf 'deps: %s\n' "$*" >&2; exit 1; }

# Go from https://go.dev/dl lives in /usr/local/go/bin, which sudo's secure_path leaves out, and dockerd and runc in
# /usr/sbin, which a user's PATH may lack; the Makefile adds the same directories for the tests.
for d in /usr/local/go/bin /usr/local/sbin /usr/sbin /sbin; do
  case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done

# need PACKAGE KIND ARG WHY — one requirement: KIND cmd (ARG in PATH), file (ARG exists), static (ARG is a static
# executable: it is copied alone into the demo's and the tests' images) or pymod (python3 finds module ARG).
reqs=()
need() { reqs+=("$1|$2|$3|$4"); }
need containerd cmd containerd "the demo's and the tests' private containerd"
need containerd cmd ctr "drives that containerd"
need runc cmd runc "the OCI runtime under containerd, Docker and DetShare's shim"
need busybox-static static /bin/busybox "the shell and tools of the locally built test images"
need gcc cmd gcc "builds libdetshare and the simulated GPU (make build)"
need libc6-dev file /usr/include/stdio.h "C headers and the static libc for make build and the tests' pause image"
need make cmd make "make build"
need iproute2 cmd ss "the demo's cleanup: which containerd sockets still listen"
need util-linux cmd setsid "the demo's daemons run in their own session"
if [ "$profile" = test ]; then
  need util-linux cmd unshare "private mount namespaces (libdetshare's quota tests, integration/freshhost)"
  need util-linux cmd setpriv "libdetshare's trust tests run a tenant as another user"
  need mount cmd mount "integration/freshhost mounts tmpfs over /run in a private namespace"
  need docker.io cmd dockerd "the Docker end-to-end tests (integration/containers)"
  need docker.io cmd docker "the Docker end-to-end tests (integration/containers)"
  need podman cmd podman "the podman end-to-end tests (integration/containers)"
  need python3 cmd python3 "integration/gpu's Python harness and conformance.sh on the simulated GPU"
  need python3-torch pymod torch "integration/gpu's framework checks (PyTorch on the CPU is enough)"
  need ca-certificates file /etc/ssl/certs/ca-certificates.crt "HTTPS to the Go module proxy (make test-components)"
  need procps cmd ps "ps/pgrep to look into a failed run (no test runs them)"
  need psmisc cmd fuser "fuser/killall to look into a failed run (no test runs them)"
fi

# runnable NAME: NAME is an executable in PATH (command -v alone also names a file it cannot run)
runnable() { local p; p=$(command -v "$1" 2>/dev/null) && [ -x "$p" ]; }

met() {
  local kind=$1 arg=$2 py
  case "$kind" in
    cmd) runnable "$arg" ;;
    file) [ -e "$arg" ] ;;
    static) [ -x "$arg" ] && ! ldd "$arg" >/dev/null 2>&1 ;; # ldd fails on a static executable
    pymod) # the interpreters integration/gpu's torchPython tries, in its order
      for py in ${DETSHARE_TORCH_PYTHON:-} /usr/bin/python3 python3; do
        runnable "$py" &&
          "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$arg') is None)" 2>/dev/null &&
          return 0
      done
      return 1 ;;
  esac
}

# missing_list prints "package<TAB>why" for each unmet requirement.
missing_list() {
  local r pkg kind arg why
  for r in "${reqs[@]}"; do
    IFS='|' read -r pkg kind arg why <<<"$r"
    met "$kind" "$arg" || printf '%s\t%s (%s)\n' "$pkg" "$arg" "$why"
  done
}

# Go: not a distribution package here (bookworm's is too old for go.mod).
want_go=$(sed -n 's/^go \([0-9][0-9.]*\).*/\1/p' "$repo/go.mod")
go_problem=""
if ! runnable go; then
  go_problem="Go $want_go or later is needed and not found (in PATH or /usr/local/go/bin)"
else
  have_go=$(cd / && GOTOOLCHAIN=local go env GOVERSION 2>/dev/null | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$want_go" "${have_go:-0}" | sort -V | head -1)" != "$want_go" ]; then
    go_problem="Go $want_go or later is needed, $(command -v go) is ${have_go:-of unknown version}"
  fi
fi
[ -z "$go_problem" ] || go_problem="$go_problem: install it from https://go.dev/dl (distributions ship older ones)"

missing=$(missing_list)
if [ -z "$missing" ]; then
  [ -z "$go_problem" ] || die "$go_problem"
  exit 0
fi
pkgs=$(cut -f1 <<<"$missing" | sort -u | tr '\n' ' ')
pkgs=${pkgs% }
{
  echo "deps: \`make $profile\` needs these Debian packages, which are missing:"
  while IFS=$'\t' read -r pkg what; do echo "  $pkg: $what"; done <<<"$missing"
} >&2
[ -z "$go_problem" ] || echo "deps: also: $go_problem" >&2
[ $check = 0 ] || exit 1
runnable apt-get || die "no apt-get here: install $pkgs (or their equivalents) with your package manager"
[ "$(id -u)" = 0 ] || die "installing needs root: sudo apt-get install $pkgs (or run make $profile with sudo)"
if [ $yes = 0 ] && [ -t 0 ]; then
  printf 'Install them now with apt-get (%s)? [y/N] ' "$pkgs" >&2
  ans=""
  read -r ans || true
  case "$ans" in y|Y|yes|YES) ;; *) die "not installing; install them (apt-get install $pkgs) or answer y" ;; esac
fi
echo "deps: apt-get install $pkgs" >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086 # one word per package
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends $pkgs; } >&2; then
  die "apt-get could not install $pkgs (see above)"
fi
missing=$(missing_list)
[ -z "$missing" ] || die "still missing after apt-get: $(tr '\n' ';' <<<"$missing")"
[ -z "$go_problem" ] || die "$go_problem"
echo "deps: installed $pkgs" >&2
