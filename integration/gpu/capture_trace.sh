#!/usr/bin/env bash
# capture_trace.sh — which driver call breaks an application's stream capture under libdetshare. Builds a tracing
# stand-in for libcuda.so.1 (probes/capture_trace: one trampoline per entry point the library resolves, generated
# from ds_driver.h) and runs conformance cases through conformance.sh with DETSHARE_REAL_LIBCUDA pointing at it:
# while a capture runs, every driver call the library makes (and the application's calls it forwards) is logged with
# its thread and the capture's status before the call, so the first "CHANGED ... (invalidated)" line follows the
# call that invalidated the capture. Diagnostic only (x86-64).
#
# usage: bash integration/gpu/capture_trace.sh [OUTDIR]      (default build/capture-trace-<UTC time>)
# env:   CONF_CASES (default "c15_first_capture c14_graph_nodes_gpu"), CONF_MODES (default "passthrough confined"),
#        CONF_ALLOW_SIMGPU=1 with LD_LIBRARY_PATH=build/lib/simgpu to try it on the simulated GPU (a test double).
# Output: OUTDIR/trace/trace-<pid>.txt per process, OUTDIR/SUMMARY.txt (the first status change of each trace
# with the 12 calls before it).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/build/capture-trace-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out/trace" "$out/shim"
src=$repo/integration/gpu/probes/capture_trace
cc -std=c11 -D_GNU_SOURCE -I"$repo" -I"$repo/cgroupgpu/libdetshare/src" -o "$out/shim/names" "$src/names.c"
"$out/shim/names" >"$out/shim/names.txt"
bash "$src/gen.sh" "$out/shim/names.txt" "$out/shim"
# the real driver: what libcuda.so.1 resolves to for this process (the simulated GPU's when LD_LIBRARY_PATH says so)
cc -std=c11 -O1 -fPIC -shared -I"$out/shim" -o "$out/shim/libcudatrace.so" "$src/shim.c" "$out/shim/tramp.S" -ldl -lpthread
export DETSHARE_REAL_LIBCUDA=$out/shim/libcudatrace.so CAPTURE_TRACE_DIR=$out/trace
export CONF_CASES=${CONF_CASES:-"c15_first_capture c14_graph_nodes_gpu"}
export CONF_MODES=${CONF_MODES:-"passthrough confined"}
status=0
bash "$repo/integration/gpu/conformance.sh" "$out/conformance" >"$out/conformance.log" 2>&1 || status=$?
{
  grep -E "^\||^  - |^DIFF|^all " "$out/conformance.log" || true
  for f in "$out"/trace/trace-*.txt; do
    [ -s "$f" ] || continue
    echo "== $(basename "$f"): $(grep -c '^#' "$f") calls traced during captures"
    first=$(grep -n 'CHANGED' "$f" | head -1 | cut -d: -f1 || true)
    if [ -n "$first" ]; then
      sed -n "$((first > 12 ? first - 12 : 1)),${first}p" "$f"
    else
      echo "   (no status change during a capture)"
    fi
  done
} | tee "$out/SUMMARY.txt"
echo "capture_trace: conformance exit $status; traces in $out/trace" >&2
