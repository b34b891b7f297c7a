#!/usr/bin/env bash
# Where does the library's cost on small-kernel inference come from? ResNet-50 batch 1, eager and CUDA graph,
# latency alone in four settings, side by side in one run:
#   native (no MPS) | native under MPS | libdetshare, best-effort tenant holding every group | latency-critical 64
#   and 32 SMs, each with the default lazy edges and with DETSHARE_STRICT_STREAMS=1 (an edge pair around every
#   kernel, the library's earlier behaviour)
#   bash integration/gpu/overhead.sh     (repository root, build/ carried)
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 DETSHARE_RUN_DIR=$(mktemp -d /tmp/detshare-ovh.XXXX)
DS=$PWD/build/bin/detshare
T="timeout -k 5 90"
R50="integration/gpu/probes/r50lat.py"
$T python3 $R50 "native, no MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/ovh-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/ovh-mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; timeout 20 nvidia-cuda-mps-control -d; sleep 1
$T python3 $R50 "native, plain MPS"
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 2; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
$DS sched > $DETSHARE_RUN_DIR/sched.log 2>&1 & SCHED=$!; sleep 4
$T $DS run --tier best-effort --name be -- python3 $R50 "DetShare, every group (all 132 SMs)"
$T $DS run --tier latency-critical --sm 64 --name lc64 -- python3 $R50 "DetShare, latency-critical 64 SMs"
DETSHARE_STRICT_STREAMS=1 $T $DS run --tier latency-critical --sm 64 --name lc64s -- python3 $R50 "DetShare, LC 64 SMs, strict edges"
$T $DS run --tier latency-critical --sm 32 --name lc32 -- python3 $R50 "DetShare, latency-critical 32 SMs"
DETSHARE_STRICT_STREAMS=1 $T $DS run --tier latency-critical --sm 32 --name lc32s -- python3 $R50 "DetShare, LC 32 SMs, strict edges"
kill $SCHED; wait 2>/dev/null
