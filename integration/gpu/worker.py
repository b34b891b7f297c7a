#!/usr/bin/env python3
"""worker: one benchmark tenant process (unmodified PyTorch; DetShare, MPS or nothing is applied from outside).

Roles:
  infer    batch-1 inference (resnet50 | bert | llama-step) replayed through a CUDA graph, open-loop Poisson arrivals
           at --rate req/s (fixed seed, so every configuration sees the same arrival times); --calibrate N instead
           measures N back-to-back requests (solo capacity). `--model reclaim` is not a model but the reclaim probe
           (probes/reclaim.cu): each request needs every SM for 1 ms, and the result also says how long it waited
           for a neighbour's kernels to leave them.
  train    training steps (resnet50 | gpt2) as fast as possible; throughput = steps/s in the window.
  prefill  Llama-like prompt processing with Poisson arrivals; TTFT = arrival to the end of the prompt's forward.
  decode   Llama-like greedy decoding of a batch, one CUDA-graph step per token; inter-token gaps (TPOT).

Protocol (tally-bench's): build + warm up, write --ready FILE, wait for --go FILE (it holds the wall-clock start
time T0), run until T0 + --duration, write --out JSON with raw timings relative to T0. Nothing is aggregated here
(report.py does that). --device cpu and the *-tiny models exist so the code paths can be checked without a GPU.
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import sys
import time


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", required=True, choices=["infer", "train", "prefill", "decode"])
    ap.add_argument("--model", required=True,
                    help="infer: resnet50|bert|bert-2l|llama-step|llama-step-5l|llama-step-math(-tiny)|reclaim (GPU only); train: resnet50|gpt2|lin8192-bf16|lin8192-fp32(-tiny|-gemm|-opt); "
                         "prefill/decode: llama(-tiny)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True, help="result JSON path")
    ap.add_argument("--ready", help="file written when warmed up")
    ap.add_argument("--go", help="file to wait for; holds the start time (time.time())")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of measurement")
    ap.add_argument("--rate", type=float, default=0.0, help="Poisson arrival rate, requests/s (infer, prefill)")
    ap.add_argument("--load", type=float, default=0.0,
                    help="infer/prefill without --rate: measure solo capacity closed-loop first, then use "
                         "rate = load x capacity (do this only when running alone)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--calibrate", type=int, default=0, help="infer: measure N closed-loop requests and exit")
    ap.add_argument("--batch", type=int, default=0, help="training / decode batch (0: per-model default)")
    ap.add_argument("--seq", type=int, default=0, help="sequence / prompt length (0: per-model default)")
    ap.add_argument("--no-graph", action="store_true", help="infer/decode: do not use CUDA graphs")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--wait-timeout", type=float, default=300.0)
    ap.add_argument("--tag", default="", help="free text copied into the result (configuration name)")
    ap.add_argument("--stamp", action="store_true",
                    help="infer, GPU only: stamp each request on the GPU (probes/stamp.cu) to split its service time "
                         "into the wait before its first kernel ran and the span of its kernels")
    ap.add_argument("--l2-flush-mb", type=int, default=0,
                    help="infer: after each request, outside the timed span, read and write this many MiB (more than "
                         "the GPU's L2) so that the next request finds none of its data cached, as beside a trainer")
    a = ap.parse_args(argv)
    if a.stamp and (a.role != "infer" or a.device != "cuda" or a.model == "reclaim"):
        ap.error("--stamp: only for --role infer on --device cuda with a model (the reclaim probe stamps itself)")
    if a.l2_flush_mb < 0 or (a.l2_flush_mb and a.role != "infer"):
        ap.error("--l2-flush-mb=%d: a size in MiB >= 0, for --role infer only" % a.l2_flush_mb)
    return a


def tensor_hash(t):
    """sha256 of the raw bytes of a tensor (bit-equality, not closeness)."""
    import torch

    c = t.detach().contiguous().cpu()
    return hashlib.sha256(c.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


class Clock:
    def __init__(self, dev):
        import torch

        self.torch, self.cuda = torch, dev == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def wait_go(a):
    if a.ready:
        with open(a.ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(a.ready + ".tmp", a.ready)
    if not a.go:
        return time.time()
    deadline = time.time() + a.wait_timeout
    while not os.path.exists(a.go):
        if time.time() > deadline:
            sys.exit("worker: no go file %s after %.0f s" % (a.go, a.wait_timeout))
        time.sleep(0.005)
    with open(a.go) as f:
        t0 = float(f.read().strip())
    while time.time() < t0:
        time.sleep(min(0.001, max(0.0, t0 - time.time())))
    return t0


def arrivals(rate, duration, seed):
    """Poisson arrival offsets in [0, duration): same seed, same times in every configuration."""
    rng = random.Random(seed)
    out, t = [], 0.0
    if rate <= 0:
        return out
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(t)


def sleep_until(t_abs):
    while True:
        d = t_abs - time.time()
        if d <= 0:
            return
        time.sleep(d - 0.0005 if d > 0.002 else 0)


def capture_graph(torch, fn):
    """fn() captured as a CUDA graph after three warm-up calls on a side stream (PyTorch's recipe): (graph, output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def calibrate(step, clk, n):
    """Closed-loop service times: n requests, or (n = 0) as many as fit in ~3 s (at least 20, at most 500)."""
    times = []
    end = time.perf_counter() + 3.0
    while (len(times) < n) if n else (len(times) < 20 or (time.perf_counter() < end and len(times) < 500)):
        t = time.perf_counter()
        step()
        clk.sync()
        times.append(time.perf_counter() - t)
    return times


RECLAIM_GRID = 128  # blocks of the reclaim probe: one per SM of the widest grant (16 groups of 8 on an H100)
RECLAIM_SPIN_US = 1000  # each block holds its SM this long: a request that needs the whole GPU for ~1 ms


def probe_lib(torch, name):
    """probes/<name>.cu built with nvcc for this GPU (cached beside the source's hash), loaded with ctypes."""
    import ctypes
    import subprocess

    probes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes")
    src = os.path.join(probes, name + ".cu")
    h = hashlib.sha256()
    for path in [src] + sorted(glob.glob(os.path.join(probes, "*.cuh"))):  # the source and the headers it may use
        with open(path, "rb") as f:
            h.update(f.read())
    digest = h.hexdigest()[:12]
    major, minor = torch.cuda.get_device_capability()
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "detshare-probes")
    so = os.path.join(cache, "%s-%s-sm%d%d.so" % (name, digest, major, minor))
    if not os.path.exists(so):
        os.makedirs(cache, exist_ok=True)
        cmd = ["nvcc", "-O2", "-arch=sm_%d%d" % (major, minor), "-shared", "-Xcompiler", "-fPIC", "-o", so + ".tmp", src]
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit("worker: building the %s probe failed (%s): %s" % (name, " ".join(cmd), e))
        os.rename(so + ".tmp", so)
    return ctypes.CDLL(so)


