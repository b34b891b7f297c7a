#!/usr/bin/env bash
# remainder.sh OUTDIR — driver facts for using the split's remainder (probes/remainder.cu), without and with MPS.
# No DetShare code. Needs nvcc and nvidia-cuda-mps-control. About 30 seconds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: remainder.sh OUTDIR}
mkdir -p "$out"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -O2 -arch=sm_${arch:-90} -o /tmp/remainder "$here/probes/remainder.cu" -lcuda 2>&1 | tail -20
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
echo "== no MPS"; timeout -k 5 60 /tmp/remainder 2>&1 | tee "$out/remainder-nomps.txt"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/rm-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rm-mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 20 nvidia-cuda-mps-control -d && sleep 1
echo "== MPS"; timeout -k 5 60 /tmp/remainder 2>&1 | tee "$out/remainder-mps.txt"
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 1
