#!/usr/bin/env bash
# run_all.sh — DetShare's real-GPU benchmark suite, one command: build, then run every configuration side by side.
#
#   integration/gpu/run_all.sh [--quick] [--suite infer,llm,train] [--no-bench] [--no-det] [--no-mem] [--no-rebind] OUTDIR
#
# Builds libdetshare (the C library) and needs build/bin/detshare: bench.py's library configurations run under the
# real `detshare sched` with workers started by `detshare run`. Go is not needed on the GPU machine when build/ is
# carried there after `make build` (without the binary and without Go the benchmark is refused at once). Then runs
#   bench.py        alone / alone-lib / time-slicing / MPS / MPS+percentage / DetShare (+ LLM and training pairs)
#   report.py       OUTDIR/bench/results.{md,json}, latency_cdf.{png,csv}
#   determinism.py  OUTDIR/det/determinism.{md,json}
#   memquota.py     OUTDIR/mem/memquota.{md,json}
#   rebind.py       OUTDIR/rebind/rebind.{md,json} (grant change -> kernels on the new SMs; nvcc or Triton)
# and writes OUTDIR/SUMMARY.md (date, GPU, driver, command, every table) ready to paste into BENCHMARKS.md.
# Budget: --quick about 5-6 minutes on an H100; without --quick the default suite is `infer` (about 7 minutes);
# run `--suite llm,train --no-det --no-mem` as a second invocation for the rest. Environment: PYTHON (default
# python3, needs torch with CUDA), DETSHARE_BENCH_ARGS (extra bench.py arguments, e.g. "--lc-groups 8").
# determinism.py, memquota.py and rebind.py set their grants themselves through the table fixture dstable.py.
set -euo pipefail

orig_args="$*"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
quick=0 suite="" bench=1 det=1 mem=1 reb=1 out=""
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --suite) suite="${2:?--suite needs a value (infer,llm,train)}"; shift ;;
    --suite=*) suite="${1#--suite=}" ;;
    --no-bench) bench=0 ;;
    --no-det) det=0 ;;
    --no-mem) mem=0 ;;
    --no-rebind) reb=0 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run_all.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "run_all.sh: one OUTDIR only (got $out and $1)" >&2; exit 2; }; out="$1" ;;
  esac
  shift