def reclaim_lib(torch):
    import ctypes

    lib = probe_lib(torch, "reclaim")
    lib.reclaim_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    lib.reclaim_launch.argtypes = [ctypes.c_ulonglong]
    lib.reclaim_read.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_longlong)]
    return lib


class Stamps:
    """probes/stamp.cu around each request: when the request's first kernel ran and how long its kernels took on
    the GPU. begin()/end() go around the request's launches; read() gives the last n requests."""

    CAP = 1 << 15  # probes/stamp.cu kCap

    def __init__(self, torch):
        import ctypes

        self.torch, self.lib, self.launched = torch, probe_lib(torch, "stamp"), 0
        self.lib.stamp_begin.argtypes = [ctypes.c_ulonglong]
        self.lib.stamp_end.argtypes = [ctypes.c_ulonglong]
        self.lib.stamp_read.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_longlong)]
        if self.lib.stamp_init() != 0:
            sys.exit("worker: --stamp: stamp_init failed (see the probe's message above)")

    def begin(self):
        if self.lib.stamp_begin(self.torch.cuda.current_stream().cuda_stream) != 0:
            raise RuntimeError("stamp probe: begin failed")

    def end(self):
        if self.lib.stamp_end(self.torch.cuda.current_stream().cuda_stream) != 0:
            raise RuntimeError("stamp probe: end failed")
        self.launched += 1

    def read(self, n):
        """[start delay, GPU span] in microseconds for the last n requests; the start delay less the launch latency
        (the smallest start delay over every request kept, warm-up included)."""
        import ctypes

        k = min(self.launched, self.CAP)
        n = min(n, k)
        buf = (ctypes.c_longlong * (2 * k))()
        if k and self.lib.stamp_read(k, buf) != 0:
            raise RuntimeError("stamp probe: read failed")
        base = min(buf[2 * i] for i in range(k)) if k else 0
        rows = [[(buf[2 * i] - base) / 1e3, buf[2 * i + 1] / 1e3] for i in range(k)]
        return {"launch_latency_base": "min start delay over %d requests" % k, "us": rows[k - n:] if n else []}


