#!/usr/bin/env bash
# container.sh — an unmodified CUDA program in containers started through DetShare's runtime path on a REAL GPU
# (issue 25), with nothing mounted by hand: detshare-runtime (the runc wrapper Docker runs) registers the tenant,
# adds the OCI hook that mounts libdetshare and the quota, and gives the container the GPU it was placed on through
# the CDI edit (`detshare cdi spec`: device nodes, the driver's libraries and tools, the loader-cache hook).
#
# usage: integration/gpu/container.sh OUTDIR
# needs: build/bin/{detshare,detshare-runtime,detshare-hook} and build/lib/libdetshare.so (make build, carried),
#        a runc (RUNC=path; default .carry/runc, a static runc built on the dev machine), a static busybox
#        (BUSYBOX=path; default .carry/busybox), nvcc, and MPS (nvidia-cuda-mps-control).
# Runs four containers from one rootfs (busybox + probes/ctrgpu.cu built here + the shared libraries it and
# libdetshare need, as any glibc image has them):
#   ds-pinned   DETSHARE_TIER=latency-critical DETSHARE_SMS=32 DETSHARE_PINNED=true DETSHARE_MEMORY=2Gi
#               (must see one GPU, compute right, run on <= 32 SMs, be refused past 2 GiB)
#   ds-be       DETSHARE_TIER=best-effort DETSHARE_MEMORY=3Gi (the whole GPU when alone; refused past 3 GiB)
#   plain       the same program through detshare-runtime without any DetShare key (runs as under runc: no GPU)
#   misspelt    a misspelt tier key, TEIR for TIER (refused at create, the key named)
# Board power and SM clock are logged every 100 ms (OUTDIR/power.csv). Exit status 0 only when every check holds.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: container.sh OUTDIR}
mkdir -p "$out"
RUNC=${RUNC:-$repo/.carry/runc}
BUSYBOX=${BUSYBOX:-$repo/.carry/busybox}
for f in "$repo/build/bin/detshare" "$repo/build/bin/detshare-runtime" "$repo/build/bin/detshare-hook" \
  "$repo/build/lib/libdetshare.so" "$RUNC" "$BUSYBOX"; do
  [ -e "$f" ] || { echo "container.sh: $f missing" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/detshare-ctr.XXXXXX)
