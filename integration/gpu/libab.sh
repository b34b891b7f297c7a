#!/usr/bin/env bash
# libab.sh — two builds of libdetshare side by side on the launch path of a real GPU: ResNet-50 batch 1 eager
# (about 160 kernel launches a forward, so a change in the per-launch cost adds up) and replayed from a CUDA graph,
# each under `detshare run --tier best-effort` (a tenant holding every group, the launch path with its grant check)
# and natively, the builds alternating round by round (each first in every other round) on one warm GPU under one
# scheduler (MPS on).
#
# usage: integration/gpu/libab.sh OLD_LIB NEW_LIB [ROUNDS]     (repository root, build/bin/detshare carried)
# prints one line per run and a median per build: eager p50/p99 ms, graph p50/p99 ms; board power and SM clock are
# logged every 100 ms to /tmp/libab-power.csv and summarised.
set -u
cd "$(dirname "$0")/../.."
old=${1:?usage: libab.sh OLD_LIB NEW_LIB [ROUNDS]} new=${2:?usage: libab.sh OLD_LIB NEW_LIB [ROUNDS]} rounds=${3:-3}
export PYTHONUNBUFFERED=1 DETSHARE_RUN_DIR=$(mktemp -d /tmp/detshare-ab.XXXX)
DS=$PWD/build/bin/detshare
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 100 >/tmp/libab-power.csv 2>&1 &
smi=$!
setsid "$DS" sched >/tmp/libab-sched.log 2>&1 &
sched=$!
trap 'kill $sched $smi 2>/dev/null' EXIT
for _ in $(seq 100); do "$DS" status --json >/dev/null 2>&1 && break; sleep 0.1; done
one() { # one LABEL CMD...
  local r
  r=$(timeout -k 5 120 "${@:2}" 2>/tmp/libab-err.txt | grep '^RESULT')
  [ -n "$r" ] || { echo "$1 FAILED: $(tail -3 /tmp/libab-err.txt)"; return; }
  # "RESULT eager p50=A p99=B ms graph p50=C p99=D ms" -> "eager_p50 A eager_p99 B graph_p50 C graph_p99 D"
  echo "$1 $(sed -E 's/^RESULT +eager p50=([0-9.]+) p99=([0-9.]+) ms +graph p50=([0-9.]+) p99=([0-9.]+) ms$/eager_p50 \1 eager_p99 \2 graph_p50 \3 graph_p99 \4/' <<<"$r")"
}
for r in $(seq "$rounds"); do
  order="old new"
  [ $((r % 2)) = 0 ] && order="new old" # alternate which build runs first: no order effect in the medians
  for build in $order; do
    lib=$old
    [ $build = new ] && lib=$new
    one "round $r $build" "$DS" run --lib "$lib" --tier best-effort --name "ab-$build-$r" -- python3 integration/gpu/probes/r50lat.py RESULT
  done
  one "round $r native" python3 integration/gpu/probes/r50lat.py RESULT
done | tee /tmp/libab.txt
echo "== medians of the rounds"
python3 - /tmp/libab.txt <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 11 or f[0] != "round":
        continue
    vals = dict(zip(f[3::2], map(float, f[4::2])))
    rows.setdefault(f[2], []).append(vals)
for build in ("old", "new", "native"):
    runs = rows.get(build, [])
    if runs:
        print(build, " ".join("%s %.4f" % (k, statistics.median(r[k] for r in runs)) for k in runs[0]), "(%d runs)" % len(runs))
PY
awk -F', ' '{gsub(/ W/, "", $2); gsub(/ MHz/, "", $3); if ($2 + 0 > p) p = $2 + 0; if (c == 0 || $3 + 0 < c) c = $3 + 0; n++}
  END {print "power/SM clock: " n " samples, max " p " W, min SM clock " c " MHz"}' /tmp/libab-power.csv
