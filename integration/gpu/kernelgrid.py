#!/usr/bin/env python3
"""kernelgrid: the kernels one training step of a bench trainer launches, with grid, block and duration.

Why (issue 12): a latency-critical request that lands on SMs a trainer is using waits until the trainer's thread
blocks on them finish. How long depends on the trainer's kernels: an ordinary grid of many short blocks frees SMs
block by block, a persistent kernel (about one block per SM, looping over tiles) holds each SM for the whole
kernel. This prints which kind the trainer's GEMMs are on this GPU, from torch.profiler's trace.

    python3 integration/gpu/kernelgrid.py --model lin8192-bf16 --steps 3 --out OUT/kernels.json
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lin8192-bf16", choices=["lin8192-bf16", "lin8192-fp32", "resnet50", "gpt2"])
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--out", required=True, help="JSON summary")
    ap.add_argument("--top", type=int, default=12, help="kernels printed, by total time")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, HERE)
    import worker

    step, _, _ = worker.build_train(argparse.Namespace(model=a.model, batch=0, seq=0), torch, "cuda")  # worker.py's

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kinds = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        grid = args.get("grid", [0, 0, 0])
        blocks = grid[0] * grid[1] * grid[2]
        k = kinds.setdefault(e["name"], {"name": e["name"], "count": 0, "us": [], "blocks": blocks,
                                         "block": args.get("block"), "blocks_per_sm": args.get("blocks per SM"),
                                         "regs": args.get("registers per thread"),
                                         "smem": args.get("shared memory")})
        k["count"] += 1
        k["us"].append(e.get("dur", 0))
    rows = []
    for k in kinds.values():
        us = sorted(k.pop("us"))
        k.update(total_us=sum(us), mean_us=sum(us) / len(us), max_us=us[-1],
                 # one resident wave of blocks that each live as long as the kernel: an SM is held for all of it
                 persistent_like=0 < k["blocks"] <= 2 * sms)
        rows.append(k)
    rows.sort(key=lambda r: -r["total_us"])
    total = sum(r["total_us"] for r in rows) or 1
    out = {"model": a.model, "steps": a.steps, "sms": sms, "gpu": torch.cuda.get_device_name(0),
           "step_gpu_ms": total / 1e3 / a.steps,
           "persistent_like_share": sum(r["total_us"] for r in rows if r["persistent_like"]) / total,
           "kernels": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("%s on %s (%d SMs): %.2f ms GPU time per step, %.0f%% of it in kernels of <= 2 blocks per SM"
          % (a.model, out["gpu"], sms, out["step_gpu_ms"], 100 * out["persistent_like_share"]))
    for r in rows[:a.top]:
        print("  %6.1f%%  x%-4d mean %8.1f us  max %8.1f us  grid %6d blocks  smem %6s B  %s" % (
            100 * r["total_us"] / total, r["count"], r["mean_us"], r["max_us"], r["blocks"], r["smem"], r["name"][:100]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
