#!/usr/bin/env bash
# greenperf.sh OUTDIR — driver facts behind the GPU-coroutine design, measured without any DetShare code, with and
# without MPS, in one run: what eager launches and CUDA-graph replays cost on green-context streams, what per-kernel
# event edges cost against one edge per chain, and whether a graph's kernel nodes can be moved to another green
# context by setting their context (probes/greenperf.cu), and how a ResNet-50 graph replays from a green context
# (probes/greenperf_torch.py). Needs nvcc, PyTorch with torchvision, nvidia-cuda-mps-control. About 2 minutes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: greenperf.sh OUTDIR}
mkdir -p "$out"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -O2 -arch=sm_${arch:-90} -o /tmp/greenperf "$here/probes/greenperf.cu" -lcuda 2>&1 | tail -20
run() {
  echo "== $1"
  [ -x /tmp/greenperf ] && timeout -k 5 180 /tmp/greenperf 200 15 2>&1 | tee "$out/greenperf-$2.txt"
  timeout -k 5 240 python3 "$here/probes/greenperf_torch.py" --n 300 2>&1 | tee "$out/greenperf_torch-$2.txt"
}
run "no MPS" nomps
export CUDA_MPS_PIPE_DIRECTORY=/tmp/gp-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/gp-mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 20 nvidia-cuda-mps-control -d && sleep 1
run "MPS" mps
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 1
