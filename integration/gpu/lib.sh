# lib.sh: what the GPU scripts share. Sourced after setting here (the script's directory), never run.

# start_script LAST "$@": with -h, --help or no argument, prints the script's header comment (lines 2..LAST) and
# exits (0 for help, 2 without an argument); otherwise sets out (the first argument), repo (the tree's root) and PY.
start_script() {
  local last=$1
  shift
  case "${1:-}" in -h | --help | "")
    sed -n "2,${last}p" "$0" | sed 's/^# \{0,1\}//'
    [ -n "${1:-}" ] && exit 0 || exit 2 ;;
  esac
  out=$1
  repo=$(cd "$here/../.." && pwd)
  PY=${PYTHON:-python3}
}

# need_builds REPO: build/lib/libdetshare.so (built here when missing: make and cc suffice) and build/bin/detshare
# (built by `make build`, or carried to the device) must exist; returns 1 with a message when one cannot.
need_builds() {
  local repo=$1
  if [ ! -f "$repo/build/lib/libdetshare.so" ]; then
    echo "building libdetshare.so" >&2
    make -s -C "$repo" -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so || return 1
  fi
  [ -x "$repo/build/bin/detshare" ] || { echo "build/bin/detshare missing: run make build" >&2; return 1; }
}

# check NAME WANT GOT: one line of $out/summary.txt, "ok" when GOT is WANT, else "FAIL" (also on stdout).
check() {
  local s=ok
  [ "$2" = "$3" ] || s=FAIL
  printf '%-4s %s: want %s, got %s\n' "$s" "$1" "$2" "$3" | tee -a "$out/summary.txt"
}

# rc NAME STEP: the rc= the probe printed for STEP in $out/NAME.out (its last such line).
rc() { sed -n "s/^$2 rc=\([0-9-]*\).*/\1/p" "$out/$1.out" | tail -1; }

# probe_script NAME OUTDIR: the start of a script that drives libdetshare's probe (build/tests/ds_probe_rt) under
# the real `detshare`: sets out (OUTDIR, made and absolute), repo, DS and PROBE and enters the repository; exits 1
# without OUTDIR and 2 when a build is missing, saying what to do.
probe_script() {
  local name=$1
  [ -n "${2:-}" ] || { echo "usage: $name OUTDIR" >&2; exit 1; }
  out=$2
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  repo=$(cd "$here/../.." && pwd)
  cd "$repo" || exit 2
  DS=$repo/build/bin/detshare
  PROBE=$repo/build/tests/ds_probe_rt
  local f
  for f in "$DS" "$PROBE"; do
    [ -x "$f" ] || { echo "$name: $f missing: run 'make build' on a Go machine and carry build/" >&2; exit 2; }
  done
}

# private_mps: the directories of a private MPS daemon, none of the host's: sets mps (its root: pipe in $mps/pipe,
# logs in $mps/log, exported as CUDA_MPS_LOG_DIRECTORY). The caller's EXIT trap runs stop_mps and removes $mps.
private_mps() {
  mps=$(mktemp -d)
  export CUDA_MPS_LOG_DIRECTORY=$mps/log
  mkdir -p "$mps/pipe" "$mps/log"
}

# start_mps NAME: starts the private daemon of private_mps; exits 1 naming NAME when it does not start.
start_mps() {
  CUDA_MPS_PIPE_DIRECTORY=$mps/pipe nvidia-cuda-mps-control -d || { echo "$1: MPS daemon did not start" >&2; exit 1; }
}

# stop_mps: quits the private daemon (nothing when it is not running).
stop_mps() { CUDA_MPS_PIPE_DIRECTORY=$mps/pipe nvidia-cuda-mps-control <<<quit >/dev/null 2>&1; }
