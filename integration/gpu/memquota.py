#!/usr/bin/env python3
"""memquota: issue 4's real-GPU checks of libdetshare's per-tenant memory quota with unmodified PyTorch.

One tenant with a --quota-gib (8) GiB quota is registered by dstable.py (the stand-in for `detshare run`); then:
  1. process A: torch.cuda.mem_get_info() reports total = the quota (and free <= it);
  2. process A allocates 256 MiB blocks until torch.cuda.OutOfMemoryError: it must come, at or below the quota;
  3. A keeps --hold-gib (5) GiB; process B of the same tenant sees free <= quota - hold, fails to allocate
     quota - hold + 1 GiB with OutOfMemoryError, and can allocate 1 GiB (one quota shared by both processes);
  4. after both exit, the tenant's client page counts 0 bytes in use (frees credited back);
  5. nvidia-smi run with the library and the tenant's quota file reports memory.total = the quota;
  6. cuBLAS (matmul), cuDNN (conv2d) and, when installed, a Triton kernel give correct results under the library.
Writes OUTDIR/memquota.json and OUTDIR/memquota.md; exit status 0 only if every check passed.
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
GiB = 1 << 30


def child_a(a):
    import torch

    free, total = torch.cuda.mem_get_info()
    out = {"free": free, "total": total}
    blocks, oom, err = [], False, ""
    try:
        while len(blocks) * 256 < a.quota_gib * 1024 + 4096:  # stop well past the quota if nothing refuses
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        oom, err = True, str(e).splitlines()[0][:300]
    out.update(oom=oom, oom_message=err, allocated_at_oom=len(blocks) * (256 << 20),
               reserved_at_oom=torch.cuda.memory_reserved())
    keep = a.hold_gib * 4
    del blocks[keep:]
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    out["held"] = len(blocks) * (256 << 20)
    with open(a.out, "w") as f:
        json.dump(out, f)
    # hold until B is done
    deadline = time.time() + 120
    while not os.path.exists(a.release) and time.time() < deadline:
        time.sleep(0.05)
    return 0


def child_b(a):
    import torch

    free, total = torch.cuda.mem_get_info()
    out = {"free": free, "total": total}
    try:
        big = torch.empty((a.quota_gib - a.hold_gib + 1) * GiB, dtype=torch.uint8, device="cuda")
        out["over_refused"] = False
        del big
    except torch.cuda.OutOfMemoryError:
        out["over_refused"] = True
    torch.cuda.empty_cache()
    try:
        ok = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        ok.fill_(1)
        torch.cuda.synchronize()
        out["small_ok"] = True
        del ok
    except torch.cuda.OutOfMemoryError as e:
        out["small_ok"] = False
        out["small_error"] = str(e).splitlines()[0][:300]
    with open(a.out, "w") as f:
        json.dump(out, f)
    return 0


def child_kernels(a):
    import torch

    out = {}
    torch.manual_seed(0)
    x, y = torch.randn(512, 512), torch.randn(512, 512)
    out["cublas_matmul"] = bool(torch.allclose((x.cuda() @ y.cuda()).cpu(), x @ y, rtol=1e-3, atol=1e-3))
    img, w = torch.randn(2, 3, 32, 32), torch.randn(8, 3, 3, 3)
    torch.backends.cudnn.enabled = True
    ref = torch.nn.functional.conv2d(img, w, padding=1)
    out["cudnn_conv2d"] = bool(torch.allclose(torch.nn.functional.conv2d(img.cuda(), w.cuda(), padding=1).cpu(), ref,
                                              rtol=1e-3, atol=1e-3))
    out["cudnn_version"] = torch.backends.cudnn.version()
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def add(xp, yp, op, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            msk = i < n
            tl.store(op + i, tl.load(xp + i, mask=msk) + tl.load(yp + i, mask=msk), mask=msk)

        u, v = torch.randn(10000, device="cuda"), torch.randn(10000, device="cuda")
        o = torch.empty_like(u)
        add[(triton.cdiv(10000, 1024),)](u, v, o, 10000, BLOCK=1024)
        out["triton_add"] = bool(torch.equal(o, u + v))
        out["triton_version"] = triton.__version__
    except ImportError:
        out["triton_add"] = None
    with open(a.out, "w") as f:
        json.dump(out, f)
    return 0


def parent(a):
    import dstable

    os.makedirs(a.outdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="detshare-mem-")
    checks, notes = [], []

    def check(name, ok, detail):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    try:
        if not os.path.exists(a.lib):
            raise RuntimeError("%s missing: build libdetshare first" % a.lib)
        info = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "gpuinfo.py")], capture_output=True,
                                         text=True, timeout=60).stdout or "{}")
        if "error" in info or not info:
            raise RuntimeError("cannot query the GPU: %s" % info.get("error"))
        groups = (info.get("split") or {}).get("groups") or [8] * (info["sms"] // 8)
        t = dstable.Table.create(os.path.join(tmp, "run"), info["sms"], groups=groups,
                                 mem_total=info["mem_total"], gpu_name=info["name"])
        quota = a.quota_gib * GiB
        q = t.register("memq", tier="best-effort", mem_limit=quota)
        t.publish_grant(q.slot, dstable.full_mask(len(groups)))
        hb = dstable.Heartbeat(t)
        hb.start()
        env = dict(os.environ, LD_PRELOAD=a.lib, DETSHARE_QUOTA_FILE=q.quota_file, PYTHONUNBUFFERED="1",
                   CUDA_MPS_PIPE_DIRECTORY=os.path.join(tmp, "no-mps"), DETSHARE_LOG="info")
        me = os.path.abspath(__file__)
        base = [a.python, me, "--quota-gib", str(a.quota_gib), "--hold-gib", str(a.hold_gib)]
        release = os.path.join(tmp, "release")
        fa, fb = os.path.join(tmp, "a.json"), os.path.join(tmp, "b.json")
        la = open(os.path.join(a.outdir, "memquota_a.log"), "w")
        pa = subprocess.Popen(base + ["--child", "a", "--out", fa, "--release", release], env=env, stdout=la,
                              stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while not os.path.exists(fa) and pa.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if not os.path.exists(fa):
            pa.kill()
            raise RuntimeError("process A produced no result (exit %s); see memquota_a.log" % pa.poll())
        ra = json.load(open(fa))
        check("mem_get_info total = quota (A)", ra["total"] == quota,
              "total %d B (%.2f GiB), free %d B" % (ra["total"], ra["total"] / GiB, ra["free"]))
        check("mem_get_info free <= quota (A)", ra["free"] <= quota, "free %.2f GiB" % (ra["free"] / GiB))
        check("torch.cuda.OutOfMemoryError past the quota (A)", ra["oom"] and ra["allocated_at_oom"] <= quota,
              "OOM=%s after %.2f GiB in 256 MiB blocks (reserved %.2f GiB): %s" % (
                  ra["oom"], ra["allocated_at_oom"] / GiB, ra["reserved_at_oom"] / GiB, ra["oom_message"]))
        used_mid = t.page(q.slot).get("mem_used")
        check("client page counts A's memory", used_mid >= ra["held"],
              "page mem_used %.2f GiB while A holds %.2f GiB" % (used_mid / GiB, ra["held"] / GiB))
        with open(os.path.join(a.outdir, "memquota_b.log"), "w") as lb:
            rc = subprocess.run(base + ["--child", "b", "--out", fb], env=env, stdout=lb, stderr=subprocess.STDOUT,
                                timeout=180).returncode
        if rc != 0 or not os.path.exists(fb):
            notes.append("process B failed (exit %d); see memquota_b.log" % rc)
        else:
            rb = json.load(open(fb))
            left = quota - used_mid
            check("second process sees the shared quota (B free <= quota - A's use)",
                  rb["total"] == quota and rb["free"] <= left + (64 << 20),
                  "B total %.2f GiB free %.2f GiB; quota left %.2f GiB" % (rb["total"] / GiB, rb["free"] / GiB,
                                                                          left / GiB))
            check("B refused an allocation over what A left", rb["over_refused"],
                  "%d GiB while A holds %d GiB" % (a.quota_gib - a.hold_gib + 1, a.hold_gib))
            check("B allocates within what A left", rb["small_ok"], rb.get("small_error", "1 GiB ok"))
        open(release, "w").close()
        pa.wait(timeout=60)
        la.close()
        time.sleep(0.2)
        used_end = t.page(q.slot).get("mem_used")
        check("frees credited back after both exit", used_end == 0, "page mem_used %d B" % used_end)
        # nvidia-smi under the library
        smi = shutil.which("nvidia-smi")
        if smi:
            r = subprocess.run([smi, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
                               env=env, capture_output=True, text=True, timeout=60)
            line = (r.stdout.strip().splitlines() or [""])[0]
            try:
                total_mib = int(line.split(",")[0])
            except ValueError:
                total_mib = -1
            check("nvidia-smi shows the quota as memory.total", total_mib == quota >> 20,
                  "nvidia-smi: %r (want %d MiB); stderr %s" % (line, quota >> 20, r.stderr.strip()[:200]))
        else:
            notes.append("nvidia-smi not found: NVML check not run")
        fk = os.path.join(tmp, "k.json")
        with open(os.path.join(a.outdir, "memquota_kernels.log"), "w") as lk:
            rc = subprocess.run(base + ["--child", "kernels", "--out", fk], env=env, stdout=lk,
                                stderr=subprocess.STDOUT, timeout=300).returncode
        if rc == 0 and os.path.exists(fk):
            rk = json.load(open(fk))
            check("cuBLAS matmul correct under the library", rk["cublas_matmul"], "512x512 fp32 vs CPU")
            check("cuDNN conv2d correct under the library", rk["cudnn_conv2d"], "cuDNN %s" % rk["cudnn_version"])
            if rk["triton_add"] is None:
                notes.append("triton is not installed: Triton check not run")
            else:
                check("Triton kernel correct under the library", rk["triton_add"], "triton %s" % rk["triton_version"])
        else:
            notes.append("kernel checks failed (exit %d); see memquota_kernels.log" % rc)
        hb.stop()
        t.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ok = bool(checks) and all(c["ok"] for c in checks) and not [n for n in notes if "failed" in n]
    md = ["Memory quota under libdetshare (%d GiB quota, unmodified PyTorch): %s" % (
        a.quota_gib, "**all checks passed**" if ok else "**FAILED**"), "", "| check | result | detail |",
          "|---|---|---|"] + ["| %s | %s | %s |" % (c["check"], "pass" if c["ok"] else "**FAIL**",
                                                   c["detail"].replace("|", "/")) for c in checks] + [""] + notes
    with open(os.path.join(a.outdir, "memquota.json"), "w") as f:
        json.dump({"ok": ok, "checks": checks, "notes": notes}, f, indent=1)
    with open(os.path.join(a.outdir, "memquota.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--quota-gib", type=int, default=8)
    ap.add_argument("--hold-gib", type=int, default=5)
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "lib", "libdetshare.so"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--child", choices=["a", "b", "kernels"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--release", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not 0 < a.hold_gib < a.quota_gib:
        ap.error("--hold-gib=%d: must be between 1 and --quota-gib - 1 (%d)" % (a.hold_gib, a.quota_gib - 1))
    if a.child:
        return {"a": child_a, "b": child_b, "kernels": child_kernels}[a.child](a)
    if not a.outdir:
        ap.error("OUTDIR is required")
    try:
        return parent(a)
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        print("memquota: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
