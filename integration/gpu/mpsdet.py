#!/usr/bin/env python3
"""mpsdet: is a latency-critical workload's output bit-identical from one request to the next, alone, and if not,
which module's output varies first? No DetShare code: run it once without MPS and once as an MPS client
(mpsdet.sh does both), to tell what MPS itself does to a workload's determinism from what sharing does.

Builds the workload as worker.py does (same seed, same model), then:
  graph  captures one request as a CUDA graph and replays it --reps times, hashing the output after each replay;
  eager  runs the request --reps times without a graph, hashing every module's output (forward hooks), and names the
         first module, in execution order, whose output took more than one value.
--sdpa math forces the textbook attention instead of scaled_dot_product_attention's fused kernels; --sdpa efficient
or cudnn allows only that fused backend (torch.nn.attention.sdpa_kernel).
Prints one JSON object per line: {"mode", "sdpa", "mps", "reps", "distinct", "first_varying", ...}.

    python3 integration/gpu/mpsdet.py --model llama-step --reps 300
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-step", help="an infer model of worker.py (default llama-step)")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--eager-reps", type=int, default=100, help="eager runs (each hashes every module's output)")
    ap.add_argument("--sdpa", choices=["default", "math", "efficient", "cudnn"], default="default",
                    help="attention: PyTorch's choice, the textbook formula, or one fused SDPA backend only")
    ap.add_argument("--modes", default="graph,eager")
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    try:
        import torch
    except ImportError:
        sys.exit("mpsdet: PyTorch is not installed")
    if not torch.cuda.is_available():
        sys.exit("mpsdet: needs a GPU")
    import models
    import worker

    models.FORCE_MATH_ATTENTION = a.sdpa == "math"
    if a.sdpa in ("efficient", "cudnn"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[a.sdpa]
        sdpa_kernel(backend).__enter__()  # for the whole process: capture and replays alike
    wa = argparse.Namespace(model=a.model, seq=0, device="cuda", seed=1234)
    torch.manual_seed(1234)
    m, x, _ = worker.build_infer(wa, torch, "cuda")
    mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    base = {"model": a.model, "sdpa": a.sdpa, "mps": bool(mps) and os.path.exists(os.path.join(mps, "control")),
            "reps": a.reps}
    with torch.inference_mode():
        for _ in range(5):
            m(x)
        torch.cuda.synchronize()
        if "graph" in a.modes:
            g, y = worker.capture_graph(torch, lambda: m(x))
            hashes = {}
            for _ in range(a.reps):
                g.replay()
                torch.cuda.synchronize()
                h = worker.tensor_hash(y)
                hashes[h] = hashes.get(h, 0) + 1
            print(json.dumps(dict(base, mode="graph", distinct=len(hashes), counts=sorted(hashes.values())[::-1])),
                  flush=True)
            del g
        if "eager" in a.modes:
            order, seen = [], {}
            cur = []

            def hook(name):
                def f(_mod, _inp, out):
                    if isinstance(out, torch.Tensor):
                        cur.append((name, worker.tensor_hash(out)))
                return f

            hs = [mod.register_forward_hook(hook(n or "<model>")) for n, mod in m.named_modules()]
            outs = {}
            for _ in range(a.eager_reps):
                cur.clear()
                y = m(x)
                torch.cuda.synchronize()
                h = worker.tensor_hash(y)
                outs[h] = outs.get(h, 0) + 1
                for i, (name, hv) in enumerate(cur):
                    key = (i, name)
                    if key not in seen:
                        seen[key] = set()
                        order.append(key)
                    seen[key].add(hv)
            for hh in hs:
                hh.remove()
            varying = [n for (i, n) in order if len(seen[(i, n)]) > 1]
            print(json.dumps(dict(base, mode="eager", reps=a.eager_reps, distinct=len(outs), counts=sorted(outs.values())[::-1],
                                  modules=len(order), varying=len(varying), first_varying=varying[:5])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
