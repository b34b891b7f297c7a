#!/usr/bin/env bash
# reclaim.sh: issue 12's dispatch gate, measured on the GPU. The reclaim probe (probes/reclaim.cu, worker.py --model
# reclaim) is a latency-critical tenant whose every request needs every SM for 1 ms; it records when its first and
# last blocks started after the launch, i.e. how long the trainer's kernels kept SMs after the request arrived. Runs
# it alone, under plain MPS alone, beside each trainer under plain MPS (no gate) and DetShare-dynamic (floor 1 and
# floor 0) with the default gate budget, then beside the bf16 trainer in DetShare-dynamic-pause with the budgets of
# GATE_BUDGETS. The reclaim table is in OUTDIR/*/results.md.
#
#   make build && bash integration/gpu/reclaim.sh OUTDIR
#
# Needs a GPU with MPS, PyTorch, nvcc, build/bin/detshare and build/lib/libdetshare.so (built here if missing).
# Environment: DURATION (seconds per case, default 4), BE (default lin8192-bf16,lin8192-fp32), GATE_BUDGETS (µs,
# default "100 2000"; empty: none). Board power and SM clock are logged every 100 ms (OUTDIR/*/power.csv).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start_script 13 "$@"
DURATION=${DURATION:-4}
BE=${BE:-lin8192-bf16,lin8192-fp32}
GATE_BUDGETS=${GATE_BUDGETS-100 2000}
mkdir -p "$out"
log() { echo "[reclaim $(date -u +%H:%M:%S)] $*" >&2; }
need_builds "$repo" || exit 1
status=0
common=(--suite coloc --detshare "$repo/build/bin/detshare" --lib "$repo/build/lib/libdetshare.so"
  --python "$PY" --coloc-lc reclaim --duration "$DURATION" --lc-lend)
log "default gate: alone, alone-mps, mps, detshare-dynamic, detshare-dynamic-pause beside $BE"
timeout 400 "$PY" "$here/bench.py" "${common[@]}" --coloc-be "$BE" --out "$out/default" \
  --configs alone,alone-mps,mps,detshare-dynamic,detshare-dynamic-pause || status=1
"$PY" "$here/report.py" "$out/default" >/dev/null || status=1
for b in $GATE_BUDGETS; do
  log "gate budget $b us: detshare-dynamic-pause beside lin8192-bf16"
  timeout 150 "$PY" "$here/bench.py" "${common[@]}" --coloc-be lin8192-bf16 --gate-budget-us "$b" \
    --out "$out/budget$b" --configs alone,detshare-dynamic-pause || status=1
  "$PY" "$here/report.py" "$out/budget$b" >/dev/null || status=1
done
exit $status