class ReclaimProbe:
    """A request of the reclaim probe; call it like a model. read() gives the waits of the last n requests."""

    CAP = 1 << 14  # probes/reclaim.cu kCap

    def __init__(self, torch):
        self.torch, self.lib, self.launched = torch, reclaim_lib(torch), 0
        if self.lib.reclaim_init(RECLAIM_GRID, RECLAIM_SPIN_US) != 0:
            sys.exit("worker: --model reclaim: reclaim_init failed (see the probe's message above)")

    def __call__(self, x):
        if self.lib.reclaim_launch(self.torch.cuda.current_stream().cuda_stream) != 0:
            raise RuntimeError("reclaim probe: launch failed")
        self.launched += 1
        return x

    def eval(self):
        return self

    def to(self, _dev):
        return self

    def read(self, n):
        """[arrive, first block, last block] in microseconds after the request's launch, for the last n requests,
        less the launch latency (the smallest delay of `arrive` over every request kept, warm-up included)."""
        import ctypes

        k = min(self.launched, self.CAP)
        n = min(n, k)
        buf = (ctypes.c_longlong * (3 * k))()
        if self.lib.reclaim_read(k, buf) != 0:
            raise RuntimeError("reclaim probe: read failed")
        base = min(buf[3 * i] for i in range(k))
        rows = [[(buf[3 * i + j] - base) / 1e3 for j in range(3)] for i in range(k)]
        return {"launch_latency_base": "min arrive delay over %d requests" % k, "grid": RECLAIM_GRID,
                "spin_us": RECLAIM_SPIN_US, "waits_us": rows[k - n:] if n else []}


def build_infer(a, torch, dev):
    import models

    tiny = a.model.endswith("-tiny")
    if a.model == "reclaim":
        if dev != "cuda":
            sys.exit("worker: --model reclaim measures SMs: it needs --device cuda")
        return ReclaimProbe(torch), torch.zeros(1, device=dev), "probe"
    if a.model.startswith("resnet50"):
        m, impl = models.resnet50()
        side = 64 if tiny else 224
        x = torch.randn(1, 3, side, side, device=dev, generator=None)
    elif a.model.startswith("bert"):
        m, impl = models.Encoder(**models.MODEL_SIZES[a.model]), "builtin"
        seq = a.seq or (16 if tiny else 128)
        x = torch.randint(0, 1000, (1, seq), device=dev)
    elif a.model.startswith("llama-step"):
        # llama-step-math: the textbook attention instead of SDPA's fused kernels, whose output varies from replay
        # to replay of the graph under MPS even with no other client (mpsdet.sh)
        models.FORCE_MATH_ATTENTION = "-math" in a.model
        # one LLM decode step, batch 1, against a KV cache of a fixed length: every request is the same step (same
        # position, the same cache entry rewritten with the same values), so outputs are comparable bit for bit
        kw = models.MODEL_SIZES["llama-tiny" if tiny else ("llama-5l" if "-5l" in a.model else "llama")]
        dtype = torch.float16 if dev == "cuda" else torch.float32
        with torch.device(dev):
            llm = models.Llama(**kw).to(dtype).eval()
        ctx = a.seq or (16 if tiny else 512)
        cache = llm.new_cache(1, ctx + 1, dev, dtype)
        with torch.inference_mode():
            llm(torch.randint(0, 1000, (1, ctx), device=dev), torch.arange(ctx, device=dev), cache, True)
        pos = torch.full((1,), ctx, dtype=torch.long, device=dev)

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.llm = llm

            def forward(self, tok):
                return self.llm(tok, pos, cache, False)

        m, impl = Step(), "builtin"
        x = torch.randint(0, 1000, (1, 1), device=dev)
    else:
        sys.exit("worker: --model %r: infer takes resnet50, bert, bert-2l, llama-step, llama-step-5l, llama-step-math (or -tiny), reclaim"
                 % a.model)
    m = m.to(dev).eval()
    return m, x, impl


