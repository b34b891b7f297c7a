#!/usr/bin/env bash
# Real-GPU smoke test of libdetshare's memory quota under unmodified PyTorch (issue: libdetshare).
# Usage (on the GPU machine, from the repository root, with build/ built on the dev machine and carried):
#   bash integration/gpu/smoke_quota.sh
# Registration uses the simulated GPU's description only to size the table (NVML discovery may be absent in this
# build); CUDA itself is the real driver: LD_LIBRARY_PATH does not point at build/lib/simgpu.
set -u
cd "$(dirname "$0")/../.."
export DETSHARE_RUN_DIR=$(mktemp -d /tmp/detshare-run.XXXX) CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1
export DETSHARE_SIMGPU=1 DETSHARE_SIMGPU_SMS=132 DETSHARE_SIMGPU_MEM=$((80*1024*1024*1024))
DS=build/bin/detshare
py=python3
echo "== quota view and OOM under detshare run --memory 8Gi"
$DS run --memory 8Gi --name q8 -- $py - <<'PY'
import torch, time, subprocess, os
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info free={free/2**30:.2f}GiB total={total/2**30:.2f}GiB")
x = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
try:
    y = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    print("NO OOM: quota not enforced")
except torch.cuda.OutOfMemoryError as e:
    print("OutOfMemoryError raised past the quota: OK")
# second process of the same tenant sees the shared budget
out = subprocess.run([os.environ.get("DS_BIN","build/bin/detshare"), "run", "--join", "q8", "--", "python3", "-c",
    "import torch;f,t=torch.cuda.mem_get_info();print(f'joined process free={f/2**30:.2f}GiB total={t/2**30:.2f}GiB')"],
    capture_output=True, text=True)
print(out.stdout.strip(), out.stderr.strip()[-500:])
smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader"], capture_output=True, text=True)
print("nvidia-smi under the library:", smi.stdout.strip(), smi.stderr.strip()[-300:])
PY
echo "== cuBLAS / cuDNN / Triton under the library"
cat > /tmp/ops.py <<'PY'
import torch, torch.nn.functional as F
a = torch.randn(4096, 4096, device="cuda"); b = a @ a; torch.cuda.synchronize(); print("cublas ok", float(b.float().abs().sum()) > 0)
x = torch.randn(8, 3, 224, 224, device="cuda"); w = torch.randn(64, 3, 7, 7, device="cuda"); y = F.conv2d(x, w); print("cudnn ok", tuple(y.shape))
import triton, triton.language as tl
@triton.jit
def add(x, y, o, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B); m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)
n = 1 << 20; p = torch.randn(n, device="cuda"); q = torch.randn(n, device="cuda"); o = torch.empty_like(p)
add[(n // 1024,)](p, q, o, n, B=1024); torch.cuda.synchronize(); print("triton ok", bool(torch.allclose(o, p + q)))
PY
$DS run --memory 16Gi --name ops -- $py /tmp/ops.py
echo "== training step time: native vs under the library (same script, alternating, 3 rounds)"
cat > /tmp/step.py <<'PY'
import torch, time, sys
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x = torch.randn(512, 4096, device="cuda")
def step():
    opt.zero_grad(set_to_none=True); m(x).square().mean().backward(); opt.step()
for _ in range(20): step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(200): step()
torch.cuda.synchronize(); print(f"{sys.argv[1]} step_ms={(time.perf_counter()-t)/200*1e3:.4f}")
PY
for r in 1 2 3; do
  $py /tmp/step.py native
  $DS run --memory 40Gi --name step$r -- $py /tmp/step.py detshare
done