done
[ -n "$out" ] || { echo "run_all.sh: OUTDIR is required" >&2; usage >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
PY=${PYTHON:-python3}
log() { printf '[run_all %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# ---- build ------------------------------------------------------------------------------------------------------
cd "$repo"
log "building libdetshare (make build/lib/libdetshare.so)"
make build/lib/libdetshare.so >"$out/build.log" 2>&1 ||
  make -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so >>"$out/build.log" 2>&1 ||
  { log "building libdetshare failed, see $out/build.log"; tail -20 "$out/build.log" >&2; exit 1; }
lib="$repo/build/lib/libdetshare.so"
[ -f "$lib" ] || { log "$lib was not built"; exit 1; }
ds="$repo/build/bin/detshare"
if [ $bench = 1 ] && [ ! -x "$ds" ]; then
  # the scheduler is Go: build it here when Go is there, else it must have come with build/ (`make build` elsewhere)
  command -v go >/dev/null ||
    { log "$ds is missing and Go is not installed: run \`make build\` where Go is and carry build/ (or --no-bench)"; exit 1; }
  log "building detshare (make build)"
  make build >>"$out/build.log" 2>&1 || { log "make build failed, see $out/build.log"; tail -20 "$out/build.log" >&2; exit 1; }
fi

# ---- environment ------------------------------------------------------------------------------------------------
rc=0
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>"$out/torch.err" || rc=$?
if [ $rc = 3 ]; then
  log "$PY has PyTorch but torch.cuda.is_available() is False (a CPU-only build, or no GPU visible)"; exit 1
elif [ $rc != 0 ]; then
  log "$PY cannot import PyTorch ($(tail -1 "$out/torch.err")); set PYTHON to an interpreter with torch"; exit 1
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $0 $orig_args"
  echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (dirty)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: nvidia-smi failed"
  "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
  "$PY" -c 'import triton; print("triton:", triton.__version__)' 2>/dev/null || echo "triton: not installed"
  "$PY" -c 'import torchvision; print("torchvision:", torchvision.__version__)' 2>/dev/null || echo "torchvision: not installed (built-in ResNet-50)"
  command -v nvidia-cuda-mps-control >/dev/null && echo "mps: $(command -v nvidia-cuda-mps-control)" || echo "mps: nvidia-cuda-mps-control not found"
  "$PY" "$here/gpuinfo.py" | sed 's/^/driver view: /'
} >"$out/env.txt" 2>&1
cat "$out/env.txt" >&2

status=0
quickarg=()
[ $quick = 1 ] && quickarg=(--quick)
if [ -z "$suite" ]; then
  if [ $quick = 1 ]; then suite=infer,llm; else suite=infer; fi
fi

# ---- benchmark --------------------------------------------------------------------------------------------------
if [ $bench = 1 ]; then
  log "bench.py --suite $suite ${quickarg[*]:-}"
  # shellcheck disable=SC2086
  "$PY" "$here/bench.py" --out "$out/bench" --suite "$suite" --lib "$lib" --detshare "$ds" --python "$PY" "${quickarg[@]}" \
    ${DETSHARE_BENCH_ARGS:-} || { status=1; log "bench.py reported failed cases (see $out/bench/meta.json)"; }
  "$PY" "$here/report.py" "$out/bench" >/dev/null || status=1
fi
# ---- determinism ------------------------------------------------------------------------------------------------
if [ $det = 1 ]; then
  log "determinism.py"
  "$PY" "$here/determinism.py" "$out/det" --lib "$lib" --python "$PY" >/dev/null || { status=1; log "determinism: not bit-identical or failed"; }
fi
# ---- memory quota -----------------------------------------------------------------------------------------------
if [ $mem = 1 ]; then
  log "memquota.py"
  "$PY" "$here/memquota.py" "$out/mem" --lib "$lib" --python "$PY" >/dev/null || { status=1; log "memquota: a check failed"; }
fi

# ---- rebind delay -----------------------------------------------------------------------------------------------
if [ $reb = 1 ]; then
  # The compiled %smid probe without MPS: under MPS %smid numbers each green context's SMs from 0, so flips between
  # group sets cannot be told apart (seen on the H100). Triton's probe is the fallback where nvcc is missing.
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
  if command -v nvcc >/dev/null && nvcc -O2 -arch=sm_${arch:-90} -o "$out/smid_loop" "$here/probes/smid_loop.cu" >"$out/nvcc.log" 2>&1; then
    log "rebind.py (compiled probe, no MPS)"
    "$PY" "$here/rebind.py" "$out/rebind" --lib "$lib" --python "$PY" --no-mps --child-bin "$out/smid_loop" >/dev/null ||
      { status=1; log "rebind: not every flip was confined, or it failed (see $out/rebind)"; }
  elif "$PY" -c 'import triton' 2>/dev/null; then
    log "rebind.py (Triton probe)"
    "$PY" "$here/rebind.py" "$out/rebind" --lib "$lib" --python "$PY" --no-mps >/dev/null || { status=1; log "rebind: not every flip was confined, or it failed (see $out/rebind)"; }
  else
    log "rebind.py skipped: neither nvcc nor Triton is installed"
  fi
fi

# ---- summary ----------------------------------------------------------------------------------------------------
{
  echo "## Real-GPU run $(date -u +%Y-%m-%d)"
  echo
  echo '```'
  cat "$out/env.txt"
  echo '```'
  echo
  for f in "$out/bench/results.md" "$out/det/determinism.md" "$out/mem/memquota.md" "$out/rebind/rebind.md"; do
    [ -f "$f" ] && { cat "$f"; echo; }
  done
  [ -f "$out/bench/latency_cdf.png" ] && echo "Latency CDFs: bench/latency_cdf.png"
} >"$out/SUMMARY.md"
log "done (status $status): $out/SUMMARY.md"
exit $status