def run_infer(a):
    import torch

    dev = a.device
    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = False  # algorithm choice must not depend on timing (bit-equality)
    m, x, impl = build_infer(a, torch, dev)
    clk = Clock(dev)
    static_x = x.clone()
    with torch.inference_mode():
        for _ in range(a.warmup):
            y = m(static_x)
        clk.sync()
        graph = None
        probe = isinstance(m, ReclaimProbe)  # each request's launch is stamped on the host: never a graph
        if dev == "cuda" and not a.no_graph and not probe:
            graph, static_y = capture_graph(torch, lambda: m(static_x))

            def step():
                graph.replay()
                return static_y
        else:
            def step():
                return m(static_x)
        for _ in range(a.warmup):
            y = step()
        clk.sync()
        ref_hash = tensor_hash(y)
        res = {"role": "infer", "model": a.model, "impl": impl, "graph": graph is not None, "tag": a.tag}
        if a.calibrate or (a.load and not a.rate):
            times = calibrate(step, clk, a.calibrate or 0)
            if a.calibrate:
                res.update(calibrate=times)
                return res
            a.rate = a.load * len(times) / sum(times)
            res.update(calibration={"requests": len(times), "mean_s": sum(times) / len(times), "load": a.load})
        stamps = Stamps(torch) if a.stamp else None
        flush = torch.zeros(a.l2_flush_mb << 18, device=dev) if a.l2_flush_mb else None
        if stamps:  # a few idle requests give the launch latency the start delays are measured from
            for _ in range(a.warmup):
                stamps.begin()
                step()
                stamps.end()
                clk.sync()
        t0 = wait_go(a)
        arr = arrivals(a.rate, a.duration, a.seed)
        reqs, hashes = [], {ref_hash: 0}
        for off in arr:
            sleep_until(t0 + off)
            st = time.time()
            if stamps:
                stamps.begin()
            y = step()
            if stamps:
                stamps.end()
            clk.sync()
            en = time.time()
            reqs.append((off, st - t0, en - t0))
            h = tensor_hash(y)  # outside the timed span
            hashes[h] = hashes.get(h, 0) + 1
            if flush is not None:
                flush.add_(1.0)
                clk.sync()
            if time.time() > t0 + a.duration + 30:  # hopelessly behind: stop, report what was served
                break
        res.update(t0=t0, duration=a.duration, rate=a.rate, offered=len(arr), requests=reqs,
                   output_hash=ref_hash, output_hashes=hashes)
        if probe:
            res["reclaim"] = m.read(len(reqs))
        if stamps:
            res["stamps"] = stamps.read(len(reqs))
        if flush is not None:
            res["l2_flush_mb"] = a.l2_flush_mb
        return res


def build_train(a, torch, dev):
    """The trainer of --model: (step, impl, batch); step() runs one training step and returns its loss."""
    import models

    tiny = a.model.endswith("-tiny")
    if a.model.startswith("resnet50"):
        m, impl = models.resnet50()
        bs = a.batch or (4 if tiny else 64)
        side = 64 if tiny else 224
        x = torch.randn(bs, 3, side, side, device=dev)
        y = torch.randint(0, 1000, (bs,), device=dev)

        def loss_fn():
            return torch.nn.functional.cross_entropy(m(x), y)
    elif a.model.startswith("gpt2"):
        m, impl = models.GPT(**models.MODEL_SIZES[a.model]), "builtin"
        bs = a.batch or (2 if tiny else 8)
        seq = a.seq or (32 if tiny else 512)
        vocab = m.head.out_features
        ids = torch.randint(0, vocab, (bs, seq + 1), device=dev)

        def loss_fn():
            logits = m(ids[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
    elif a.model.startswith("lin8192"):
        # 6 x Linear(8192) trained with AdamW: lin8192-bf16 (bf16 weights, drives an H100 to its power limit) or
        # lin8192-fp32 (fp32, no TF32)
        d = 256 if tiny else 8192
        dtype = torch.bfloat16 if "bf16" in a.model and dev == "cuda" else torch.float32
        with torch.device(dev):
            m = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(6)]).to(dtype)
        impl = "builtin"
        bs = a.batch or (8 if tiny else (2048 if dtype == torch.bfloat16 else 512))
        x = torch.randn(bs, d, device=dev, dtype=dtype)

        def loss_fn():
            return m(x).float().pow(2).mean()
    else:
        sys.exit("worker: --model %r: train takes resnet50, gpt2, lin8192-bf16, lin8192-fp32 (or -tiny)" % a.model)
    m = m.to(dev).train()
    if a.model.startswith("lin8192"):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)

    phase = a.model.split("@")[0].rsplit("-", 1)[-1] if a.model.startswith("lin8192") else ""
    if phase == "gemm":
        # issue 26's interference split: only the forward and backward GEMMs of a step, no optimizer (the weights
        # never change, so every step's loss is the same)
        def step():
            m.zero_grad(set_to_none=True)
            loss = loss_fn()
            loss.backward()
            return loss
        return step, impl, bs
    if phase == "opt":
        # ... and only the optimizer: gradients computed once, then AdamW's memory-bound update step after step
        loss = loss_fn()
        loss.backward()

        def step():
            opt.step()
            return m[0].weight[0, :8].float().sum()
        return step, impl, bs

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    return step, impl, bs


