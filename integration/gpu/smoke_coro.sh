#!/usr/bin/env bash
# Real-GPU smoke test of GPU coroutines with the real scheduler (issue: GPU coroutines).
#   bash integration/gpu/smoke_coro.sh        (from the repository root; build/ built on the dev machine and carried)
# 1. A latency-critical tenant (32 SMs) runs a compute-bound GEMM loop alone under DetShare, then beside a
#    best-effort training tenant that gets the remaining SMs; the same pair runs natively under plain MPS and
#    with time-slicing for comparison. Reported: A's median/p99 iteration time in each case.
# 2. Confinement: B's kernels must not slow A beyond noise; A's result must be bit-identical in every case.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
RUN=$(mktemp -d /tmp/detshare-run.XXXX)
export DETSHARE_RUN_DIR=$RUN
DS=$PWD/build/bin/detshare
cat > /tmp/lc.py <<'PY'
import torch, time, sys, hashlib, os
torch.manual_seed(0)
a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); w = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
def it():
    x = a
    for _ in range(8): x = (x @ w).tanh_()
    return x
for _ in range(10): it()
torch.cuda.synchronize()
ts = []
end = time.time() + float(sys.argv[2])
while time.time() < end:
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record(); x = it(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
ts.sort()
h = hashlib.sha256(it().cpu().numpy().tobytes()).hexdigest()[:16]
print(f"{sys.argv[1]:<28} n={len(ts)} median_ms={ts[len(ts)//2]:.3f} p99_ms={ts[int(len(ts)*0.99)]:.3f} hash={h}", flush=True)
PY
cat > /tmp/be.py <<'PY'
import torch, time, sys
m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.SGD(m.parameters(), lr=1e-4); x = torch.randn(1024, 4096, device="cuda")
end = time.time() + float(sys.argv[1]); n = 0; t = time.time()
while time.time() < end:
    opt.zero_grad(); m(x).square().mean().backward(); opt.step(); n += 1
torch.cuda.synchronize(); print(f"BE {sys.argv[2]} steps/s={n/(time.time()-t):.1f}", flush=True)
PY
D=5
T="timeout -k 5 60"
echo "== native, no MPS"
$T python3 /tmp/lc.py "A alone (native)" $D
$T python3 /tmp/be.py $((D+4)) "alone-native" & sleep 3; $T python3 /tmp/lc.py "A + B time-slicing" $D; wait
echo "== native, plain MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-plain/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-plain/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; timeout 20 nvidia-cuda-mps-control -d; sleep 1
$T python3 /tmp/lc.py "A alone (MPS)" $D
$T python3 /tmp/be.py $((D+4)) "beside-A-MPS" & sleep 3; $T python3 /tmp/lc.py "A + B plain MPS" $D; wait
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 2
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
echo "== DetShare (scheduler starts MPS)"
$DS --log-level info sched > $RUN/sched.log 2>&1 &
SCHED=$!
sleep 4
timeout 10 $DS status 2>&1 | head -20
$T $DS --log-level info run --tier latency-critical --sm 32 --name lc -- $T python3 /tmp/lc.py "A alone (DetShare 32 SMs)" $D
$T $DS --log-level info run --tier best-effort --name be -- $T python3 /tmp/be.py $((D+4)) "beside-A-DetShare" & sleep 3
timeout 10 $DS status 2>&1 | head -20
$T $DS --log-level info run --tier latency-critical --sm 32 --name lc2 -- $T python3 /tmp/lc.py "A + B DetShare" $D
timeout 10 $DS status 2>&1 | head -20
wait
# the same pair with the trainer under strict edges (an edge pair around each of its kernels: it submits slower)
DETSHARE_STRICT_STREAMS=1 $T $DS --log-level info run --tier best-effort --name be3 -- $T python3 /tmp/be.py $((D+4)) "beside-A-DetShare-strict-B" & sleep 3
$T $DS --log-level info run --tier latency-critical --sm 32 --name lc3 -- $T python3 /tmp/lc.py "A + B(strict) DetShare" $D
wait
kill $SCHED; sleep 2
echo "== scheduler log (tail)"; tail -30 $RUN/sched.log
