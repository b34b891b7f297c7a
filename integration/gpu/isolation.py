"""isolation.py: what reaches a latency-critical tenant through its SM partition, and why (issue 5's 3% target).

Roles (each run as its own process, normally under `detshare run`; see isolation.sh):
  lc --duration S --tag T   three latency-critical workloads one after the other, S seconds each, every iteration
                            timed with CUDA events: gemm (8 fp16 2048x2048 matmuls + tanh: compute-bound),
                            resnet50 (batch-1 fp32 ResNet-50 replayed as a CUDA graph: memory-latency bound),
                            hbm (a 256 MiB device copy: bandwidth-bound). One JSON line per workload.
  be KIND --stop FILE       a saturating best-effort neighbour until FILE exists: alu (a Triton kernel of
                            register-only FMAs: no memory traffic), hbm (1 GiB device copies), train (8x Linear(4096)
                            training steps, as in smoke_coro.sh). Prints its iterations per second.
  report RESULTS CLOCKS     the table: each LC workload's median per neighbour and its ratio to no neighbour, with
                            the SM clock and board power nvidia-smi logged during that workload.
"""
import argparse
import csv
import datetime
import hashlib
import json
import os
import statistics
import sys
import time


def timed(torch, fn, seconds):
    ts = []
    end = time.time() + seconds
    while time.time() < end:
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts


def run_lc(a):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    dev = "cuda"
    x16 = torch.randn(2048, 2048, device=dev, dtype=torch.float16)
    w16 = torch.randn(2048, 2048, device=dev, dtype=torch.float16)

    def gemm():
        x = x16
        for _ in range(8):
            x = (x @ w16).tanh_()
        return x

    m, _ = models.resnet50()
    m = m.to(dev).eval()
    img = torch.randn(1, 3, 224, 224, device=dev)
    with torch.inference_mode():
        for _ in range(5):
            m(img)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(img)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = m(img)

    src = torch.empty(64 << 20, device=dev, dtype=torch.float32)  # 256 MiB
    src.normal_()
    dst = torch.empty_like(src)

    work = [("gemm", gemm), ("resnet50", lambda: (graph.replay(), out)[1]), ("hbm", lambda: dst.copy_(src))]
    for name, fn in work:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.time()
        ts = timed(torch, fn, a.duration)
        t1 = time.time()
        h = hashlib.sha256(fn().float().cpu().numpy().tobytes()).hexdigest()[:16]
        print(json.dumps({"tag": a.tag, "lc": name, "n": len(ts), "median_ms": ts[len(ts) // 2],
                          "p99_ms": ts[int(len(ts) * 0.99)], "t0": t0, "t1": t1, "hash": h}), flush=True)


def run_be(a):
    import torch

    dev = "cuda"
    if a.kind == "alu":
        import triton
        import triton.language as tl

        @triton.jit
        def fma_only(out, iters, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            offs = tl.arange(0, BLOCK)
            x = offs.to(tl.float32) + pid
            for _ in range(iters):
                x = x * 0.999999 + 0.5
            tl.store(out + pid * BLOCK + offs, x)

        nprog = 132 * 16
        buf = torch.empty(nprog * 1024, device=dev)

        def step():
            fma_only[(nprog,)](buf, 4000, BLOCK=1024)
    elif a.kind == "hbm":
        src = torch.empty(256 << 20, device=dev)  # 1 GiB
        src.normal_()
        dst = torch.empty_like(src)

        def step():
            dst.copy_(src)
    elif a.kind == "train":
        m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)
        x = torch.randn(1024, 4096, device=dev)

        def step():
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    else:
        sys.exit("isolation.py be: KIND %r: allowed alu, hbm, train" % a.kind)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    n, t = 0, time.time()
    deadline = t + a.max_seconds
    while not os.path.exists(a.stop) and time.time() < deadline:
        for _ in range(4):
            step()
        n += 4
        torch.cuda.synchronize()
    print(json.dumps({"be": a.kind, "per_s": n / (time.time() - t)}), flush=True)


def read_clocks(path):
    """nvidia-smi csv rows: timestamp, SM MHz, memory MHz, power W (the timestamp is the GPU host's local time)."""
    rows = []
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) < 4:
                continue
            try:
                ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((ts, float(r[1]), float(r[2]), float(r[3])))
            except ValueError:
                continue
    return rows


def run_report(a):
    res = [json.loads(l) for l in open(a.results) if l.startswith("{") and '"lc"' in l]
    clocks = read_clocks(a.clocks) if a.clocks and os.path.exists(a.clocks) else []
    by = {}
    for r in res:
        win = [c for c in clocks if r["t0"] <= c[0] <= r["t1"]]
        r["sm_mhz"] = statistics.mean(c[1] for c in win) if win else float("nan")
        r["watts"] = statistics.mean(c[3] for c in win) if win else float("nan")
        by.setdefault((r["lc"], r["tag"]), []).append(r)
    tags = ["none", "alu", "hbm", "train"]
    print("| LC workload (32 SMs) | neighbour on the other SMs | median ms per run | median / alone | p99 ms "
          "| SM MHz | board W | output hash |")
    print("|---|---|---|---|---|---|---|---|")
    for lc in ["gemm", "resnet50", "hbm"]:
        base = by.get((lc, "none"))
        b = statistics.median(r["median_ms"] for r in base) if base else None
        for tag in tags:
            rs = by.get((lc, tag))
            if not rs:
                continue
            med = statistics.median(r["median_ms"] for r in rs)
            ratio = "%+.1f%%" % (100 * (med / b - 1)) if b else "—"
            print("| %s | %s | %s | %s | %s | %.0f | %.0f | %s |" % (
                lc, tag, " / ".join("%.3f" % r["median_ms"] for r in rs), ratio,
                " / ".join("%.3f" % r["p99_ms"] for r in rs), statistics.mean(r["sm_mhz"] for r in rs),
                statistics.mean(r["watts"] for r in rs), ",".join(sorted({r["hash"] for r in rs}))))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="role", required=True)
    lc = sub.add_parser("lc")
    lc.add_argument("--duration", type=float, default=4.0)
    lc.add_argument("--tag", default="none")
    be = sub.add_parser("be")
    be.add_argument("kind")
    be.add_argument("--stop", required=True, help="stop once this file exists")
    be.add_argument("--max-seconds", type=float, default=120.0)
    rp = sub.add_parser("report")
    rp.add_argument("results")
    rp.add_argument("clocks", nargs="?")
    a = p.parse_args()
    {"lc": run_lc, "be": run_be, "report": run_report}[a.role](a)


if __name__ == "__main__":
    main()