def loss_facts(losses):
    """The first losses as text (repr: nan and inf survive JSON) and whether all are finite: a trainer whose losses
    are NaN is not training, whatever its steps per second say (issue 26: bf16 under MPS's thread percentage)."""
    vals = [float(x) for x in losses]
    return {"losses_first5": [repr(v) for v in vals], "losses_finite": all(math.isfinite(v) for v in vals)}


def cublas_sm_target(torch, n):
    """Tells cuBLAS (cublasSetSmCountTarget on PyTorch's handle) and PyTorch's cuBLASLt calls (its SM carveout) to
    pick GEMM kernels for n SMs, as an application that knows its share of the GPU could; returns what each accepted.
    Only for the benchmark's diagnostics (BENCH_CUBLAS_SM_TARGET, smtarget.py): DetShare never does this."""
    import ctypes

    info = {}
    torch.cuda.current_blas_handle()  # the handle exists before the target is set on it
    reported = torch.cuda.get_device_properties(0).multi_processor_count
    if hasattr(torch._C, "_set_sm_carveout_experimental"):
        try:
            torch._C._set_sm_carveout_experimental(reported - n)  # PyTorch targets reported - carveout SMs
            info["carveout"] = reported - n
        except Exception as e:  # noqa: BLE001 - say what this PyTorch refused
            info["carveout_error"] = str(e)
    else:
        info["carveout_error"] = "this PyTorch has no _set_sm_carveout_experimental"
    lib = None
    with open("/proc/self/maps") as f:
        for line in f:
            if "/libcublas.so" in line.split()[-1]:
                lib = ctypes.CDLL(line.split()[-1])
                break
    if lib is None:
        info["cublas_error"] = "libcublas is not loaded"
        return info
    h = ctypes.c_void_p(torch.cuda.current_blas_handle())
    info["cublas_set_rc"] = lib.cublasSetSmCountTarget(h, ctypes.c_int(n))  # 7: above what the process is told
    got = ctypes.c_int(-1)
    lib.cublasGetSmCountTarget(h, ctypes.byref(got))
    info["cublas_target"] = got.value
    return info


def run_train(a):
    import torch

    dev = a.device
    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = False
    sm_target = {}
    if os.environ.get("BENCH_CUBLAS_SM_TARGET") and dev == "cuda":
        sm_target = cublas_sm_target(torch, int(os.environ["BENCH_CUBLAS_SM_TARGET"]))
    step, impl, bs = build_train(a, torch, dev)
    clk = Clock(dev)
    for _ in range(a.warmup):
        step()
    clk.sync()
    t0 = wait_go(a)
    ends, losses = [], []
    while time.time() < t0 + a.duration:
        loss = step()
        clk.sync()
        ends.append(time.time() - t0)
        if len(losses) < 5:
            losses.append(loss.detach())
    return {"role": "train", "model": a.model, "impl": impl, "batch": bs, "tag": a.tag, "t0": t0,
            "duration": a.duration, "step_ends": ends, "sm_target": sm_target,
            "loss_hash_first5": tensor_hash(torch.stack(losses)) if losses else "", **loss_facts(losses)}


def build_llama(a, torch, dev):
    import models

    kw = models.MODEL_SIZES["llama-tiny" if a.model.endswith("-tiny") else "llama"]
    m = models.Llama(**kw)
    dtype = torch.float16 if dev == "cuda" else torch.float32
    return m.to(dev, dtype).eval(), dtype


