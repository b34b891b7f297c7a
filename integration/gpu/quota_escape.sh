#!/usr/bin/env bash
# quota_escape.sh OUTDIR — issue 13 items 2 and 3 on a real GPU: a hostile 4 GiB tenant tries to take more device
# memory through graph memory nodes, captured stream-ordered allocations, pool memory kept after a free, and a
# cuMemAlloc_v2 resolved past the interception library; then the same without MPS.
#   bash integration/gpu/quota_escape.sh /tmp/qe     (repository root; build/ built on a Go machine and carried)
# Under the real scheduler (which starts MPS and sets the server-side per-client memory limit), two processes of one
# `detshare run --memory 4Gi` tenant each ask for 3 GiB; nvidia-smi's used memory and `detshare status` are recorded
# after each attempt. OUTDIR/results.jsonl has one line per attempt; OUTDIR/summary.txt the table.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: quota_escape.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1
DS=$repo/build/bin/detshare
[ -x "$DS" ] || { echo "quota_escape.sh: $DS missing: run 'make build' and carry build/" >&2; exit 2; }
PY="python3 $here/quota_escape.py"
T="timeout -k 5 60"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,memory.used --format=csv,noheader,nounits -lms 100 \
  >"$out/clocks.csv" 2>"$out/clocks.err" &
SMI=$!
smi_used() { local v; v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1); echo "${v:-null}"; }
note() { printf '{"phase":"%s","case":"%s","smi_used_mib":%s}\n' "$1" "$2" "$(smi_used)" >>"$out/results.jsonl"; }

phase() { # phase NAME CONFIG
  local name=$1 cfg=$2
  local run
  run=$(mktemp -d /tmp/detshare-qe.XXXX)
  export DETSHARE_RUN_DIR=$run
  $DS --log-level debug sched --config "$cfg" --stop-mps-on-exit >"$out/sched-$name.log" 2>&1 &
  local sched=$!
  sleep 3
  note "$name" baseline
  for mode in graph capture bypass; do
    # first process of the tenant holds its 3 GiB; the second asks for 3 GiB more inside the same 4 GiB tenant
    $T $DS run --memory 4Gi --name "$mode-$name" -- $PY "$mode" 3 --hold 4 >>"$out/results.jsonl" 2>>"$out/err-$name.log" &
    local first=$!
    sleep 2
    $T $DS run --join "$mode-$name" -- $PY "$mode" 3 >>"$out/results.jsonl" 2>>"$out/err-$name.log"
    note "$name" "$mode-two-processes"
    timeout 10 $DS status >>"$out/status-$name.log" 2>&1
    wait $first
  done
  # the tenant raises its own client-side MPS limit and bypasses the library: only the server-side limit is left
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G $T $DS run --memory 4Gi --name "raise-$name" -- $PY bypass 6 \
    >>"$out/results.jsonl" 2>>"$out/err-$name.log"
  note "$name" bypass-6g-own-limit-100g
  $T $DS run --memory 4Gi --name "pool-$name" -- $PY pool 3 >>"$out/results.jsonl" 2>>"$out/err-$name.log"
  note "$name" pool
  kill -INT $sched
  wait $sched
  rm -rf "$run"
}

cat >"$out/mps.toml" <<'EOF'
[mps]
enable = true
EOF
cat >"$out/nomps.toml" <<'EOF'
[mps]
enable = false
EOF
phase mps "$out/mps.toml"
phase nomps "$out/nomps.toml"
kill $SMI 2>/dev/null
wait 2>/dev/null
python3 - "$out/results.jsonl" >"$out/summary.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if "phase" in r:
        print(f"  nvidia-smi used after {r['phase']}/{r['case']}: {r['smi_used_mib']} MiB")
    else:
        extra = ""
        if r.get("mode") == "pool":
            extra = f" threshold_in_driver={r.get('threshold_in_driver')} pool_reserved_after_free={r.get('pool_reserved_after_free')}"
        print(f"{r['mode']:8s} {r['bytes']/2**30:.1f} GiB rc={r['rc']} step={r.get('step','-')} "
              f"meminfo_total={r.get('meminfo_total',0)/2**30:.2f} GiB{extra}")
PY
cat "$out/summary.txt"
