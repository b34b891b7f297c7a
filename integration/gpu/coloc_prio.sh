#!/usr/bin/env bash
# coloc_prio.sh: issue 12 on a GPU, in one run: what the trainer's kernels are (kernelgrid.py), what the MPS client
# priority the library sets from the tier is worth (plain MPS with and without a below-normal trainer; DetShare-dynamic
# with and without it), and what is left when the trainer is confined to its floor for the whole run (DetShare-static
# with the LC guaranteed every group but the floor): the interference SM partitioning cannot remove.
#
#   make build && bash integration/gpu/coloc_prio.sh OUTDIR
#
# Needs a GPU with MPS, PyTorch, build/bin/detshare and build/lib/libdetshare.so (built here if missing and cc is
# there). Environment: DURATION (seconds per case, default 5), LC (default llama-step,bert), BE (lin8192-bf16),
# WIDE_GROUPS (the LC's guarantee in the confined run, default: every group but one). Board power and SM clock are
# logged every 100 ms by bench.py (OUTDIR/*/power.csv). The scheduler logs at debug level with microsecond stamps,
# so slow requests can be lined up with grant decisions (OUTDIR/*/logs/*__sched.log).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start_script 13 "$@"
DURATION=${DURATION:-5}
LC=${LC:-llama-step,bert}
BE=${BE:-lin8192-bf16}
mkdir -p "$out"
log() { echo "[coloc_prio $(date -u +%H:%M:%S)] $*" >&2; }
need_builds "$repo" || exit 1
status=0

log "trainer kernels"
timeout 60 "$PY" "$here/kernelgrid.py" --model "$BE" --out "$out/kernels.json" >"$out/kernels.txt" 2>&1 || status=1
cat "$out/kernels.txt" >&2

export DETSHARE_BENCH_SCHED_LOG=debug
common=(--suite coloc --detshare "$repo/build/bin/detshare" --lib "$repo/build/lib/libdetshare.so"
  --python "$PY" --coloc-lc "$LC" --coloc-be "$BE" --duration "$DURATION")
log "priority: alone, mps, mps-prio, detshare-dynamic, detshare-dynamic-noprio"
timeout 330 "$PY" "$here/bench.py" "${common[@]}" --lc-lend --out "$out/prio" \
  --configs alone,mps,mps-prio,detshare-dynamic,detshare-dynamic-noprio || status=1
"$PY" "$here/report.py" "$out/prio" >/dev/null || status=1

groups=$("$PY" "$here/gpuinfo.py" | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["split"]["groups"]))') ||
  groups=16
wide=${WIDE_GROUPS:-$((groups - 1))}
log "trainer confined to its floor: detshare-static with the LC on $wide of $groups groups"
timeout 150 "$PY" "$here/bench.py" "${common[@]}" --lc-groups "$wide" --out "$out/confined" \
  --configs alone,detshare-static || status=1
"$PY" "$here/report.py" "$out/confined" >/dev/null || status=1
exit $status
