#!/usr/bin/env python3
"""rebind: how long after a grant change a tenant's kernels run on the newly granted SMs (issue 5, real GPU).

A child process under MPS + libdetshare launches, back to back, a small kernel whose blocks record the SM they run
on (%smid): a Triton kernel, or with --child-bin the compiled probes/smid_loop.cu (plain CUDA runtime launches); this parent publishes grants through dstable.py:
  1. calibration: each group of the split alone, to learn which SM ids make up each group;
  2. flips: the grant alternates between two disjoint group sets (default groups 0-3 and 4-7) every --period-ms.
For every flip, the delay is measured from the grant's publication (CLOCK_MONOTONIC, as the library sees it) to
  - launch: the host-side start of the first kernel launched after it that ran only on the new groups' SMs;
  - done:   that kernel's completion as seen by the host;
and the number of kernels that still ran on the old SMs after the change (at most one in flight is expected: the
logical stream rebinds at its next kernel boundary). Writes OUTDIR/rebind.{md,json}. Needs Triton, or nvcc for --child-bin.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)


def child(a):
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def smid_kernel(out_ptr, spin):
        pid = tl.program_id(0)
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        # a little work so that the kernel is not gone before every program started
        acc = pid.to(tl.float32)
        for _ in range(spin):
            acc = acc * 1.0000001 + 1.0
        tl.store(out_ptr + pid, sm + (acc < -1.0).to(tl.int32))

    progs = a.programs
    out = torch.zeros(progs, dtype=torch.int32, device="cuda")
    smid_kernel[(progs,)](out, a.spin)
    torch.cuda.synchronize()
    recs = []
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        t0 = time.monotonic_ns()
        smid_kernel[(progs,)](out, a.spin)
        t1 = time.monotonic_ns()
        torch.cuda.synchronize()
        t2 = time.monotonic_ns()
        recs.append((t0, t1, t2, sorted(set(out.tolist()))))
    with open(a.out, "w") as f:
        json.dump({"records": recs}, f)
    return 0


def analyze(events, recs):
    """events: (kind 'calib'|'flip', group mask, publish ns); recs: (launch start ns, launch end ns, done ns, SM ids).
    Returns the summary and the per-flip delays (see the module doc)."""
    # SM ids of each group: from kernels that completed well inside each calibration window
    group_sms = {}
    calib = [e for e in events if e[0] == "calib"]
    for i, (_, m, ns) in enumerate(calib):
        end_ns = calib[i + 1][2] if i + 1 < len(calib) else [e for e in events if e[0] == "flip"][0][2]
        sms = set()
        for t0, _, t2, s in recs:
            if t0 > ns + 20_000_000 and t2 < end_ns:
                sms |= set(s)
        group_sms[m.bit_length() - 1] = sms

    def sms_of(mask):
        out = set()
        for g in range(len(group_sms)):
            if mask >> g & 1:
                out |= group_sms.get(g, set())
        return out

    flips = [e for e in events if e[0] == "flip"]
    delays = []
    for i, (_, m, ns) in enumerate(flips):
        new, nxt = sms_of(m), flips[i + 1][2] if i + 1 < len(flips) else float("inf")
        after = [r for r in recs if r[0] >= ns - 5_000_000 and r[0] < nxt]
        stale = 0
        hit = None
        for t0, t1, t2, s in after:
            if t2 < ns:
                continue
            if new and set(s) <= new:
                hit = (t0, t2)
                break
            stale += 1
        delays.append({"publish_ns": ns, "launch_us": (hit[0] - ns) / 1e3 if hit else None,
                       "done_us": (hit[1] - ns) / 1e3 if hit else None, "stale_kernels": stale,
                       "confined": hit is not None})
    ok = [d for d in delays if d["confined"]]

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))] if xs else None

    kern = [(t2 - t0) / 1e3 for t0, _, t2, _ in recs]
    summary = {"flips": len(delays), "confined_flips": len(ok),
               "launch_us_p50": q([d["launch_us"] for d in ok], 0.5),
               "launch_us_max": max([d["launch_us"] for d in ok], default=None),
               "done_us_p50": q([d["done_us"] for d in ok], 0.5), "done_us_max": max([d["done_us"] for d in ok],
                                                                                      default=None),
               "stale_kernels_max": max([d["stale_kernels"] for d in delays], default=None),
               "kernel_us_p50": q(kern, 0.5), "group_sm_counts": {g: len(s) for g, s in group_sms.items()}}
    return summary, delays


def parent(a):
    import bench
    import dstable

    os.makedirs(a.outdir, exist_ok=True)
    if not os.path.exists(a.lib):
        raise RuntimeError("%s missing: build libdetshare first" % a.lib)
    tmp = tempfile.mkdtemp(prefix="detshare-rebind-")
    mps = bench.MPS(a.mps_control, tmp)
    used_mps = False
    try:
        info = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "gpuinfo.py")], capture_output=True,
                                         text=True, timeout=60).stdout or "{}")
        if not info.get("split"):
            raise RuntimeError("no SM split from the driver: %s" % info)
        groups = info["split"]["groups"]
        n = len(groups)
        if not a.no_mps and shutil.which(a.mps_control):
            mps.start()
        used_mps = mps.running
        t = dstable.Table.create(os.path.join(tmp, "run"), info["sms"], groups=groups,
                                 mps_pipe_dir=mps.pipe if mps.running else "")
        q = t.register("rebind", tier="best-effort")
        masks = (dstable._parse_mask(a.set_a, n), dstable._parse_mask(a.set_b, n))
        t.publish_grant(q.slot, dstable.full_mask(n))
        env = dict(os.environ, LD_PRELOAD=a.lib, DETSHARE_QUOTA_FILE=q.quota_file, PYTHONUNBUFFERED="1",
                   DETSHARE_LOG="info")
        env.update(mps.env() if mps.running else {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(tmp, "no-mps")})
        calib_s = 0.15
        seconds = 2.0 + n * calib_s + a.flips * a.period_ms / 1000.0 + 1.0
        outp = os.path.join(tmp, "child.json")
        logf = open(os.path.join(a.outdir, "rebind_child.log"), "w")
        if a.child_bin:
            cmd = [a.child_bin, outp, str(seconds), str(a.programs), str(a.spin_cycles)]
        else:
            cmd = [a.python, os.path.abspath(__file__), "--child", "--out", outp, "--seconds", str(seconds),
                   "--programs", str(a.programs), "--spin", str(a.spin)]
        p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
        hb = dstable.Heartbeat(t)
        hb.start()
        time.sleep(2.0)  # Triton compile + warm-up under the full grant
        events = []  # (kind, mask, publish_ns)
        for g in range(n):
            t.publish_grant(q.slot, 1 << g)
            events.append(("calib", 1 << g, t.container(q.slot).get("grant_ns")))
            time.sleep(calib_s)
        for i in range(a.flips):
            m = masks[i % 2]
            t.publish_grant(q.slot, m)
            events.append(("flip", m, t.container(q.slot).get("grant_ns")))
            time.sleep(a.period_ms / 1000.0)
        rc = p.wait(timeout=seconds + 120)
        hb.stop()
        logf.close()
        if rc != 0 or not os.path.exists(outp):
            raise RuntimeError("child failed (exit %s): see rebind_child.log" % rc)
        recs = json.load(open(outp))["records"]
    finally:
        mps.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    summary, delays = analyze(events, recs)
    summary["mps"] = "MPS" if used_mps else "no MPS"
    with open(os.path.join(a.outdir, "rebind.json"), "w") as f:
        json.dump({"summary": summary, "flips": delays}, f, indent=1)

    def f(x):
        return "—" if x is None else "%.1f" % x

    confined = summary["confined_flips"]

    md = ["Rebind delay (grant change to the first kernel on the new SMs; %d flips between groups %s and %s every "
          "%g ms; kernel ~%s µs; %s):" % (a.flips, a.set_a, a.set_b, a.period_ms, f(summary["kernel_us_p50"]),
                                          summary["mps"]), "",
          "| flips confined | launch delay P50 / max µs | completion delay P50 / max µs | kernels on old SMs after "
          "the change (max) |", "|---|---|---|---|",
          "| %d / %d | %s / %s | %s / %s | %s |" % (confined, len(delays), f(summary["launch_us_p50"]),
                                                  f(summary["launch_us_max"]), f(summary["done_us_p50"]),
                                                  f(summary["done_us_max"]), summary["stale_kernels_max"]),
          "", "SMs per group as observed: %s" % summary["group_sm_counts"]]
    with open(os.path.join(a.outdir, "rebind.md"), "w") as fo:
        fo.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if delays and confined == len(delays) else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--flips", type=int, default=40)
    ap.add_argument("--period-ms", type=float, default=50.0)
    ap.add_argument("--set-a", default="0-3", help="first group set (e.g. 0-3)")
    ap.add_argument("--set-b", default="4-7", help="second group set, disjoint from the first")
    ap.add_argument("--programs", type=int, default=128, help="Triton programs per kernel")
    ap.add_argument("--spin", type=int, default=2000, help="loop iterations per program (kernel length)")
    ap.add_argument("--child-bin", help="a compiled probe/smid_loop.cu binary to run instead of the Triton child "
                    "(same records; no Python or Triton in the measured process)")
    ap.add_argument("--spin-cycles", type=int, default=20000, help="with --child-bin: clock64 cycles per block")
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "lib", "libdetshare.so"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    ap.add_argument("--no-mps", action="store_true",
                    help="run without MPS: under MPS %%smid numbers the SMs of each green context from 0 (seen on the "
                    "H100), so flips between group sets cannot be told apart; a single process needs no MPS")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    if not a.outdir:
        ap.error("OUTDIR is required")
    try:
        import dstable
        if dstable._parse_mask(a.set_a, 64) & dstable._parse_mask(a.set_b, 64):
            ap.error("--set-a=%s and --set-b=%s overlap: the flips must move to other SMs" % (a.set_a, a.set_b))
    except ValueError as e:
        ap.error("--set-a/--set-b: %s" % e)
    try:
        return parent(a)
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        print("rebind: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
