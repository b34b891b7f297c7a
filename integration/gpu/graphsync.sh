#!/bin/bash
# graphsync.sh OUT TREE[:FLAGS[;FLAGS...]] ... — graphsync.py (does a synchronisation wait for a replayed CUDA
# graph?) natively, then under each TREE's libdetshare with that tree's real `detshare sched` (its own MPS daemon)
# and `detshare run` as a latency-critical tenant of 32 SMs, once per FLAGS set ("--pinned": static grant; "--lend":
# the dynamic policy, which changes the grant on every request). TREE is a source tree (a worktree or a
# `git archive` of a commit) holding dsbin/detshare (built on a machine with Go: go build -o TREE/dsbin/
# ./cmd/detshare); its library is built here with make. Logs and JSON results go to OUT. Example (repository root):
#   bash integration/gpu/graphsync.sh OUT .:--pinned;--lend old:
# GRAPHSYNC_BE=MODEL (e.g. lin8192-bf16) runs a best-effort worker.py trainer beside the LC in each case; GRAPHSYNC_N
# sets the number of requests (default 80); GRAPHSYNC_ARGS adds graphsync.py options (e.g. --no-events).
set -u -o pipefail
OUT=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
N=${GRAPHSYNC_N:-80}
mkdir -p "$OUT"
nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv -lms 100 >"$OUT/power.csv" 2>&1 &
PW=$!
trap 'kill $PW 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== native"
PYTHONUNBUFFERED=1 timeout 120 $PY "$HERE/graphsync.py" --n "$N" ${GRAPHSYNC_ARGS:-} --tag native --out "$OUT/native.json" \
    --dump "$OUT/graph.dot" >"$OUT/native.log" 2>&1
grep GRAPHSYNC "$OUT/native.log" || tail -20 "$OUT/native.log"
if [ -f "$OUT/graph.dot" ]; then
    echo "graph node types:"
    grep -o 'KERNEL\|MEMCPY\|MEMSET\|EVENT_RECORD\|WAIT_EVENT\|HOST\|MEM_ALLOC\|MEM_FREE\|EMPTY\|CHILD_GRAPH\|CONDITIONAL' \
        "$OUT/graph.dot" | sort | uniq -c
fi

i=0
for spec in "$@"; do
    tree=${spec%%:*}
    flagsets=${spec#*:}
    [ "$flagsets" = "$spec" ] && flagsets=""
    tree=$(cd "$tree" && pwd)
    rev=$(basename "$tree")
    echo "== build $rev"
    (cd "$tree" && make -s -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so) >"$OUT/build-$rev.log" 2>&1 ||
        { echo "build failed"; tail "$OUT/build-$rev.log"; continue; }
    IFS=';' read -r -a sets <<<"$flagsets"
    [ ${#sets[@]} -eq 0 ] && sets=("")
    for fl in "${sets[@]}"; do
        i=$((i + 1))
        tag="$rev${fl// /}"
        rd=$(mktemp -d /tmp/gs$i.XXXX)
        printf '[scheduler]\npolicy = "throughput-oriented"\n[mps]\nenable = true\ncontrol = "nvidia-cuda-mps-control"\n[metrics]\nlisten = ""\n' >"$rd/config.toml"
        DETSHARE_LOG_LEVEL=info setsid "$tree/dsbin/detshare" --run-dir "$rd" sched --config "$rd/config.toml" \
            >"$OUT/sched-$i.log" 2>&1 &
        sp=$!
        for _ in $(seq 100); do "$tree/dsbin/detshare" --run-dir "$rd" status --json >/dev/null 2>&1 && break; sleep 0.1; done
        bp=""
        if [ -n "${GRAPHSYNC_BE:-}" ]; then
            # a best-effort trainer beside the LC, so that the dynamic policy moves the LC's grant per request
            CUDA_MPS_PIPE_DIRECTORY="$rd/mps/gpu0/pipe" DETSHARE_RUN_DIR="$rd" PYTHONUNBUFFERED=1 \
                setsid timeout 150 "$tree/dsbin/detshare" --run-dir "$rd" run --name be --lib "$tree/build/lib/libdetshare.so" \
                --tier best-effort -- $PY "$HERE/worker.py" --role train --model "$GRAPHSYNC_BE" --duration 120 \
                --out "$OUT/be-$i.json" >"$OUT/be-$i.log" 2>&1 &
            bp=$!
            sleep "${GRAPHSYNC_BE_WARM:-20}"
            tag="$tag+$GRAPHSYNC_BE"
        fi
        echo "== $tag (run $i)"
        # shellcheck disable=SC2086
        CUDA_MPS_PIPE_DIRECTORY="$rd/mps/gpu0/pipe" DETSHARE_RUN_DIR="$rd" DETSHARE_LOG=debug PYTHONUNBUFFERED=1 \
            timeout 100 "$tree/dsbin/detshare" --run-dir "$rd" run --name lc --lib "$tree/build/lib/libdetshare.so" \
            --strict --tier latency-critical --sm 32 $fl -- \
            $PY "$HERE/graphsync.py" --n "$N" ${GRAPHSYNC_ARGS:-} --tag "$tag" --out "$OUT/run-$i.json" >"$OUT/run-$i.log" 2>&1
        echo "rc=$?"
        grep GRAPHSYNC "$OUT/run-$i.log" || tail -20 "$OUT/run-$i.log"
        grep -c "grant epoch" "$OUT/run-$i.log" | sed 's/^/grant epochs seen: /'
        grep -i "graph\|801\|unconfin\|could not" "$OUT/run-$i.log" | grep -v GRAPHSYNC | sort | uniq -c | sort -rn | head -8
        [ -n "$bp" ] && { kill -TERM -- -$bp 2>/dev/null; wait $bp 2>/dev/null; }
        kill -TERM -- -$sp 2>/dev/null
        wait $sp 2>/dev/null
        CUDA_MPS_PIPE_DIRECTORY="$rd/mps/gpu0/pipe" timeout 10 nvidia-cuda-mps-control <<<quit >/dev/null 2>&1
        sleep 1
    done
done
