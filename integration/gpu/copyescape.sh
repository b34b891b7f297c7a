#!/usr/bin/env bash
# copyescape.sh — do device-to-device copies and memsets stay inside a green context's SMs, and can a captured
# graph's memset and memcpy nodes be moved to another green context (probes/copyescape.cu)? No DetShare code;
# without and with MPS. About 30 seconds.
#   bash integration/gpu/copyescape.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -O2 -arch=sm_${arch:-90} -o /tmp/copyescape "$here/probes/copyescape.cu" -lcuda 2>&1 | tail -20
echo "== no MPS"
timeout -k 5 60 /tmp/copyescape
export CUDA_MPS_PIPE_DIRECTORY=/tmp/ce-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/ce-mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 20 nvidia-cuda-mps-control -d && sleep 1
echo "== MPS"
timeout -k 5 60 /tmp/copyescape
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 1
