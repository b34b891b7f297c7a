#!/usr/bin/env python3
"""smtarget: what does MPS's thread percentage do to a trainer: its results, its kernels, its power? Builds a trainer
exactly as worker.py does (same seed, same model), optionally tells cuBLAS and cuBLASLt to pick their kernels for
--sm-target SMs (worker.cublas_sm_target), records the first step's loss and the first module (in call order) whose
output is not finite, runs the rest of --warmup, hashes the next 5 losses as worker.py's result does (and says whether
they are finite), and times steps for --duration seconds. Prints one JSON line. No DetShare code: smtarget.sh runs it
without MPS and as the only client of a private MPS daemon at each thread percentage. On an H100 the bf16 trainer's
first Linear returned NaN under MPS at 67 and 80 % (BENCHMARKS.md, issue 26).

    python3 integration/gpu/smtarget.py --model lin8192-bf16 --sm-target 132
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def gemm_paths(torch):
    """Whether each GEMM path's output is finite for a bf16 Linear(8192) on random inputs (seeded)."""
    torch.manual_seed(1234)
    w = (torch.randn(8192, 8192, device="cuda") / 8192 ** 0.5).to(torch.bfloat16)
    b = torch.randn(8192, device="cuda").to(torch.bfloat16)
    res = {}
    for batch in (2048, 256):
        x = torch.randn(batch, 8192, device="cuda").to(torch.bfloat16)
        torch.backends.cuda.preferred_blas_library("cublas")
        res["addmm_bias_%d" % batch] = bool(torch.nn.functional.linear(x, w, b).isfinite().all())
        res["mm_%d" % batch] = bool((x @ w.t()).isfinite().all())
        torch.backends.cuda.preferred_blas_library("cublaslt")
        res["mm_cublaslt_%d" % batch] = bool((x @ w.t()).isfinite().all())
        torch.backends.cuda.preferred_blas_library("cublas")
        res["fp32_addmm_bias_%d" % batch] = bool(
            torch.nn.functional.linear(x.float(), w.float(), b.float()).isfinite().all())
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lin8192-bf16", help="a train model of worker.py")
    ap.add_argument("--sm-target", type=int, default=0, help="SMs cuBLAS picks kernels for (0: leave it alone)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--ops", action="store_true",
                    help="instead of a trainer: one bf16 Linear(8192) forward on a batch of 2048 (and 256) through "
                         "each GEMM path PyTorch has (addmm with bias: cuBLASLt's bias epilogue; mm without bias: "
                         "cuBLAS; mm with cuBLASLt preferred), and whether each output is finite")
    a = ap.parse_args(argv)
    if a.warmup < 1 or a.sm_target < 0:
        ap.error("--warmup %d --sm-target %d: at least one warm-up step (the first is the one inspected), and a "
                 "number of SMs >= 0 (0: leave cuBLAS alone)" % (a.warmup, a.sm_target))
    sys.path.insert(0, HERE)
    import torch
    import worker

    if a.ops:
        print(json.dumps({"tag": a.tag, "mps_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""),
                          "reported_sms": torch.cuda.get_device_properties(0).multi_processor_count,
                          "ops": gemm_paths(torch)}), flush=True)
        return

    wa = worker.parse(["--role", "train", "--model", a.model, "--out", os.devnull])
    torch.manual_seed(wa.seed)
    torch.backends.cudnn.benchmark = False
    info = {"tag": a.tag, "model": a.model, "torch": torch.__version__,
            "mps_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""),
            "reported_sms": torch.cuda.get_device_properties(0).multi_processor_count, "sm_target": a.sm_target}
    try:
        info["blas"] = str(torch.backends.cuda.preferred_blas_library())
    except Exception:  # noqa: BLE001 - older PyTorch
        pass
    if a.sm_target:
        info.update(worker.cublas_sm_target(torch, a.sm_target))
    step, _, _ = worker.build_train(wa, torch, "cuda")
    # the first step's modules in call order: where does a non-finite output first appear?
    calls = []

    def hook(mod, inp, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            calls.append((type(mod).__name__, out.detach().isfinite().all()))

    h = torch.nn.modules.module.register_module_forward_hook(hook)
    first = step().detach()
    h.remove()
    torch.cuda.synchronize()
    info["first_loss"] = repr(float(first))
    bad = [i for i, (_, ok) in enumerate(calls) if not bool(ok)]
    info["first_step_modules"] = len(calls)
    info["first_nonfinite_module"] = ("%d %s" % (bad[0], calls[bad[0]][0])) if bad else ""
    for _ in range(a.warmup - 1):
        step()
    torch.cuda.synchronize()
    losses = [step().detach() for _ in range(5)]
    torch.cuda.synchronize()
    info["loss_hash_first5"] = worker.tensor_hash(torch.stack(losses))
    info.update(worker.loss_facts(losses))
    n, t0 = 0, time.time()
    while time.time() < t0 + a.duration:
        step()
        torch.cuda.synchronize()
        n += 1
    info["steps_per_s"] = round(n / (time.time() - t0), 3)
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
