#!/usr/bin/env bash
# smtarget.sh: what does MPS's thread percentage do to a trainer's kernels, results and power? For each trainer of
# MODELS (default lin8192-bf16,lin8192-fp32) runs smtarget.py without MPS, then as the only client of a private MPS
# daemon at each CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of PCTS (default "100 80 67 50"; 100: plain MPS, the variable
# unset). With TARGETS=1 it also runs each with cuBLAS told the whole GPU (and, without MPS, PCT % of it). Each line
# has the first step's loss, the first module whose output was not finite, the losses' hash and whether they are
# finite. With OPS=1 it runs `smtarget.py --ops` instead at each of these (one bf16 Linear through each GEMM path,
# and under MPS also with DISABLE_ADDMM_CUDA_LT=1). Board power and SM clock every 100 ms beside it. No DetShare code.
#
#   bash integration/gpu/smtarget.sh OUTDIR
#
# Output: OUTDIR/smtarget.jsonl (one line per run, with its start and end times), OUTDIR/power.csv.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start_script 12 "$@"
MODELS=${MODELS:-lin8192-bf16,lin8192-fp32}
PCTS=${PCTS:-100 80 67 50}
DUR=${DUR:-6}
TARGETS=${TARGETS:-0}
OPS=${OPS:-0}
mkdir -p "$out"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 100 >"$out/power.csv" 2>/dev/null &
smi=$!
private_mps
trap 'stop_mps; kill $smi 2>/dev/null; rm -rf "$mps"' EXIT
status=0
run() {
  local t0 line
  t0=$(date +%s.%N)
  line=$(timeout 240 "$PY" "$here/smtarget.py" --duration "$DUR" "$@") || { status=1; echo "smtarget: $* failed" >&2; return; }
  echo "${line%\}}, \"t0\": $t0, \"t1\": $(date +%s.%N)}" | tee -a "$out/smtarget.jsonl"
}
if [ "$OPS" = 1 ]; then
  ops() { timeout 120 "$PY" "$here/smtarget.py" --ops "$@" | tee -a "$out/smtarget.jsonl" || status=1; }
  CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps ops --tag solo
  start_mps smtarget
  for p in $PCTS; do
    if [ "$p" = 100 ]; then
      CUDA_MPS_PIPE_DIRECTORY=$mps/pipe ops --tag mps
      continue
    fi
    CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$p ops --tag "mps$p"
    CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$p DISABLE_ADDMM_CUDA_LT=1 ops --tag "mps$p-no-addmm-lt"
  done
  exit $status
fi
full=$(CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps "$PY" -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)')
case "$full" in '' | *[!0-9]*) echo "smtarget: cannot read the GPU's SM count: $full" >&2; exit 1 ;; esac
for m in ${MODELS//,/ }; do
  CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps run --model "$m" --tag solo
  if [ "$TARGETS" = 1 ]; then
    for p in $PCTS; do
      CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps run --model "$m" --tag "solo-target-$p%" --sm-target $(( (full * p + 50) / 100 ))
    done
  fi
done
start_mps smtarget
for m in ${MODELS//,/ }; do
  for p in $PCTS; do
    if [ "$p" = 100 ]; then
      CUDA_MPS_PIPE_DIRECTORY=$mps/pipe run --model "$m" --tag mps
      continue
    fi
    CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$p run --model "$m" --tag "mps$p"
    [ "$TARGETS" = 1 ] && CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$p \
      run --model "$m" --tag "mps$p-target-full" --sm-target "$full"
  done
done
exit $status
