#!/usr/bin/env bash
# failclosed.sh OUTDIR — issue 27 on a real GPU with the real scheduler (MPS on; the GPU's compute mode is never
# changed: mps.exclusive stays off): a `detshare run --memory 4Gi` tenant whose processes are libdetshare's probe
# (build/tests/ds_probe_rt, which finds the real libcuda.so.1 with dlopen and cuGetProcAddress, as cudart does).
#   A. an honest process: 2 GiB granted, 3 GiB more refused (rc 2). A 4 GiB tenant, because under MPS each
#      process's server-side limit also counts its context (~0.75 GiB on an H100: 512 MiB of a 1 GiB tenant failed)
#   B. the page's magic overwritten just before a process starts: its cuInit is refused (rc 800), with the
#      "refuses this process's CUDA work" line; before issue 27 it ran with no quota ("fail-open")
#   C. a second later (the scheduler's housekeeping repaired the page): a process runs under its quota again
#   D. one process holds 3 GiB, mem_used is zeroed in the page, a second process asks for 2 GiB: refused (the
#      memory ledger), 1 GiB granted; before issue 27 the 2 GiB were granted (5 GiB in a 4 GiB tenant)
# OUTDIR/summary.txt has one line per check, "ok" or "FAIL"; OUTDIR/*.out the probes' output.
#   bash integration/gpu/failclosed.sh /tmp/fc     (repository root; build/ built on a Go machine and carried)
# FC_SIM=1 runs the same on the simulated GPU (a test double), to check the script without a GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh" # probe_script, check, rc
probe_script failclosed.sh "${1:-}"
RUN=$(mktemp -d /tmp/detshare-fc.XXXX)
export DETSHARE_RUN_DIR=$RUN
if [ "${FC_SIM:-0}" = 1 ]; then
  export DETSHARE_SIMGPU=1 DETSHARE_SIMGPU_STATE=$RUN/simgpu-state LD_LIBRARY_PATH=$repo/build/lib/simgpu
fi
: >"$out/summary.txt"
log() { printf '[failclosed %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/failclosed.log" >&2; }
smi_used() { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

$DS --log-level info sched --stop-mps-on-exit >"$out/sched.log" 2>&1 &
SCHED=$!
HOLD=
cleanup() { [ -n "$HOLD" ] && kill "$HOLD" 2>/dev/null; kill $SCHED $OWNER 2>/dev/null; wait 2>/dev/null; rm -rf "$RUN"; }
trap cleanup EXIT
sleep 3
# The tenant lives as long as its owner's command (sleep); its processes join it.
$DS run --memory 4Gi --name fc -- sleep 120 >"$out/owner.log" 2>&1 &
OWNER=$!
for _ in $(seq 50); do [ -e "$RUN/clients/fc.page" ] && break; sleep 0.1; done
PAGE=$RUN/clients/fc.page
[ -e "$PAGE" ] || { log "tenant fc did not register"; cat "$out/owner.log"; exit 1; }
J() { timeout -k 5 60 "$DS" run --join fc -- "$@"; }

log "A. honest process"
J "$PROBE" init alloc:2147483648 alloc:3221225472 >"$out/A.out" 2>&1
check "A init" 0 "$(rc A init)"
check "A 2 GiB in a 4 GiB tenant" 0 "$(rc A alloc:2147483648)"
check "A 3 GiB more (over the quota)" 2 "$(rc A alloc:3221225472)"

log "B. page magic overwritten just before the process starts"
J sh -c "printf 'garbage!' | dd of=$PAGE bs=8 count=1 conv=notrunc 2>/dev/null; exec $PROBE init alloc:536870912" \
  >"$out/B.out" 2>&1
check "B init refused (CUDA_ERROR_NOT_PERMITTED)" 800 "$(rc B init)"
check "B says why" 1 "$(grep -c "refuses this process's CUDA work" "$out/B.out")"
check "B allocation" nonzero "$( [ "$(rc B alloc:536870912)" = 0 ] && echo 0 || echo nonzero)"

log "C. after the scheduler's repair"
sleep 1
J "$PROBE" init alloc:2147483648 alloc:3221225472 >"$out/C.out" 2>&1
check "C init after the repair" 0 "$(rc C init)"
check "C 2 GiB" 0 "$(rc C alloc:2147483648)"
check "C 3 GiB more" 2 "$(rc C alloc:3221225472)"
grep -q "client page was damaged by its tenant; repaired" "$out/sched.log"
check "C scheduler logged the repair" 0 $?

log "D. mem_used zeroed beside a process holding 3 GiB"
mkfifo "$out/hold.in"
J "$PROBE" init alloc:3221225472 hold <"$out/hold.in" >"$out/D-holder.out" 2>&1 &
HOLD=$!
exec 7>"$out/hold.in"
for _ in $(seq 100); do grep -q holding "$out/D-holder.out" && break; sleep 0.1; done
check "D holder 3 GiB" 0 "$(rc D-holder alloc:3221225472)"
echo "nvidia-smi used with the holder: $(smi_used) MiB" >>"$out/failclosed.log"
dd if=/dev/zero of="$PAGE" bs=8 seek=19 count=1 conv=notrunc 2>/dev/null # mem_used, offset 152
J "$PROBE" init alloc:2147483648 alloc:1073741824 >"$out/D.out" 2>&1
check "D 2 GiB beside 3 GiB held, page zeroed (ledger)" 2 "$(rc D alloc:2147483648)"
check "D the 1 GiB left" 0 "$(rc D alloc:1073741824)"
echo "nvidia-smi used at the end: $(smi_used) MiB" >>"$out/failclosed.log"
exec 7>&-
wait $HOLD
HOLD=
grep -c '^ok' "$out/summary.txt" | xargs printf '%s checks ok, ' | tee -a "$out/failclosed.log"
grep -c '^FAIL' "$out/summary.txt" | xargs printf '%s failed\n' | tee -a "$out/failclosed.log"
! grep -q '^FAIL' "$out/summary.txt"