def run_prefill(a):
    import torch

    dev = a.device
    torch.manual_seed(a.seed)
    m, dtype = build_llama(a, torch, dev)
    seq = a.seq or (16 if a.model.endswith("-tiny") else 1024)
    vocab = m.head.out_features
    cache = m.new_cache(1, seq, dev, dtype)
    ids = torch.randint(0, vocab, (1, seq), device=dev)
    pos = torch.arange(seq, device=dev)
    clk = Clock(dev)
    with torch.inference_mode():
        for _ in range(a.warmup):
            out = m(ids, pos, cache, True)
        clk.sync()
        ref = tensor_hash(out)
        calib = None
        if a.load and not a.rate:
            times = calibrate(lambda: m(ids, pos, cache, True), clk, 0)
            a.rate = a.load * len(times) / sum(times)
            calib = {"requests": len(times), "mean_s": sum(times) / len(times), "load": a.load}
        t0 = wait_go(a)
        arr = arrivals(a.rate, a.duration, a.seed)
        reqs = []
        for off in arr:
            sleep_until(t0 + off)
            st = time.time()
            out = m(ids, pos, cache, True)
            first = out.argmax(-1)
            clk.sync()
            en = time.time()
            reqs.append((off, st - t0, en - t0))
            if time.time() > t0 + a.duration + 30:
                break
            del first
    return {"role": "prefill", "model": a.model, "tag": a.tag, "t0": t0, "duration": a.duration, "rate": a.rate,
            "prompt_len": seq, "offered": len(arr), "requests": reqs, "output_hash": ref, "calibration": calib}


def run_decode(a):
    import torch

    dev = a.device
    torch.manual_seed(a.seed)
    m, dtype = build_llama(a, torch, dev)
    bs = a.batch or (2 if a.model.endswith("-tiny") else 16)
    prompt = 16
    max_seq = a.seq or (64 if a.model.endswith("-tiny") else 512)
    vocab = m.head.out_features
    cache = m.new_cache(bs, max_seq, dev, dtype)
    clk = Clock(dev)
    with torch.inference_mode():
        p_ids = torch.randint(0, vocab, (bs, prompt), device=dev)
        m(p_ids, torch.arange(prompt, device=dev), cache, True)
        tok = torch.zeros(bs, 1, dtype=torch.long, device=dev)
        pos = torch.full((1,), prompt, dtype=torch.long, device=dev)

        def raw_step():
            logits = m(tok, pos, cache, False)
            tok.copy_(logits.argmax(-1, keepdim=True))
            pos.add_(1)
            return logits

        graph = None
        if dev == "cuda" and not a.no_graph:
            graph, static_logits = capture_graph(torch, raw_step)

            def step():
                graph.replay()
                return static_logits
        else:
            step = raw_step

        def reset():
            tok.zero_()
            pos.fill_(prompt)

        reset()
        for _ in range(a.warmup):
            step()
        clk.sync()
        # the reference sequence: deterministic greedy tokens from the same state (bit-equality across configs)
        reset()
        gen = []
        for _ in range(32):
            step()
            gen.append(tok.clone())
        clk.sync()
        ref = tensor_hash(torch.cat(gen, 1))
        reset()
        t0 = wait_go(a)
        stamps, n = [], 0
        while time.time() < t0 + a.duration:
            step()
            clk.sync()
            stamps.append(time.time() - t0)
            n += 1
            if prompt + n >= max_seq - 1:  # the batch's sequences are done: start new ones
                reset()
                n = 0
    return {"role": "decode", "model": a.model, "tag": a.tag, "t0": t0, "duration": a.duration, "batch": bs,
            "graph": graph is not None, "token_stamps": stamps, "output_hash": ref}


def env_info():
    import torch

    info = {"torch": torch.__version__, "pid": os.getpid(),
            "preload": os.environ.get("LD_PRELOAD", ""), "quota_file": os.environ.get("DETSHARE_QUOTA_FILE", ""),
            "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""),
            "mps_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
    return info


def main(argv=None):
    a = parse(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("worker: PyTorch is not installed (python3 -c 'import torch' fails); the workloads need it")
    fn = {"infer": run_infer, "train": run_train, "prefill": run_prefill, "decode": run_decode}[a.role]
    res = fn(a)
    res["env"] = env_info()
    with open(a.out + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(a.out + ".tmp", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
