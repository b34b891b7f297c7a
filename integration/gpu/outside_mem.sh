#!/usr/bin/env bash
# outside_mem.sh OUTDIR — issue 27 on a real GPU with the real scheduler (MPS on; the GPU's compute mode is never
# changed): memory a tenant's processes take past libdetshare shows in `detshare status`, `status --json`, and the
# metrics (detshare_tenant_memory_gpu_bytes, detshare_tenant_memory_outside_bytes). One `detshare run --memory 4Gi`
# tenant; its processes are libdetshare's probe (build/tests/ds_probe_rt, the real libcuda.so.1 through dlopen):
#   A. an honest process holds 1 GiB through the library: status shows it used, and what NVML reports beyond it
#      (the driver's own memory per context) is the baseline "outside" figure, recorded in summary.txt
#   B. a second process of the tenant (library loaded, its client page mapped) holds 2 GiB with cuMemAlloc_v2
#      resolved past the library (rawalloc): "outside" grows by about 2 GiB, the library's figure does not
#   C. a third process, a child of the tenant's `detshare run` started without the library (LD_PRELOAD emptied), holds
#      1 GiB: "outside" grows by about 1 GiB more; the status text says "OUTSIDE the library"; the metrics agree
#   D. a fourth process takes 3 GiB past the library (3.5 GiB on the simulated GPU, which has no context memory),
#      under the per-process limit MPS enforces (the quota: on the H100 3.5 GiB was refused by the driver itself): the tenant now holds more than its 4 GiB
#      quota plus 768 MiB of context memory per process, and the scheduler kills its largest process (D) within a few reaper rounds
#      (tenants.memory_outside = kill, the default), logging it; A, B and C keep running
# Before issue 27's item 2 status showed 1.0G used and nothing else. OUTDIR/summary.txt has one line per check, "ok"
# or "FAIL", and the measured figures; OUTDIR/status-*.json the snapshots; nvidia-smi's per-process view beside them.
#   bash integration/gpu/outside_mem.sh /tmp/om     (repository root; build/ built on a Go machine and carried)
# OM_SIM=1 runs the same on the simulated GPU and its NVML double (test doubles), to check the script without a GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh" # probe_script, check, rc
probe_script outside_mem.sh "${1:-}"
RUN=$(mktemp -d /tmp/detshare-om.XXXX)
export DETSHARE_RUN_DIR=$RUN
PORT=${OM_METRICS_PORT:-19464}
# D's size: under the per-process limit the driver enforces under MPS (the quota), over the tenant's quota plus
# allowance in sum. A real GPU adds ~516 MiB of context memory per process to NVML's figures (check A measures it),
# the simulated GPU none, so there D takes 3.5 GiB to make the same sum.
D_BYTES=3221225472 D_SIZE="3 GiB"
if [ "${OM_SIM:-0}" = 1 ]; then
  export DETSHARE_SIMGPU=1 DETSHARE_SIMGPU_STATE=$RUN/simgpu-state LD_LIBRARY_PATH=$repo/build/lib/simgpu
  D_BYTES=3758096384 D_SIZE="3.5 GiB"