export DETSHARE_RUN_DIR="$tmp/run" DETSHARE_RUNC="$RUNC" DETSHARE_LOG_LEVEL=info
mkdir -p "$DETSHARE_RUN_DIR"
fails=0
check() { # check NAME CONDITION-EXIT-STATUS MESSAGE
  if [ "$2" = 0 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 100 >"$out/power.csv" 2>&1 &
smi_pid=$!
sched_pid=""
cleanup() {
  [ -n "$sched_pid" ] && kill "$sched_pid" 2>/dev/null
  kill "$smi_pid" 2>/dev/null
  for id in ds-pinned ds-be plain misspelt diag; do "$RUNC" --root "$tmp/runc" delete -f "$id" >/dev/null 2>&1; done
  sleep 1
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== host: $(nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader)"
echo "== the CDI edit DetShare generates for GPU 0 (no nvidia-ctk here)"
"$repo/build/bin/detshare" cdi spec --gpu 0 >"$out/cdi-spec.yaml" 2>"$out/cdi-spec.err"
check cdi-spec $? "detshare cdi spec --gpu 0 (OUTDIR/cdi-spec.yaml)"
grep -E 'path: /dev/|hostPath: .*lib(cuda|nvidia-ml)\.so|ldcache' "$out/cdi-spec.yaml" | sed 's/^/   /' | head -20

echo "== build the CUDA program (nvcc; the program knows nothing of DetShare)"
nvcc -O2 -arch=sm_90 -o "$tmp/ctrgpu" "$here/probes/ctrgpu.cu" >"$out/nvcc.log" 2>&1
check nvcc $? "nvcc probes/ctrgpu.cu"
"$tmp/ctrgpu" 8192 >"$out/native.txt" 2>&1
echo "   native (no container): $(tr '\n' ';' <"$out/native.txt")"

echo "== rootfs: busybox + ctrgpu + its shared libraries (no driver library, no /dev/nvidia*)"
root="$tmp/rootfs"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc/ld.so.conf.d}
cp "$BUSYBOX" "$root/bin/busybox"
for t in sh ls cat echo grep tr sed; do ln -s busybox "$root/bin/$t"; done
cp "$tmp/ctrgpu" "$root/bin/ctrgpu"
echo 'include /etc/ld.so.conf.d/*.conf' >"$root/etc/ld.so.conf"
smi=$(command -v nvidia-smi)
smi_real=$(readlink -f "$(dirname "$(readlink -f "$smi")")/nvidia-smi")
[ -x /usr/local/nvidia/bin/nvidia-smi ] && smi_real=/usr/local/nvidia/bin/nvidia-smi
for l in $(ldd "$tmp/ctrgpu" "$repo/build/lib/libdetshare.so" "$smi_real" | grep -v ':$' | grep -o '/[^ :]*' | grep -v nvidia); do
  mkdir -p "$root$(dirname "$l")"
  cp -L "$l" "$root$l"
done
ls -la "$root/dev" | sed 's/^/   /'

bundle() { # bundle ID ENV... : a bundle whose process runs ctrgpu after listing its GPU devices and nvidia-smi -L
  local id=$1
  shift
  local b="$tmp/b-$id"
  mkdir -p "$b"
  cp -a "$root" "$b/rootfs" # each container its own copy: no mount target left by another
  (cd "$b" && "$RUNC" spec)
  python3 - "$b/config.json" "$b/rootfs" "$@" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["process"]["terminal"] = False
c["process"]["args"] = ["/bin/sh", "-c",
    "echo devices: $(ls /dev | grep -E '^nvidia' | tr '\\n' ' '); "
    "if [ -n \"$DIAG\" ]; then ls -la /usr/local/nvidia/lib64 /lib/libcuda* /usr/lib/x86_64-linux-gnu/libcuda* /etc/ld.so.conf.d 1>&2;"
    " cat /etc/ld.so.conf.d/* 1>&2; ls -la /etc/ld.so.cache 1>&2; cat /proc/self/mounts | grep -E 'nvidia|cuda' 1>&2; fi; "
    "(nvidia-smi -L 2>&1 || echo 'nvidia-smi: none') | sed 's/^/nvidia-smi: /'; exec /bin/ctrgpu 8192"]
c["process"]["env"] += sys.argv[3:]
c["root"] = {"path": sys.argv[2], "readonly": False}
json.dump(c, open(p, "w"), indent=1)
PY
}
run_ctr() { # run_ctr ID : through the runc wrapper, as Docker would call it
  local id=$1
  (cd "$tmp/b-$id" && timeout 120 "$repo/build/bin/detshare-runtime" --root "$tmp/runc" run --bundle "$tmp/b-$id" "$id") \
    >"$out/$id.txt" 2>"$out/$id.err"
  local rc=$?
  echo "   $id exit $rc: $(tr '\n' ';' <"$out/$id.txt" | cut -c1-600)"
  [ -s "$out/$id.err" ] && echo "   $id stderr: $(tail -5 "$out/$id.err" | tr '\n' ';' | cut -c1-600)"
  return $rc
}

echo "== scheduler (MPS, private run directory $DETSHARE_RUN_DIR)"
setsid "$repo/build/bin/detshare" sched >"$out/sched.log" 2>&1 &
sched_pid=$!
for _ in $(seq 100); do "$repo/build/bin/detshare" status --json >/dev/null 2>&1 && break; sleep 0.1; done
"$repo/build/bin/detshare" status >"$out/status-before.txt" 2>&1
check sched $? "detshare sched answers (OUTDIR/status-before.txt)"

echo "== ds-pinned: latency-critical, 32 SMs pinned, 2 GiB"
bundle ds-pinned DETSHARE_TIER=latency-critical DETSHARE_SMS=32 DETSHARE_PINNED=true DETSHARE_MEMORY=2Gi
run_ctr ds-pinned
check ds-pinned-exit $? "exit 0"
f="$out/ds-pinned.txt"
grep -q '^devices [1-9]' "$f" && [ "$(grep -c '^device [0-9]' "$f")" = 1 ]
check ds-pinned-one-gpu $? "CUDA sees exactly one GPU"
grep -q 'GPU 0:' "$f" && ! grep -q 'GPU 1:' "$f"
check ds-pinned-smi $? "nvidia-smi inside lists one GPU"
grep -q '^compute ok' "$f"
check ds-pinned-compute $? "saxpy result correct"
sms=$(awk '/^distinct_sms/ {print $2}' "$f")
[ -n "$sms" ] && [ "$sms" -le 32 ]
check ds-pinned-sms $? "blocks ran on $sms distinct SMs (<= 32 granted)"
mib=$(awk '/^allocated_mib/ {print $2}' "$f")
[ -n "$mib" ] && [ "$mib" -lt 2048 ] && grep -q 'refused cudaErrorMemoryAllocation' "$f"
check ds-pinned-quota $? "allocation refused at $mib MiB of 8192 asked (quota 2 GiB)"
grep -q 'meminfo_total_mib 2048' "$f"
check ds-pinned-meminfo $? "cudaMemGetInfo total is the 2 GiB quota"

if [ $fails != 0 ]; then
  echo "== diag: the same container with LD_DEBUG=libs and libdetshare's debug log (stderr in OUTDIR/diag.err)"
  bundle diag DETSHARE_TIER=best-effort DIAG=1 LD_DEBUG=libs DETSHARE_LOG=debug
  run_ctr diag
fi

echo "== ds-be: best-effort, 3 GiB, alone on the GPU"
bundle ds-be DETSHARE_TIER=best-effort DETSHARE_MEMORY=3Gi
run_ctr ds-be
check ds-be-exit $? "exit 0"
f="$out/ds-be.txt"
grep -q '^compute ok' "$f"
check ds-be-compute $? "saxpy result correct"
sms=$(awk '/^distinct_sms/ {print $2}' "$f")
[ -n "$sms" ] && [ "$sms" -gt 32 ]
check ds-be-sms $? "blocks ran on $sms distinct SMs (alone: more than one 32-SM grant)"
mib=$(awk '/^allocated_mib/ {print $2}' "$f")
[ -n "$mib" ] && [ "$mib" -lt 3072 ] && [ "$mib" -ge 2048 ]
check ds-be-quota $? "allocation refused at $mib MiB (quota 3 GiB)"

echo "== plain: no DetShare key through the same runtime: runs as under runc, no GPU given"
bundle plain
run_ctr plain
grep -q '^devices: *$' "$out/plain.txt" && grep -q '^devices 0' "$out/plain.txt"
check plain-no-gpu $? "no /dev/nvidia* and CUDA finds no device"

typo_key=DETSHARE_TEIR # misspelt on purpose
echo "== misspelt: $typo_key refused at create"
bundle misspelt "$typo_key=best-effort"
run_ctr misspelt
rc=$?
[ $rc != 0 ] && grep -q "$typo_key" "$out/misspelt.err" && ! grep -q '^devices' "$out/misspelt.txt"
check misspelt-refused $? "refused (exit $rc), key named, program never ran"

"$repo/build/bin/detshare" status >"$out/status-after.txt" 2>&1
grep -c . "$out/power.csv" >/dev/null && echo "== power/SM clock samples: $(grep -c . "$out/power.csv"), max power $(awk -F', ' '{gsub(/ W/,"",$2); if ($2+0>m) m=$2+0} END {print m}' "$out/power.csv") W"
echo "== $fails check(s) failed"
[ $fails = 0 ]
