#!/usr/bin/env bash
# demo.sh — `make demo`: DetShare in one command on a fresh Debian/Ubuntu machine.
#
#   integration/demo/demo.sh [--yes] [--duration SECONDS] [--keep]      (make demo DEMO_ARGS=--yes)
#
# 1. installs what is missing (integration/deps.sh demo: containerd, runc, busybox-static, ... from the
#    distribution; asks first unless --yes or stdin is not a terminal, as in CI), then builds DetShare (`make build`);
# 2. starts a PRIVATE containerd (its own root, state and socket under a temporary directory: the system's
#    daemons are not touched) with DetShare's shim registered as runtime io.containerd.detshare.v1, and the
#    DetShare scheduler on a private run directory;
# 3. imports a small locally built image (busybox + the simulated-GPU workload program simgpu-probe);
# 4. runs a latency-critical inference-like container (short kernels on 32 SMs' worth of blocks, back to back)
#    and a best-effort training-like container (long multi-wave kernels) on one GPU: each alone, both shared
#    without DetShare (plain runc: the GPU time-slices between them), and both under DetShare (latency-critical
#    tier guaranteed 32 SMs, holding scheduler.lc_reserve of the GPU as its own partition and, with
#    scheduler.lc_overlap, also running on the best-effort tier's groups; best-effort on the rest at full depth),
#    showing `detshare top` while they run and saying what each phase shows;
# 5. prints latency-critical p50/p99 and best-effort throughput for the three situations.
# It runs on a host where containerd never ran (no /run/containerd): integration/freshhost tests that.
# DETSHARE_CONFIG names the scheduler's configuration (default: the shipped configs/detshare/config.toml).
# The GPU here is the SIMULATED GPU (a test double of the CUDA driver that times kernels on simulated SMs); the
# screen says so. Real-GPU figures come from integration/gpu/run_all.sh (BENCHMARKS.md).
# Everything is removed on exit, including on Ctrl-C. --keep leaves the temporary directory for inspection.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=integration/teardown.sh
. "$repo/integration/teardown.sh"
yes=0 keep=0 duration=6
while [ $# -gt 0 ]; do
  case "$1" in
    --yes|-y) yes=1 ;;
    --keep) keep=1 ;;
    --duration) duration="${2:?--duration needs seconds}"; shift ;;
    --duration=*) duration="${1#--duration=}" ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument '$1' (allowed: --yes, --duration SECONDS, --keep, --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$duration" in
  ''|*[!0-9]*) echo "demo: --duration=$duration: want whole seconds between 2 and 120" >&2; exit 2 ;;
esac
if [ "$duration" -lt 2 ] || [ "$duration" -gt 120 ]; then
  echo "demo: --duration=$duration: want whole seconds between 2 and 120" >&2; exit 2
fi

bold=$(printf '\033[1m') off=$(printf '\033[0m')
[ -t 1 ] || { bold=""; off=""; }
say() { printf '%s==>%s %s\n' "$bold" "$off" "$*"; }
explain() { printf '%s\n' "$*" | fold -s -w 110 | sed 's/ *$//; s/^/    /'; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root: containerd and runc run as root (sudo make demo)"

# ---- 1. dependencies ----------------------------------------------------------------------------------------------
# integration/deps.sh is the one list of what the demo and the tests need, and the one installer (apt-get).
deps_args=(demo)
[ $yes = 0 ] || deps_args+=(--yes)
"$repo/integration/deps.sh" "${deps_args[@]}" || die "missing dependencies (see above)"
case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) export PATH="$PATH:/usr/local/go/bin" ;; esac

# ---- build ---------------------------------------------------------------------------------------------------------
if [ "${DEMO_SKIP_BUILD:-0}" != 1 ]; then
  say "building DetShare (make build)"
  # its errors are kept in memory: nothing to leave behind when the build fails or is interrupted
  if ! build_err=$(make -C "$repo" build 2>&1 >/dev/null); then
    printf '%s\n' "$build_err" | tail -30 >&2
    die "make build failed"
  fi