fi
: >"$out/summary.txt"
log() { printf '[outside_mem %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/outside_mem.log" >&2; }
figure() { printf '     %s\n' "$*" | tee -a "$out/summary.txt"; }
MIB=1048576
# field SNAPSHOT KEY: the tenant om's KEY in a status --json snapshot
field() {
  python3 -c 'import json,sys
s=json.load(open(sys.argv[1]))
t=[t for t in s.get("tenants") or [] if t["id"]=="om"]
print(t[0].get(sys.argv[2], "") if t else "")' "$out/status-$1.json" "$2" | sed 's/True/true/;s/False/false/'
}
mib() { echo $(($1 / MIB)); }
snap() { # snap NAME: status --json and text, and nvidia-smi's processes
  "$DS" status --json >"$out/status-$1.json" 2>>"$out/status.err"
  "$DS" status >"$out/status-$1.txt" 2>>"$out/status.err"
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >"$out/smi-$1.txt" 2>&1
  return 0
}
wait_for() { # wait_for FILE WORD
  for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

printf '[metrics]\nlisten = "127.0.0.1:%s"\n' "$PORT" >"$RUN/config.toml"
$DS --log-level info sched --config "$RUN/config.toml" --stop-mps-on-exit >"$out/sched.log" 2>&1 &
SCHED=$!
OWNER= HON= BYP=
cleanup() {
  exec 7>&- 8>&- 9>&- 2>/dev/null
  for p in $HON $BYP $OWNER; do kill "$p" 2>/dev/null; done
  kill $SCHED 2>/dev/null
  wait 2>/dev/null
  rm -rf "$RUN"
}
trap cleanup EXIT
sleep 3
mkfifo "$RUN/owner.in" "$RUN/hon.in" "$RUN/byp.in" "$RUN/d.in"
# The tenant lives as long as its owner's command: a shell that, on "go", starts C's process without the library.
$DS run --memory 4Gi --name om -- sh -c "read go; LD_PRELOAD= exec $PROBE init alloc:1073741824 hold" \
  <"$RUN/owner.in" >"$out/C.out" 2>&1 &
OWNER=$!
exec 7>"$RUN/owner.in"
for _ in $(seq 50); do [ -e "$RUN/clients/om.page" ] && break; sleep 0.1; done
[ -e "$RUN/clients/om.page" ] || { log "tenant om did not register"; cat "$out/C.out"; exit 1; }

log "A. honest process, 1 GiB through the library"
timeout -k 5 300 "$DS" run --join om -- "$PROBE" init alloc:1073741824 hold <"$RUN/hon.in" >"$out/A.out" 2>&1 &
HON=$!
exec 8>"$RUN/hon.in"
wait_for "$out/A.out" holding
check "A 1 GiB through the library" 0 "$(rc A alloc:1073741824)"
sleep 1
snap A
check "A status read NVML's per-process memory" true "$(field A memory_gpu_known)"
check "A used (the library's figure), MiB" 1024 "$(mib "$(field A memory_used_bytes)")"
A_GPU=$(field A memory_gpu_bytes)
A_OUT=$(field A memory_outside_bytes)
figure "A NVML for the tenant's processes $(mib "${A_GPU:-0}") MiB, outside the library $(mib "${A_OUT:-0}") MiB" \
  "(driver memory of one context)"

log "B. a process of the tenant takes 2 GiB past the library (rawalloc)"
timeout -k 5 300 "$DS" run --join om -- "$PROBE" init rawalloc:2147483648 hold <"$RUN/byp.in" >"$out/B.out" 2>&1 &
BYP=$!
exec 9>"$RUN/byp.in"
wait_for "$out/B.out" holding
check "B 2 GiB past the library" 0 "$(rc B rawalloc:2147483648)"
sleep 1
snap B
B_OUT=$(field B memory_outside_bytes)
check "B used unchanged, MiB" 1024 "$(mib "$(field B memory_used_bytes)")"
D=$(( (${B_OUT:-0} - ${A_OUT:-0}) / MIB ))
figure "B outside the library $(mib "${B_OUT:-0}") MiB (+$D MiB)"
check "B outside grew by at least 2048 MiB" yes "$([ "$D" -ge 2048 ] && echo yes || echo "no (+$D MiB)")"

log "C. a child of detshare run without the library takes 1 GiB"
echo go >&7
wait_for "$out/C.out" holding
check "C 1 GiB without the library" 0 "$(rc C alloc:1073741824)"
sleep 1
snap C
C_OUT=$(field C memory_outside_bytes)
D=$(( (${C_OUT:-0} - ${B_OUT:-0}) / MIB ))
figure "C outside the library $(mib "${C_OUT:-0}") MiB (+$D MiB); NVML for the tenant $(mib "$(field C memory_gpu_bytes)") MiB"
check "C outside grew by at least 1024 MiB" yes "$([ "$D" -ge 1024 ] && echo yes || echo "no (+$D MiB)")"
check "C status text flags it" 1 "$(grep -c '^  om .*OUTSIDE the library' "$out/status-C.txt")"
if command -v curl >/dev/null; then
  curl -s "http://127.0.0.1:$PORT/metrics" >"$out/metrics-C.txt"
  M=$(sed -n 's/^detshare_tenant_memory_outside_bytes{tenant="om".*} \([0-9.e+]*\)$/\1/p' "$out/metrics-C.txt")
  figure "C metrics detshare_tenant_memory_outside_bytes: ${M:-absent}"
  check "C metrics export the outside figure" yes "$([ -n "$M" ] && echo yes || echo no)"
fi
cat "$out/status-C.txt" >>"$out/outside_mem.log"

log "D. a fourth process takes $D_SIZE past the library: the tenant is past its quota plus 768 MiB per process"
timeout -k 5 60 "$DS" run --join om -- "$PROBE" init rawalloc:$D_BYTES hold <"$RUN/d.in" >"$out/D.out" 2>&1 &
DPID=$!
exec 6>"$RUN/d.in"
wait_for "$out/D.out" holding
check "D $D_SIZE past the library" 0 "$(rc D rawalloc:$D_BYTES)"
for _ in $(seq 50); do kill -0 $DPID 2>/dev/null || break; sleep 0.1; done
if kill -0 $DPID 2>/dev/null; then
  check "D killed by the scheduler within 5 s (tenants.memory_outside = kill)" yes no
else
  wait $DPID; DRC=$?
  check "D killed by the scheduler within 5 s (tenants.memory_outside = kill)" yes yes
  figure "D exit status $DRC; $(grep -c 'its largest process killed' "$out/sched.log") kill(s) logged"
fi
check "the scheduler logged the kill" yes "$(grep -q 'its largest process killed' "$out/sched.log" && echo yes || echo no)"
check "B, C and the honest A still run" yes "$(kill -0 $HON $BYP $OWNER 2>/dev/null && echo yes || echo no)"
exec 6>&-

exec 7>&- 8>&- 9>&-
wait $HON $BYP 2>/dev/null
HON= BYP=
grep -c '^ok' "$out/summary.txt" | xargs printf '%s checks ok, ' | tee -a "$out/outside_mem.log"
grep -c '^FAIL' "$out/summary.txt" | xargs printf '%s failed\n' | tee -a "$out/outside_mem.log"
! grep -q '^FAIL' "$out/summary.txt"
