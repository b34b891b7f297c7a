#!/usr/bin/env bash
# coro_checks.sh OUTDIR — the GPU-coroutine checks of issue 5 on a real GPU, in one run (about 6 minutes on an H100):
#   1. conformance.sh   CUDA stream semantics with and without the library (native, passthrough, confined, rebinding,
#                       dlsym), compared with the documented facts
#   2. determinism.py   50 deterministic training steps + a CUDA-graph decode: native, library, library with grant
#                       changes every 3 ms; losses, weights and tokens must be bit-identical
#   3. rebind.py        delay from a grant change to the first kernel on the new SMs (plain CUDA %smid probe,
#                       without MPS: under MPS %smid is numbered per green context)
#   4. overhead.sh      ResNet-50 batch 1, eager and CUDA graph: native, MPS, DetShare (every group, 64 and 32 SMs,
#                       lazy and strict edges)
# Needs nvcc, PyTorch + torchvision, nvidia-cuda-mps-control, and build/bin/detshare (built on a Go machine and
# carried) for overhead.sh. Logs and result files go to OUTDIR; OUTDIR/SUMMARY.txt has the tables.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: coro_checks.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1
log() { printf '[coro_checks %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/SUMMARY.txt" >&2; }
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
make -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so >"$out/build.log" 2>&1 ||
  { log "building libdetshare failed"; tail -20 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader >>"$out/SUMMARY.txt"
git rev-parse --short HEAD >>"$out/SUMMARY.txt" 2>/dev/null

log "1. conformance"
timeout -k 5 240 bash integration/gpu/conformance.sh "$out/conf" >"$out/conformance.log" 2>&1
log "conformance exit $?"
grep -E "^\|| - |^DIFF|^all " "$out/conformance.log" | head -40 >>"$out/SUMMARY.txt"

log "2. determinism"
timeout -k 5 200 python3 integration/gpu/determinism.py "$out/det" >"$out/determinism.log" 2>&1
log "determinism exit $?"
cat "$out/det/determinism.md" >>"$out/SUMMARY.txt" 2>/dev/null

log "3. rebind delay"
if nvcc -O2 -arch=sm_${arch:-90} -o /tmp/smid_loop integration/gpu/probes/smid_loop.cu >"$out/nvcc.log" 2>&1; then
  timeout -k 5 120 python3 integration/gpu/rebind.py --no-mps --child-bin /tmp/smid_loop --flips 40 "$out/rebind" \
    >"$out/rebind.log" 2>&1
  log "rebind exit $?"
  cat "$out/rebind/rebind.md" >>"$out/SUMMARY.txt" 2>/dev/null
else
  log "nvcc failed: see nvcc.log"
fi

log "4. overhead (ResNet-50 b1)"
if [ -x build/bin/detshare ]; then
  timeout -k 5 300 bash integration/gpu/overhead.sh >"$out/overhead.log" 2>&1
  log "overhead exit $?"
  grep -E "eager p50" "$out/overhead.log" >>"$out/SUMMARY.txt"
else
  log "build/bin/detshare missing: overhead.sh skipped (build it on a Go machine and carry build/bin)"
fi
cat "$out/SUMMARY.txt"
