#!/usr/bin/env bash
# isolation.sh OUTDIR [SECONDS] [REPS] — what reaches a latency-critical tenant on 32 SMs from a best-effort neighbour that
# saturates the other SMs, and why (issue 5: "within 3% of alone").
#   bash integration/gpu/isolation.sh /tmp/iso 4      (repository root; build/ built on a Go machine and carried)
# Under the real scheduler (which starts MPS), the LC tenant (`detshare run --tier latency-critical --sm 32`) runs
# three workloads (isolation.py lc: compute-bound GEMM, memory-latency-bound ResNet-50 graph, bandwidth-bound copy)
# with no neighbour, then beside a best-effort tenant of each kind (isolation.py be: register-only FMAs, HBM copies,
# training), REPS times (default 2), interleaved. nvidia-smi logs the SM clock and board power meanwhile (read-only queries).
# OUTDIR/isolation.md has the table; the rest is logs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: isolation.sh OUTDIR [SECONDS] [REPS]}
secs=${2:-4}
reps=${3:-2}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1
DS=$repo/build/bin/detshare
[ -x "$DS" ] || { echo "isolation.sh: $DS missing: run 'make build' on a Go machine and carry build/" >&2; exit 2; }
RUN=$(mktemp -d /tmp/detshare-iso.XXXX)
export DETSHARE_RUN_DIR=$RUN
log() { printf '[isolation %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv,noheader,nounits -lms 100 \
  >"$out/clocks.csv" 2>"$out/clocks.err" &
SMI=$!
$DS --log-level info sched >"$out/sched.log" 2>&1 &
SCHED=$!
cleanup() { kill $SMI $SCHED 2>/dev/null; wait 2>/dev/null; rm -rf "$RUN"; }
trap cleanup EXIT
sleep 4
T="timeout -k 5 120"
for rep in $(seq 1 "$reps"); do
  for be in none alu hbm train; do
    stop=$RUN/stop-$be-$rep
    bepid=
    if [ "$be" != none ]; then
      $T $DS run --tier best-effort --name "be-$be-$rep" -- python3 "$here/isolation.py" be "$be" --stop "$stop" \
        >>"$out/be.jsonl" 2>>"$out/be.err" &
      bepid=$!
      sleep 6 # imports, Triton compile, and the scheduler shrinking the neighbour once the LC arrives
    fi
    log "rep $rep, neighbour $be"
    $T $DS run --tier latency-critical --sm 32 --name "lc-$be-$rep" -- \
      python3 "$here/isolation.py" lc --duration "$secs" --tag "$be" >>"$out/results.jsonl" 2>>"$out/lc.err" ||
      log "LC run failed (rep $rep, neighbour $be): see $out/lc.err"
    touch "$stop"
    [ -n "$bepid" ] && wait "$bepid"
    timeout 10 $DS status >>"$out/status.log" 2>&1
  done
done
kill $SMI 2>/dev/null
python3 "$here/isolation.py" report "$out/results.jsonl" "$out/clocks.csv" >"$out/isolation.md"
cat "$out/isolation.md"
cat "$out/be.jsonl" 2>/dev/null
