#!/usr/bin/env bash
# trust.sh OUTDIR — issue 13 items 5 and 7 on a real GPU with the real scheduler (which starts MPS):
#   1. orphans: `detshare run` of a burstable 32-SM tenant is killed with SIGKILL while its command (smid_loop, a
#      plain CUDA program recording the SMs of every kernel and its latency) keeps running; a newcomer
#      (latency-critical, 32 SMs) then registers and runs smid_loop. Figures: the newcomer's kernel latency alone
#      and beside the orphan, the SMs both used while both ran (must be disjoint), and whether the newcomer got
#      the orphan's slot (it must not while the orphan lives).
#   2. a command that exits while its child keeps using the GPU: the tenant is deregistered, the child is an
#      orphan; its launches must be held (its log says so) instead of running on a reused slot's SMs.
#   3. the MPS pipe directory bound read-only (as into containers): a plain CUDA client in a mount namespace where
#      the pipe directory is read-only must still reach the MPS server (control log counts its connection).
#   1d. control: the same pair with the burstable owner alive (tells an orphan problem from a partition one).
#   bash integration/gpu/trust.sh /tmp/trust   (repository root; build/ built on a Go machine and carried)
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: trust.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
DS=$repo/build/bin/detshare
[ -x "$DS" ] || { echo "trust.sh: $DS missing: run 'make build' on a Go machine and carry build/" >&2; exit 2; }
RUN=$(mktemp -d /tmp/detshare-trust.XXXX)
export DETSHARE_RUN_DIR=$RUN
log() { printf '[trust %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$out/trust.log" >&2; }
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -O2 -arch=sm_${arch:-90} -o "$out/smid_loop" "$here/probes/smid_loop.cu" >"$out/nvcc.log" 2>&1 ||
  { log "nvcc failed"; cat "$out/nvcc.log"; exit 1; }
SL=$out/smid_loop
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 >"$out/clocks.csv" 2>&1 &
SMI=$!
$DS --log-level info sched >"$out/sched.log" 2>&1 &
SCHED=$!
cleanup() { kill $SMI $SCHED 2>/dev/null; [ -n "${ORPH:-}" ] && kill -9 $ORPH 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT
sleep 4
T="timeout -k 5 60"

log "1a. newcomer alone"
$T $DS run --tier latency-critical --sm 32 --name alone -- $SL "$out/alone.json" 5 >>"$out/runs.log" 2>&1
log "1b. orphan: detshare run killed with SIGKILL, its command keeps running"
DETSHARE_LOG=debug $DS run --tier burstable --sm 32 --name orphan -- sh -c "$SL $out/orphan.json 14 & echo \$! >$out/orphan.pid; wait" \
  >>"$out/runs.log" 2>"$out/orphan.err" &
OWNER=$!
sleep 4
ORPH=$(cat "$out/orphan.pid")
kill -9 $OWNER
sleep 1
timeout 10 $DS status >"$out/status-after-kill.txt" 2>&1
log "1c. newcomer beside the orphan (pid $ORPH)"
DETSHARE_LOG=debug $T $DS run --tier latency-critical --sm 32 --name newcomer -- $SL "$out/newcomer.json" 5 >>"$out/runs.log" 2>"$out/newcomer.err" &
NC=$!
sleep 2
timeout 10 $DS status >"$out/status-both.txt" 2>&1
wait $NC
while kill -0 "$ORPH" 2>/dev/null; do sleep 0.2; done # not our child: reparented when its owner died
ORPH=
sleep 1
timeout 10 $DS status >"$out/status-end.txt" 2>&1

log "1d. control: the same pair, the burstable tenant's owner alive"
DETSHARE_LOG=debug $T $DS run --tier burstable --sm 32 --name ctlb -- $SL "$out/control_b.json" 12 >>"$out/runs.log" 2>"$out/control_b.err" &
CB=$!
sleep 4
DETSHARE_LOG=debug $T $DS run --tier latency-critical --sm 32 --name ctlnc -- $SL "$out/control_nc.json" 5 >>"$out/runs.log" 2>"$out/control_nc.err" &
CN=$!
sleep 2
timeout 10 $DS status >"$out/status-control.txt" 2>&1
wait $CN $CB

log "2. command exits while its child keeps using the GPU"
# The child loops for 5 s of launches; held, it never gets there (no held.json) and is still alive at the end.
$T $DS run --tier burstable --sm 32 --name shortlived -- sh -c "$SL $out/held.json 5 2>$out/held.err & echo \$! >$out/held.pid; sleep 3" \
  >>"$out/runs.log" 2>&1
HELD=$(cat "$out/held.pid")
$T $DS run --tier latency-critical --sm 32 --name reuser -- $SL "$out/reuser.json" 3 >>"$out/runs.log" 2>&1

log "3. MPS client through a read-only pipe directory"
PIPE=$RUN/mps/gpu0/pipe
before=$(grep -ci "new client" "$RUN"/mps/gpu0/log/control.log 2>/dev/null)
CUDA_MPS_PIPE_DIRECTORY=$PIPE timeout -k 5 40 unshare -m sh -c "mount --bind -o ro $PIPE $PIPE && mount -o remount,bind,ro $PIPE && \
  (touch $PIPE/x 2>/dev/null && echo writable || echo read-only) && $SL $out/ro.json 1" >"$out/ro.log" 2>&1
echo "rc=$? (124: the client did not finish in 40 s)" >>"$out/ro.log"
after=$(grep -ci "new client" "$RUN"/mps/gpu0/log/control.log 2>/dev/null)
echo "control-log-new-clients before=$before after=$after" >>"$out/ro.log"
cp "$RUN"/mps/gpu0/log/control.log "$out/" 2>/dev/null
sleep 2 # the held child's 5 s of launches would be over by now (13 s after it started) if it were not held
a=0; kill -0 "$HELD" 2>/dev/null && a=1
w=0; [ -s "$out/held.json" ] && w=1
echo "held-alive=$a held-json-written=$w" >"$out/held.state"
kill -9 "$HELD" 2>/dev/null
kill $SMI 2>/dev/null
for f in status-after-kill status-both status-end status-control; do echo "== $f"; cat "$out/$f.txt"; done

python3 - "$out" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n)
    return json.load(open(p))["records"] if os.path.exists(p) else []
def lat(recs):
    v = sorted((r[2] - r[0]) / 1e6 for r in recs)
    return (v[len(v) // 2], v[int(len(v) * 0.99)], len(v)) if v else (0, 0, 0)
alone, nc, orph = load("alone.json"), load("newcomer.json"), load("orphan.json")
res = {}
def overlap(key, lc, other):
    """Kernels of other that ran while lc ran, and those of them on lc's SMs (ms after lc's first kernel)."""
    if not lc or not other:
        return
    t0, t1 = lc[0][0], lc[-1][2]
    lsms = {s for r in lc for s in r[3]}
    during = [r for r in other if t0 <= r[0] <= t1]
    bad = [r for r in during if set(r[3]) & lsms]
    res[key] = {"kernels_while_lc_ran": len(during), "kernels_on_lc_sms": len(bad),
                "lc_sms": [min(lsms), max(lsms), len(lsms)],
                "other_sms": sorted({s for r in during for s in r[3]})[:1] + [len({s for r in during for s in r[3]})]}
    if bad:
        res[key]["on_lc_sms_ms"] = [round((bad[0][0] - t0) / 1e6, 3), round((bad[-1][0] - t0) / 1e6, 3)]
overlap("control_owner_alive", load("control_nc.json"), load("control_b.json"))
for name, recs in (("alone", alone), ("newcomer_beside_orphan", nc), ("orphan", orph)):
    p50, p99, n = lat(recs)
    res[name] = {"p50_ms": round(p50, 3), "p99_ms": round(p99, 3), "kernels": n,
                 "sms": sorted({s for r in recs for s in r[3]})[:200]}
for k in ("alone", "newcomer_beside_orphan", "orphan"):
    sms = res[k].pop("sms")
    res[k]["sm_range"] = [sms[0], sms[-1], len(sms)] if sms else []
if nc and orph:
    t0, t1 = nc[0][0], nc[-1][2]
    nsms = {s for r in nc for s in r[3]}
    during = [r for r in orph if t0 <= r[0] <= t1]
    bad = [r for r in during if set(r[3]) & nsms]
    res["orphan_kernels_while_newcomer_ran"] = len(during)
    res["orphan_kernels_on_newcomer_sms"] = len(bad)
    if bad:  # when: ms after the newcomer's first kernel, first and last
        res["orphan_on_newcomer_sms_ms"] = [round((bad[0][0] - t0) / 1e6, 3), round((bad[-1][0] - t0) / 1e6, 3)]
    res["newcomer_sm_set"] = sorted(nsms)
# %smid is virtual under MPS (0..n-1 of the client's SMs), so the SM sets above show sizes, not placement. Where a
# process ran is in its library's debug log: the SM-group masks of the grants it took, in order (first, then counts).
import re
for n in ("orphan", "newcomer", "control_b", "control_nc"):
    p = os.path.join(out, n + ".err")
    if os.path.exists(p):
        masks = re.findall(r"grant epoch \d+: mode \d+ groups (0x[0-9a-f]+)", open(p, errors="replace").read())
        cnt = {}
        for m in masks:
            cnt[m] = cnt.get(m, 0) + 1
        res["grants_" + n] = {"first": masks[:3], "changes": len(masks),
                              "by_count": sorted(cnt.items(), key=lambda kv: -kv[1])[:6]}
held = open(os.path.join(out, "held.err")).read() if os.path.exists(os.path.join(out, "held.err")) else ""
res["held_log"] = [l for l in held.splitlines() if "no tenant" in l][:2]
res["held_state"] = open(os.path.join(out, "held.state")).read().strip() if os.path.exists(os.path.join(out, "held.state")) else ""
res["ro_pipe"] = open(os.path.join(out, "ro.log")).read().strip().splitlines()[-4:]
json.dump(res, open(os.path.join(out, "summary.json"), "w"))
print(json.dumps(res))
PY
