#!/usr/bin/env bash
# mpsdet.sh: does MPS itself make a workload's output vary from request to request? Runs mpsdet.py for each model of
# MODELS (default llama-step,bert) without MPS, then as the only client of a private MPS daemon, with each attention
# of SDPA (default "default math": PyTorch's choice and the textbook formula; also efficient, cudnn). No DetShare code.
#
#   bash integration/gpu/mpsdet.sh OUTDIR
#
# Needs a GPU, PyTorch and nvidia-cuda-mps-control. Output: OUTDIR/mpsdet.jsonl (one line per run).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start_script 8 "$@"
MODELS=${MODELS:-llama-step,bert}
REPS=${REPS:-300}
SDPA=${SDPA:-default math}
mkdir -p "$out"
private_mps
trap 'stop_mps; rm -rf "$mps"' EXIT
status=0
run() { timeout 240 "$PY" "$here/mpsdet.py" "$@" --reps "$REPS" | tee -a "$out/mpsdet.jsonl" || status=1; }
for m in ${MODELS//,/ }; do
  for sdpa in $SDPA; do
    CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps run --model "$m" --sdpa "$sdpa"
  done
done
start_mps mpsdet
for m in ${MODELS//,/ }; do
  for sdpa in $SDPA; do
    CUDA_MPS_PIPE_DIRECTORY=$mps/pipe run --model "$m" --sdpa "$sdpa"
  done
done
exit $status
