#!/usr/bin/env bash
# capture_patterns.sh — issue 28's capture patterns on a real GPU, without and with MPS: the conformance cases that
# capture (c07 graph capture, c13 memsets / copies / host functions / events / fork-join / memory nodes, c14 a capture
# as the first GPU work, child-graph nodes, conditional nodes) through integration/gpu/conformance.sh, once with no
# MPS daemon and once as clients of a private MPS daemon (the memset capture was invalidated under the library in
# both). Each run compares every mode (native, passthrough, confined, rebinding, confined-dlsym) with the expected
# facts and with the native run.
#
# usage: bash integration/gpu/capture_patterns.sh [OUTDIR]     (default build/capture-patterns-<UTC time>)
# env:   CONF_CASES, CONF_MODES as for conformance.sh. Needs gcc, make, python3, nvidia-cuda-mps-control.
# Exit status 0 only when both runs match everywhere; OUTDIR/SUMMARY.txt has both tables.
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/build/capture-patterns-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
export CONF_CASES=${CONF_CASES:-"c07_graph_capture c13_capture_patterns c14_graph_nodes_gpu"}
command -v nvidia-cuda-mps-control >/dev/null || { echo "capture_patterns: nvidia-cuda-mps-control not found" >&2; exit 2; }

mps=$(mktemp -d)
export CUDA_MPS_LOG_DIRECTORY=$mps/log
mkdir -p "$mps/pipe" "$mps/log" "$mps/no-mps"
stop_mps() { CUDA_MPS_PIPE_DIRECTORY=$mps/pipe nvidia-cuda-mps-control <<<quit >/dev/null 2>&1; }
trap 'stop_mps; rm -rf "$mps"' EXIT

status=0
# no MPS: a pipe directory without a daemon
CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps bash "$repo/integration/gpu/conformance.sh" "$out/no-mps" >"$out/no-mps.log" 2>&1 ||
  status=1
CUDA_MPS_PIPE_DIRECTORY=$mps/pipe nvidia-cuda-mps-control -d || { echo "capture_patterns: MPS did not start" >&2; exit 1; }
CUDA_MPS_PIPE_DIRECTORY=$mps/pipe bash "$repo/integration/gpu/conformance.sh" "$out/mps" >"$out/mps.log" 2>&1 || status=1
stop_mps

for run in no-mps mps; do
  echo "== $run"
  grep -E "^\||^  - |^DIFF|^all |^note" "$out/$run.log"
done | tee "$out/SUMMARY.txt"
echo "capture_patterns: exit $status; logs in $out" >&2
exit $status
