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
cat > /tmp/r50.py <<'PY'
import torch, torchvision, time, sys
torch.backends.cudnn.benchmark = False
m = torchvision.models.resnet50().cuda().eval(); x = torch.randn(1, 3, 224, 224, device="cuda")
def lat(f, n=300):
    for _ in range(20): f()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t) * 1e3)
    ts.sort(); return ts[n // 2], ts[int(n * 0.99)]
with torch.no_grad():
    e50, e99 = lat(lambda: m(x))
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): m(x)
    torch.cuda.current_stream().wait_stream(s); g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): y = m(x)
    g50, g99 = lat(g.replay)
print(f"{sys.argv[1]:<34} eager p50={e50:.3f} p99={e99:.3f} ms   graph p50={g50:.3f} p99={g99:.3f} ms", flush=True)
PY
$T python3 /tmp/r50.py "native, no MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/ovh-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/ovh-mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; timeout 20 nvidia-cuda-mps-control -d; sleep 1
$T python3 /tmp/r50.py "native, plain MPS"
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 2; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
$DS sched > $DETSHARE_RUN_DIR/sched.log 2>&1 & SCHED=$!; sleep 4
$T $DS run --tier best-effort --name be -- python3 /tmp/r50.py "DetShare, every group (120 SMs)"
$T $DS run --tier latency-critical --sm 64 --name lc64 -- python3 /tmp/r50.py "DetShare, latency-critical 64 SMs"
DETSHARE_STRICT_STREAMS=1 $T $DS run --tier latency-critical --sm 64 --name lc64s -- python3 /tmp/r50.py "DetShare, LC 64 SMs, strict edges"
$T $DS run --tier latency-critical --sm 32 --name lc32 -- python3 /tmp/r50.py "DetShare, latency-critical 32 SMs"
DETSHARE_STRICT_STREAMS=1 $T $DS run --tier latency-critical --sm 32 --name lc32s -- python3 /tmp/r50.py "DetShare, LC 32 SMs, strict edges"
kill $SCHED; wait 2>/dev/null
