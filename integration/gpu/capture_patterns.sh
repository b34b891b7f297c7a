#!/usr/bin/env bash
# capture_patterns.sh — issue 28's capture patterns on a real GPU, without and with MPS: the conformance cases that
# capture (c07 graph capture, c13 memsets / copies / host functions / events / fork-join / memory nodes / the
# per-thread default stream, c14 child-graph nodes and conditional nodes, c15 a capture as the process's first GPU
# work) through integration/gpu/conformance.sh, once with no MPS daemon and once as clients of a private MPS daemon
# (the memset capture was invalidated under the library in both). Before each, probes/capture_unsafe.c says which of
# the library's own setup calls invalidate a global-mode capture on this driver, in global and in relaxed mode. Each run compares every mode (native, passthrough, confined, rebinding, confined-dlsym) with the expected
# facts and with the native run.
#
# Then, where python3 has PyTorch, capture_torch.py (PyTorch's capture patterns, eager vs graph replay bit for bit:
# memsets with the issue's 0.5 GiB zeros, copies, a side stream, events), natively and as a best-effort tenant of
# groups 0-1 under the library (Python table writer dstable.py, as conformance.sh's confined mode), with PyTorch's
# caching allocator and with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (graph memory nodes), without and with
# MPS.
#
# usage: bash integration/gpu/capture_patterns.sh [OUTDIR]     (default build/capture-patterns-<UTC time>)
# env:   CONF_CASES, CONF_MODES as for conformance.sh; PYTHON (default python3). Needs gcc, make, python3,
#        nvidia-cuda-mps-control.
# Exit status 0 only when every run matches; OUTDIR/SUMMARY.txt has the tables and the PyTorch lines.
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/build/capture-patterns-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
export CONF_CASES=${CONF_CASES:-"c07_graph_capture c13_capture_patterns c14_graph_nodes_gpu c15_first_capture"}
command -v nvidia-cuda-mps-control >/dev/null || { echo "capture_patterns: nvidia-cuda-mps-control not found" >&2; exit 2; }

mps=$(mktemp -d)
export CUDA_MPS_LOG_DIRECTORY=$mps/log
mkdir -p "$mps/pipe" "$mps/log" "$mps/no-mps"
stop_mps() { CUDA_MPS_PIPE_DIRECTORY=$mps/pipe nvidia-cuda-mps-control <<<quit >/dev/null 2>&1; }
trap 'stop_mps; rm -rf "$mps"' EXIT

PY=${PYTHON:-python3}
have_torch=0
"$PY" -c "import torch" >/dev/null 2>&1 && have_torch=1

# torch_run TAG: capture_torch.py natively and as a confined tenant, with both allocators; a line per run
torch_run() {
  "$PY" - "$repo" "$out/torch-$1" <<'PYEOF'
import json, os, subprocess, sys
repo, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(repo, "integration", "gpu"))
import dstable  # noqa: E402
os.makedirs(out, exist_ok=True)
info = json.loads(subprocess.run([sys.executable, os.path.join(repo, "integration", "gpu", "gpuinfo.py")],
                                 capture_output=True, text=True, timeout=120).stdout or "{}")
groups = (info.get("split") or {}).get("groups")
script = os.path.join(repo, "integration", "gpu", "capture_torch.py")
lib = os.path.join(repo, "build", "lib", "libdetshare.so")
status = 0
for alloc in ("caching", "cudaMallocAsync"):
    for mode in ("native", "confined"):
        env = dict(os.environ)
        for k in ("LD_PRELOAD", "DETSHARE_QUOTA_FILE", "PYTORCH_CUDA_ALLOC_CONF"):
            env.pop(k, None)
        if alloc == "cudaMallocAsync":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
        table = hb = None
        if mode == "confined":
            if not groups or len(groups) < 4:
                print("torch %s %s: no usable SM split from the driver: %s" % (alloc, mode, info))
                status = 1
                continue
            table = dstable.Table.create(os.path.join(out, "run-" + alloc), info["sms"], groups=groups,
                                         gpu_name=info.get("name", "GPU"))
            q = table.register("capture-torch", tier="best-effort")
            table.publish_grant(q.slot, 0b11)
            env["LD_PRELOAD"] = lib
            env["DETSHARE_QUOTA_FILE"] = q.quota_file
            hb = dstable.Heartbeat(table)
            hb.start()
        try:
            p = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
        finally:
            if hb:
                hb.stop()
            if table:
                table.close()
        with open(os.path.join(out, "%s-%s.log" % (alloc, mode)), "w") as f:
            f.write(p.stdout + "\n--- stderr ---\n" + p.stderr)
        last = [l for l in p.stdout.splitlines() if l.startswith("CAPTURE_TORCH")] or ["CAPTURE_TORCH (none)"]
        bad = [l for l in p.stdout.splitlines() if l.startswith("pattern=") and " ok=no" in l]
        print("torch %s %s: exit %d %s%s" % (alloc, mode, p.returncode, last[-1],
                                            "".join("\n    " + b for b in bad)))
        status |= p.returncode != 0
sys.exit(1 if status else 0)
PYEOF
}

status=0
# probes/capture_unsafe.c: which of the library's own setup calls invalidate a global-mode capture on this driver,
# with the thread in global and in relaxed capture mode (informational: it does not change the exit status)
probe=$out/capture_unsafe
cc -std=c11 -O2 -D_GNU_SOURCE -I"$repo" -o "$probe" "$repo/integration/gpu/probes/capture_unsafe.c" -ldl ||
  { echo "capture_patterns: probes/capture_unsafe.c did not build" >&2; status=1; }
run_probe() { if [ -x "$probe" ]; then timeout 120 "$probe" >"$out/capture_unsafe-$1.txt" 2>&1; fi; }

# no MPS: a pipe directory without a daemon
CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps run_probe no-mps
CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps bash "$repo/integration/gpu/conformance.sh" "$out/no-mps" >"$out/no-mps.log" 2>&1 ||
  status=1
if [ $have_torch = 1 ]; then
  CUDA_MPS_PIPE_DIRECTORY=$mps/no-mps torch_run no-mps >"$out/torch-no-mps.log" 2>&1 || status=1
fi
CUDA_MPS_PIPE_DIRECTORY=$mps/pipe nvidia-cuda-mps-control -d || { echo "capture_patterns: MPS did not start" >&2; exit 1; }
CUDA_MPS_PIPE_DIRECTORY=$mps/pipe run_probe mps
CUDA_MPS_PIPE_DIRECTORY=$mps/pipe bash "$repo/integration/gpu/conformance.sh" "$out/mps" >"$out/mps.log" 2>&1 || status=1
if [ $have_torch = 1 ]; then
  CUDA_MPS_PIPE_DIRECTORY=$mps/pipe torch_run mps >"$out/torch-mps.log" 2>&1 || status=1
fi
stop_mps

for run in no-mps mps; do
  echo "== $run"
  grep -E "^\||^  - |^DIFF|^all |^note" "$out/$run.log"
  echo "-- capture_unsafe ($run): calls that invalidate a global-mode capture (status=2)"
  grep -E "status=2|fatal" "$out/capture_unsafe-$run.txt" 2>/dev/null || echo "   none"
  if [ $have_torch = 1 ]; then cat "$out/torch-$run.log"; else echo "(no PyTorch: capture_torch.py not run)"; fi
done | tee "$out/SUMMARY.txt"
echo "capture_patterns: exit $status; logs in $out" >&2
exit $status