fi
build="${DETSHARE_BUILD_DIR:-$repo/build}"
for f in bin/detshare bin/containerd-shim-detshare-v1 bin/containerd-shim-detshare-v1-serve bin/detshare-hook lib/libdetshare.so lib/simgpu/libcuda.so.1 \
  tests/simgpu-probe; do
  [ -e "$build/$f" ] || die "$build/$f is missing after the build (is every component built? make build)"
done

gpu_note="SIMULATED GPU (a test double of the CUDA driver: 132 simulated SMs, kernels are timed work)"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu_note="$gpu_note — an NVIDIA GPU is present, but the demo's containers carry no NVIDIA driver libraries; \
real-GPU figures: integration/gpu/run_all.sh --quick OUTDIR (BENCHMARKS.md)"
fi

# ---- 2. private containerd + scheduler ------------------------------------------------------------------------------
ns=detshare-demo
ctrd_pid="" sched_pid=""
# containerd puts shim sockets in /run/containerd/s, ctr its stdio fifos in /run/containerd/fifo and runc its state in
# /run/containerd/runc/<namespace>, whatever containerd's own state directory. On a host where containerd never ran
# none of them exists yet (issue 25): they are noted, not listed, and cleanup() removes what appears there during the
# demo once nothing uses it.
host_dirs=(/run/containerd /run/containerd/s /run/containerd/fifo /run/containerd/runc "/run/containerd/runc/$ns")
new_dirs=()
for d in "${host_dirs[@]}"; do [ -e "$d" ] || new_dirs+=("$d"); done
old_entries=" "
for e in /run/containerd/s/* /run/containerd/fifo/*; do # a glob of a missing directory stays the pattern itself
  if [ -e "$e" ]; then old_entries+="$e "; fi
done
tmp=$(mktemp -d /tmp/detshare-demo.XXXXXX)
sock="$tmp/containerd.sock"
run_dir="$tmp/run"
# ctr waits 10 s for a socket nobody serves unless told otherwise
ctr_() { ctr --address "$sock" --namespace "$ns" --connect-timeout 2s "$@"; }

# cleanup runs on every exit, failures included: without errexit, so that one failing step cannot skip the rest.
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM ERR
  if [ -S "$sock" ] && [ -n "$ctrd_pid" ] && kill -0 "$ctrd_pid" 2>/dev/null; then
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
    sleep 0.3
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks rm -f "$id" >/dev/null 2>&1; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$id" >/dev/null 2>&1; done
  fi
  for pid in $sched_pid $ctrd_pid; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
    fi
  done
  # shims (and anything else) still naming our directory: only processes this demo started can; then the mounts
  # containerd left below it
  kill_naming "$tmp"
  umount_below "$tmp"
  local s listening
  listening=$(ss -xlH 2>/dev/null)
  for s in /run/containerd/s/*; do
    [ -S "$s" ] || continue
    case "$old_entries" in *" $s "*) continue ;; esac
    case "$listening" in *"$s"*) ;; *) rm -f "$s" ;; esac
  done
  for s in /run/containerd/fifo/*; do # ctr's per-task fifo directories, empty once the tasks are gone
    [ -d "$s" ] || continue
    case "$old_entries" in *" $s "*) ;; *) rmdir "$s" 2>/dev/null ;; esac
  done
  local i
  for ((i = ${#new_dirs[@]} - 1; i >= 0; i--)); do rmdir "${new_dirs[$i]}" 2>/dev/null; done
  if [ $keep = 1 ]; then echo "demo: --keep: $tmp kept" >&2; else rm -rf "$tmp"; fi
  exit $rc
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted, cleaning up" >&2; exit 130' INT TERM
# a step that fails under errexit says which one, rather than ending the demo without a word
trap 'echo "demo: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR
mkdir -p "$tmp/bin" "$run_dir" "$tmp/simgpu"

ln -s "$build/bin/containerd-shim-detshare-v1" "$tmp/bin/containerd-shim-detshare-v1"
ln -s "$build/bin/containerd-shim-detshare-v1-serve" "$tmp/bin/containerd-shim-detshare-v1-serve"
# The scheduler's policy settings: the shipped defaults (configs/detshare/config.toml) unless DETSHARE_CONFIG names
# another file, so that what the demo shows does not depend on an /etc/detshare/config.toml left on this host.
export DETSHARE_CONFIG="${DETSHARE_CONFIG:-$repo/configs/detshare/config.toml}"
export DETSHARE_RUN_DIR="$run_dir" DETSHARE_SIMGPU=1 DETSHARE_SIMGPU_SMS=132 DETSHARE_LIB="$build/lib/libdetshare.so" \
  DETSHARE_HOOK="$build/bin/detshare-hook" DETSHARE_BIN="$build/bin/detshare" DETSHARE_LOG_LEVEL=warning
cat >"$tmp/containerd.toml" <<EOF
version = 2
root = "$tmp/ctrd-root"
state = "$tmp/ctrd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
EOF
say "starting a private containerd ($sock) with DetShare's shim registered (io.containerd.detshare.v1)"
# own session: a terminal's Ctrl-C must not reach containerd before cleanup() has removed the containers through it
PATH="$tmp/bin:$PATH" setsid containerd --config "$tmp/containerd.toml" >"$tmp/containerd.log" 2>&1 &
ctrd_pid=$!
for _ in $(seq 100); do
  ctr_ version >/dev/null 2>&1 && break
  kill -0 "$ctrd_pid" 2>/dev/null || break # it exited: its log says why
  sleep 0.1
done
ctr_ version >/dev/null 2>&1 || { tail -20 "$tmp/containerd.log" >&2; die "containerd did not start"; }

say "starting the DetShare scheduler on $run_dir (simulated GPU)"
setsid "$build/bin/detshare" sched >"$tmp/sched.log" 2>&1 &
sched_pid=$!
for _ in $(seq 50); do
  "$build/bin/detshare" status --json >/dev/null 2>&1 && break
  kill -0 "$sched_pid" 2>/dev/null || break
  sleep 0.1
done
"$build/bin/detshare" status --json >/dev/null 2>&1 || { tail -20 "$tmp/sched.log" >&2; die "the scheduler did not start"; }

# ---- 3. image -------------------------------------------------------------------------------------------------------
say "building and importing the workload image (busybox + simgpu-probe + the simulated GPU driver)"
root="$tmp/rootfs" img="$tmp/image"
mkdir -p "$root"/{bin,dev,etc,proc,sys,tmp,run,usr/lib/simgpu,usr/local/bin,simgpu} "$img/layer"
cp /bin/busybox "$root/bin/busybox"
for t in sh cat sleep echo ls; do ln -s busybox "$root/bin/$t"; done
cp "$build/tests/simgpu-probe" "$root/usr/local/bin/"
cp "$build/lib/simgpu/libcuda.so.1" "$root/usr/lib/simgpu/"
for l in $(ldd "$build/tests/simgpu-probe" "$build/lib/simgpu/libcuda.so.1" "$build/lib/libdetshare.so" 2>/dev/null |
  grep -o '/[^ :]*\( \|$\)' | grep -v ':' | sed 's/ $//' | sort -u); do
  mkdir -p "$root$(dirname "$l")"
  cp -L "$l" "$root$l"
done
tar -C "$root" --numeric-owner --owner=0 --group=0 -cf "$img/layer/layer.tar" .
diff_id=$(sha256sum "$img/layer/layer.tar" | cut -d' ' -f1)
printf '{"architecture":"%s","os":"linux","created":"2026-01-01T00:00:00Z","config":{"Env":["PATH=/usr/local/bin:/bin","LD_LIBRARY_PATH=/usr/lib/simgpu","DETSHARE_SIMGPU_SMS=132","DETSHARE_SIMGPU_STATE=/simgpu/state"],"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$(dpkg --print-architecture 2>/dev/null || echo amd64)" "$diff_id" >"$img/config.json"
printf '[{"Config":"config.json","RepoTags":["detshare-demo:latest"],"Layers":["layer/layer.tar"]}]' >"$img/manifest.json"
tar -C "$img" -cf "$tmp/image.tar" manifest.json config.json layer
ctr_ images import "$tmp/image.tar" >/dev/null || die "ctr images import failed"
image=docker.io/library/detshare-demo:latest

# ---- 4. the workloads -----------------------------------------------------------------------------------------------
# LC: an inference-like service: small kernels (32 blocks x 2 ms: one wave on 32 SMs), back to back, each timed.
# BE: a training-like job: long kernels of 4 waves (528 blocks x 3 ms on 132 SMs), GEMM-like (32 KiB of shared memory
# a block, so the library runs them on the BE's whole grant, not on its narrow part for memory-bound kernels);
# throughput = kernels/s.
lc_args=(simgpu-probe spin --blocks 32 --us 2000 --per-iter 1)
be_args=(simgpu-probe spin --blocks 528 --us 3000 --smem 32768)
ms=$((duration * 1000))

# run_phase NAME RUNTIME WITH_LC WITH_BE: both containers start at the same instant (--start-at)
run_phase() {
  local name=$1 runtime=$2 lc=$3 be=$4 start pids=() rt_args=() lc_env=() be_env=()
  start=$(( $(date +%s%3N) + 1500 ))
  # a fresh simulated GPU for every phase (its state file holds the simulated SMs' busy times)
  rm -f "$tmp/simgpu/state"
  if [ "$runtime" = detshare ]; then
    rt_args=(--runtime io.containerd.detshare.v1)
    lc_env=(--env DETSHARE_TIER=latency-critical --env DETSHARE_SMS=32 --env DETSHARE_SIMGPU_MPS=1)
    be_env=(--env DETSHARE_TIER=best-effort --env DETSHARE_SIMGPU_MPS=1)
  fi
  local mnt=(--mount "type=bind,src=$tmp/simgpu,dst=/simgpu,options=rbind:rw")
  if [ "$lc" = 1 ]; then
    ctr_ run --rm "${rt_args[@]}" "${lc_env[@]}" "${mnt[@]}" "$image" "lc-$name" "${lc_args[@]}" \
      --duration-ms "$ms" --start-at "$start" >"$tmp/$name.lc.out" 2>"$tmp/$name.lc.err" </dev/null &
    pids+=($!)
  fi
  if [ "$be" = 1 ]; then
    ctr_ run --rm "${rt_args[@]}" "${be_env[@]}" "${mnt[@]}" "$image" "be-$name" "${be_args[@]}" \
      --duration-ms "$ms" --start-at "$start" >"$tmp/$name.be.out" 2>"$tmp/$name.be.err" </dev/null &
    pids+=($!)
  fi
  if [ "$runtime" = detshare ]; then
    sleep 2.5
    say "detshare top (while both containers run):"
    "$build/bin/detshare" top -n 2 --interval 1s </dev/null || true
  fi
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if [ $failed = 1 ]; then
    cat "$tmp/$name".*.err >&2 || true
    die "a container of phase '$name' failed (see the errors above)"
  fi
}

# lc_stats FILE -> "p50 p99" of the per-request latencies (ms); the first 3 requests are warm-up (module load)
lc_stats() {
  grep -o '"iter":[0-9]*,"ms":[0-9.]*' "$1" | awk -F'[:,]' '$2 >= 3 {print $4}' | sort -g |
    awk '{v[NR]=$1} END { if (NR == 0) { print "- -"; exit }
      i50 = int(0.50 * (NR - 1)) + 1; i99 = int(0.99 * (NR - 1)) + 1; printf "%.2f %.2f\n", v[i50], v[i99] }'
}
# be_rate FILE -> kernels per second
be_rate() {
  local n
  n=$(grep -o '"iters":[0-9]*' "$1" | tail -1 | sed 's/.*://') || true
  if [ -z "$n" ]; then echo "-"; else awk -v n="$n" -v d="$duration" 'BEGIN {printf "%.1f\n", n / d}'; fi
}

echo
printf '%s%s%s\n' "$bold" "*** GPU: $gpu_note ***" "$off"
echo
say "phase 1/4: latency-critical container alone (${duration}s)"
explain "An inference-like service: each request is one kernel of 32 blocks x 2 ms (one wave on 32 SMs), sent back" \
  "to back. Its latency alone is the reference for phases 3 and 4."
run_phase alone-lc runc 1 0
say "phase 2/4: best-effort container alone (${duration}s)"
explain "A training-like job: kernels of 528 blocks x 3 ms (4 waves on all 132 SMs). Its throughput alone is the" \
  "reference (100% kept)."
run_phase alone-be runc 0 1
say "phase 3/4: both shared WITHOUT DetShare (runc; the GPU time-slices) (${duration}s)"
explain "Nothing arbitrates: the GPU time-slices between the two processes, so a request that arrives during a" \
  "training kernel waits for it. Watch the latency-critical p50/p99 grow; the trainer barely notices."
run_phase shared runc 1 1
say "phase 4/4: both shared WITH DetShare (latency-critical tier with 32 SMs guaranteed, best-effort tier) (${duration}s)"
explain "The GPU is split into SM groups (15 of 8 SMs here, as on an H100; 12 SMs are in no group). The" \
  "latency-critical container is guaranteed 4 groups (32 SMs) and holds scheduler.lc_reserve of the GPU (half by" \
  "default: 8 groups) as its own partition, busy or idle; the trainer keeps the other groups at full depth and its" \
  "grant never flips with the service's requests. With scheduler.lc_overlap (the default; this run reads" \
  "$DETSHARE_CONFIG) the service is also granted the trainer's groups, shared under MPS at its higher client" \
  "priority, so its kernels spread over the whole GPU. In 'detshare top' below, GUAR is a tenant's guaranteed SMs" \
  "and NOW the SMs granted to it now (* when another tenant holds some of them too: here the service shares the" \
  "trainer's groups), and the footer counts each SM once."
run_phase detshare detshare 1 1

read -r a50 a99 < <(lc_stats "$tmp/alone-lc.lc.out")
read -r s50 s99 < <(lc_stats "$tmp/shared.lc.out")
read -r d50 d99 < <(lc_stats "$tmp/detshare.lc.out")
ba=$(be_rate "$tmp/alone-be.be.out")
bs=$(be_rate "$tmp/shared.be.out")
bd=$(be_rate "$tmp/detshare.be.out")
pct() { awk -v x="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * x / b; else print "-" }'; }

echo
printf '%sResults on the %s%s\n' "$bold" "SIMULATED GPU (test double)" "$off"
printf '%-34s %10s %10s %16s %8s\n' "" "LC p50 ms" "LC p99 ms" "BE kernels/s" "BE kept"
printf '%-34s %10s %10s %16s %8s\n' "alone" "$a50" "$a99" "$ba" "100%"
printf '%-34s %10s %10s %16s %8s\n' "shared without DetShare" "$s50" "$s99" "$bs" "$(pct "$bs" "$ba")"
printf '%-34s %10s %10s %16s %8s\n' "shared with DetShare" "$d50" "$d99" "$bd" "$(pct "$bd" "$ba")"
echo
echo "LC = latency-critical inference-like container (p50/p99 of its request latency)."
echo "BE = best-effort training-like container (its throughput, and the share of its solo throughput it kept)."
echo "With DetShare the LC runs on its own partition (half the GPU by default, scheduler.lc_reserve) and, shared at"
echo "its higher priority, on the BE's groups too (scheduler.lc_overlap), not behind training kernels; the BE keeps"
echo "the other half at full depth. A smaller lc_reserve gives the BE more and the LC less; an SLO (DETSHARE_SLO_P99)"
echo "lets the scheduler size the partition from the latency it measures; lc_reserve = 0 restores the expansion of"
echo "issue 12 (the LC takes every group the BE can give while busy). Measured on an H100: BENCHMARKS.md, issue 26."
echo "Simulated GPU: shapes, not H100 numbers. Real-GPU results: BENCHMARKS.md."
