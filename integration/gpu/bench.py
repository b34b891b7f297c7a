#!/usr/bin/env python3
"""bench: DetShare's side-by-side GPU benchmark (DESIGN.md §5 protocol), one configuration after another, one run.

Configurations, for each pair of a latency-critical (LC) and a best-effort (BE) workload:
  alone       each workload by itself (LC at Poisson load --load of its own solo capacity, measured first)
  alone-lib   the same under libdetshare with a grant of every SM group (solo overhead of the library)
  alone-grant LC alone under MPS + libdetshare with its DetShare grant (--lc-groups): isolation baseline
  timeslice   both at once, no MPS: the driver time-slices the two processes
  mps         both at once under one MPS server (private pipe directory), no limits
  mps-pct     MPS, BE with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = its share of SMs (LC's groups left out)
  mps-prio    MPS, BE with CUDA_MPS_CLIENT_PRIORITY=1 (below normal), LC at normal priority (coloc suite only)
  detshare    MPS + libdetshare; the LC pinned to its --lc-groups guarantee (a static partition: exactly those
              groups), the BE keeps the complement
Every library configuration runs under the real `detshare sched` (its own MPS daemon, its policy from a generated
config) with each worker started by `detshare run` (--detshare, `make build`); alone-lib is the BE alone (every
group), alone-grant the LC alone and pinned.
LLM pair (a Llama-like prefill process with Poisson prompts + a decode process, both best-effort tenants with their
  roles): alone, timeslice, mps, detshare-to (policy throughput-oriented: equal split of groups while both are busy,
  all groups to whichever is busy alone) and detshare-tpot (policy tpot-first: decode picks first, its weight times
  --decode-boost, scheduler.decode_boost).
Training pair (--suite train): two trainings, alone / timeslice / mps / detshare (two best-effort tenants: equal
  split).
Co-location (--suite coloc, issue 12): each LC workload of --coloc-lc (batch-1 transformer encoder `bert`,
  `resnet50`, an LLM decode step `llama-step`, all CUDA-graph replays at Poisson load --load of their solo
  capacity) beside each trainer of --coloc-be (6 x Linear(8192) AdamW in bf16 `lin8192-bf16`, which drives an H100
  to its power limit, and in fp32 `lin8192-fp32`): alone (each workload once), alone-mps (each LC alone under plain
  MPS: what MPS itself costs it), timeslice, mps, mps-pct,
  detshare-static (the real scheduler, LC pinned to its --lc-groups guarantee: the policy before issue 12) and
  detshare-dynamic (LC expands over the trainer while busy, trainer throttled to its floor behind the dispatch
  gate; --lc-slo-ms sets the LC's slo-p99). mps-prio and detshare-dynamic-noprio (detshare-dynamic with
  DETSHARE_MPS_PRIORITY=off: every tenant at normal MPS priority) isolate what the MPS client priority the library
  sets from the tier contributes. detshare-dynamic-pause is detshare-dynamic with scheduler.be_floor = 0 (the trainer
  pauses while the LC is busy). detshare-temporal is the real scheduler without MPS (mps.enable = false): the driver
  time-slices the processes, the scheduler's time token stops the trainer's launches while the LC is busy, the LC
  launches without waiting for the token behind a lower tier, and the trainer's queue is bounded by the dispatch gate
  (what the LC waits for). detshare-shared is the real scheduler with the LC labelled best-effort beside the trainer
  and scheduler.share_overlap = true: both run on every group under MPS, nothing protects the LC (DetShare's
  setting at plain MPS's end of the frontier, issue 26); detshare-timeshared is the same without MPS, where
  share_overlap leaves the two to the driver's time-slicing (DetShare's setting at time-slicing's end). `--coloc-lc reclaim` is the reclaim probe instead of a
  model (worker.py, probes/reclaim.cu; GPU only, never part of the default list): each request needs every SM for
  1 ms, and report.py shows how long it waited for the trainer's kernels to leave them (the dispatch gate's bound).
  `--coloc-lc llama-step-math` is llama-step with the textbook attention: SDPA's fused kernels make llama-step's
  output vary between replays under MPS even alone (mpsdet.sh), which no MPS-based sharing can keep bit-identical.
  Where an LC's time goes: `--configs …,alone-flush` (never run unless named) runs each LC alone with 256 MiB read
  and written between its requests (what a trainer's traffic through L2 alone costs it), and `--lc-stamp` stamps
  every LC request on the GPU (probes/stamp.cu) so that report.py splits its service time into the wait before its
  first kernel ran and the span of its kernels. `--coloc-be lin8192-bf16-tiny` (GPU only) is the bf16 trainer at
  d=256, batch 8: kernels of a few microseconds, so that what an LC waits for beside it is the switch to its own
  context, not a trainer kernel.
Board power, power limit and SM clock are logged every 100 ms for the whole run (OUTDIR/power.csv, nvidia-smi
queries only) and summarised per case by report.py.

Raw worker results go to OUTDIR/raw/, logs to OUTDIR/logs/, the plan and the environment to OUTDIR/meta.json;
report.py turns them into OUTDIR/results.{md,json} and the CDF plot. Nothing here is a simulation: on a machine
without a GPU use --device cpu (tiny models, no MPS; the scheduler describes the simulated GPU, a test double) only
to check the harness itself.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

INFER_PAIRS = {"quick": [("resnet50", "resnet50")],
               "default": [("resnet50", "resnet50"), ("bert", "gpt2")],
               "full": [("resnet50", "resnet50"), ("resnet50", "gpt2"), ("bert", "resnet50"), ("bert", "gpt2")]}
# ordered so that MPS starts once per pair (alone, alone-lib and timeslice run without it)
PAIR_CONFIGS = ["alone", "alone-lib", "timeslice", "alone-grant", "mps", "mps-pct", "detshare"]
LLM_CONFIGS = ["alone", "timeslice", "mps", "detshare-to", "detshare-tpot"]
TRAIN_CONFIGS = ["alone", "timeslice", "mps", "detshare", "detshare-share"]  # detshare-share: scheduler.share_overlap
COLOC_CONFIGS = ["alone", "alone-mps", "timeslice", "mps", "mps-pct", "mps-prio", "detshare-static", "detshare-dynamic",
                 "detshare-dynamic-pause", "detshare-dynamic-noprio", "detshare-temporal"]
COLOC_LC = ["bert", "resnet50", "llama-step"]
COLOC_PROBES = ["reclaim"]  # accepted by --coloc-lc, never run unless named
COLOC_EXTRA = ["llama-step-math",  # likewise: llama-step with the textbook attention (bit-stable under MPS)
               "bert-2l", "llama-step-5l",  # issue 26's short LC (~0.4 ms) and ~1 ms decode step
               "llama-step-math-5l"]  # the 1 ms step with the textbook attention (bit-stable under MPS)
# Issue 26's frontier sweep: configurations with a number in their name (coloc suite only, run in the order given).
#   mps-pct<P>         MPS, the trainer at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P
#   detshare-floor<N>  the real scheduler, LC expanding over throttled neighbours (scheduler.lc_reserve = 0),
#                      scheduler.be_floor = N groups
#   detshare-reserve<F> the real scheduler, no slo-p99, scheduler.lc_reserve = F (the default is the scheduler's)
#   detshare-overlap<F> as detshare-reserve<F>, plus scheduler.lc_overlap = true (the LC also runs on the trainer's
#                      groups, its partition exclusive; the trainer keeps the rest and never flips)
#   detshare-pinned<N> the real scheduler, LC pinned to N groups (a static partition: the trainer keeps the rest)
#   detshare-slo<X>x   the real scheduler, the LC's slo-p99 = X x its solo service P99 measured first in this run
#   detshare-sloov<X>x as detshare-slo<X>x, plus scheduler.lc_overlap = true
#   detshare-default   the real scheduler with its defaults (LC --sm at --lc-groups, no SLO)
#   <detshare-default or a numbered detshare configuration>-n<N>  the same with scheduler.narrow_groups = N
#                      (detshare-overlap0.25-n6); and -n<N>-noprio: also every tenant at normal MPS client priority
#                      (DETSHARE_MPS_PRIORITY=off), so the LC does not go first on the groups it shares; or
#                      -n<N>-lend: also the LC started with --lend, so its idle partition is lent to the trainer
#                      (which is gated while it borrows) and taken back when a request arrives
#   detshare-shared    the real scheduler, the LC labelled best-effort, scheduler.share_overlap = true: both tenants
#                      run on every group, as under plain MPS, with nothing protecting the LC (not numbered, but run
#                      only when named)
#   detshare-timeshared detshare-shared without MPS (mps.enable = false): with nobody latency-critical, share_overlap
#                      leaves the two to the driver's time-slicing (unrestricted grants, no token, no gate), as
#                      time-slicing does, with nothing protecting the LC (run only when named)
#   hami-sm<P>         HAMi-core (--hami-lib, built by hami.sh on the GPU machine): no MPS, the trainer preloads
#                      libvgpu.so with CUDA_DEVICE_SM_LIMIT=P (its SM utilisation limit), the LC runs unlimited
#   trainer-mps<P>     each trainer alone under MPS at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P (no LC)
#   trainer-hami<P>    each trainer alone under HAMi-core at CUDA_DEVICE_SM_LIMIT=P, no MPS (no LC): whether the limit
#                      applies to it (report.py reads HAMi-core's log) and what it leaves the trainer
#   trainer-sm<S>      each trainer alone under the real scheduler, pinned to S SMs (a latency-critical tenant with
#                      --sm S --pinned, so that nothing narrows it): what its own kernels do on that many SMs, against
#                      what MPS's thread percentage makes of them (cuBLAS picks other kernels for fewer SMs)
PARAM_CONFIGS = (("mps-pct", r"mps-pct(\d+)"), ("detshare-floor", r"detshare-floor(\d+)"),
                 ("detshare-pinned", r"detshare-pinned(\d+)"), ("detshare-slo", r"detshare-slo(\d+(?:\.\d+)?)x"),
                 ("detshare-reserve", r"detshare-reserve(\d+(?:\.\d+)?)"),
                 ("detshare-overlap", r"detshare-overlap(\d+(?:\.\d+)?)"),
                 ("detshare-sloov", r"detshare-sloov(\d+(?:\.\d+)?)x"),
                 # the default partition with scheduler.narrow_groups = N (0: memory-bound kernels on the whole grant)
                 ("detshare-narrow", r"detshare-narrow(\d+)"),
                 # the trainer alone on part of the GPU: under MPS at P %, under DetShare pinned to S SMs, or under
                 # HAMi-core at an SM limit of P % (does its limit apply to this trainer at all?)
                 ("trainer-mps", r"trainer-mps(\d+)"), ("trainer-sm", r"trainer-sm(\d+)"),
                 ("trainer-hami", r"trainer-hami(\d+)"),
                 # HAMi-core's SM utilisation limit on the trainer (a peer, issue 26)
                 ("hami-sm", r"hami-sm(\d+)"))
TRAINER_ALONE = ("trainer-mps", "trainer-sm", "trainer-hami")
HAMI = ("hami-sm", "trainer-hami")  # the configurations that preload HAMi-core (--hami-lib)
# HAMi-core's limiter is a feedback loop over seconds: every 120 ms its watcher refills a token bucket (counted in
# blocks launched, up to 2048 x SMs x 32) from NVML's per-process SM utilisation of the last second, so a process
# starts with its bucket filling and runs about unlimited for its first 3-4 s, then cycles between unlimited and
# stopped with a period of about 3-4 s (issue 26, run D of BENCHMARKS.md). A shorter window measures its start, not
# its limit.
HAMI_MIN_DURATION = 10.0


def coloc_case(lc, be, cfg):
    """The name of a co-location case: an LC beside a trainer under one configuration."""
    return "coloc/%s+%s/%s" % (lc, be, cfg)


def sched_policy(cfg):
    """The scheduler policy of a DetShare configuration (scheduler.policy)."""
    return "tpot-first" if cfg == "detshare-tpot" else "throughput-oriented"


def case_slug(name):
    """A case's name as its files are named (raw/<slug>__<worker>.json, logs/<slug>__status.json, ...); report.py
    finds them by it."""
    return name.replace("/", "_").replace("+", "-")


def narrow_suffix(cfg):
    """(base, N) of a DetShare configuration with the suffix -n<N> (scheduler.narrow_groups = N on top of the base
    configuration, e.g. detshare-overlap0.25-n6), -n<N>-noprio (and every tenant at normal MPS priority, which
    Runner.case sets from the name's end) or -n<N>-lend (and the LC lends its idle partition, Runner.tenant_flags),
    else (cfg, None)."""
    import re
    m = re.fullmatch(r"(detshare-.+)-n(\d+)(?:-noprio|-lend)?", cfg)
    return (m.group(1), int(m.group(2))) if m else (cfg, None)


def param_config(cfg):
    """(family, number) of a numbered configuration such as mps-pct67 or detshare-slo1.5x, else (None, None); a
    -n<N> suffix (narrow_suffix) does not change either."""
    import re
    cfg = narrow_suffix(cfg)[0]
    for fam, rx in PARAM_CONFIGS:
        m = re.fullmatch(rx, cfg)
        if m:
            return fam, float(m.group(1))
    return None, None
COLOC_BE = ["lin8192-bf16", "lin8192-fp32"]
# accepted by --coloc-be on a GPU, never run unless named: the same trainer at d=256, batch 8, whose kernels last a few
# microseconds, so that what an LC waits for beside it is the switch to its own context rather than a trainer kernel
COLOC_BE_EXTRA = ["lin8192-bf16-tiny",
                  # the two phases of a step apart, to tell which one slows the LC (issue 26): the forward and backward
                  # GEMMs only, and the optimizer's memory-bound update only
                  "lin8192-fp32-gemm", "lin8192-fp32-opt", "lin8192-bf16-gemm", "lin8192-bf16-opt"]
COLOC_OPTIONAL = ["alone-flush"]  # accepted by --configs, never run unless named
COLOC_NAMED = ["detshare-shared", "detshare-timeshared"]  # run only when named (issue 26's frontier sweep)
# the DetShare configurations where the LC is labelled best-effort beside the trainer under share_overlap
SHARED = ("detshare-shared", "detshare-timeshared")
NO_MPS = ("detshare-temporal", "detshare-timeshared")  # the real scheduler with mps.enable = false
L2_FLUSH_MB = 256  # alone-flush: more than any GPU's L2 (H100: 50 MB)
SUITES = ["infer", "llm", "train", "coloc"]


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help="one pair, short windows (about 4 minutes on an H100)")
    ap.add_argument("--suite", default="infer,llm", help="comma list of %s (default infer,llm)" % ",".join(SUITES))
    ap.add_argument("--pairs", default="", choices=["", "quick", "default", "full"],
                    help="LC/BE model pairs for the infer suite (default: quick with --quick, else default)")
    ap.add_argument("--configs", default="", help="comma list restricting the configurations run")
    ap.add_argument("--duration", type=float, default=0, help="measurement seconds per configuration "
                                                              "(default 6 with --quick, else 8; 10 when a HAMi-core "
                                                              "configuration runs on the GPU, at least 10 there)")
    ap.add_argument("--load", type=float, default=0.5, help="LC Poisson load as a fraction of its solo capacity")
    ap.add_argument("--lc-groups", type=int, default=4, help="SM groups guaranteed to LC (H100: 4 x 8 = 32 SMs)")
    ap.add_argument("--be-sm-target", type=int, default=0,
                    help="diagnostic, GPU only: every trainer except in `alone` tells cuBLAS and PyTorch's cuBLASLt "
                         "calls to pick GEMM kernels for this many SMs (worker.py cublas_sm_target), as an "
                         "application that knows its share could; DetShare never does this (0: off)")
    ap.add_argument("--hami-lib", default=os.path.join(REPO, "build", "hami", "libvgpu.so"),
                    help="HAMi-core's libvgpu.so for the hami-sm<P> configurations (hami.sh builds it there)")
    ap.add_argument("--be-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for every trainer in every configuration, `alone` included "
                         "(repeatable), e.g. DISABLE_ADDMM_CUDA_LT=1, with which PyTorch's bf16 Linear computes "
                         "finite values under MPS at 67 and 80 %% of threads on the H100")
    ap.add_argument("--decode-boost", type=int, default=0,
                    help="detshare-tpot: scheduler.decode_boost, the decode tenant's weight multiplier under "
                         "tpot-first (0: the scheduler's default)")
    ap.add_argument("--tpot-slo-ms", type=float, default=100.0)
    ap.add_argument("--train-pairs", default="resnet50:gpt2",
                    help="train suite: comma list of trainer pairs A:B, each of resnet50, gpt2, lin8192-bf16, "
                         "lin8192-fp32, with @N for batch N (resnet50@16: a trainer that does not fill an H100)")
    ap.add_argument("--coloc-lc", default=",".join(COLOC_LC), help="coloc suite: LC workloads (comma list of %s; also "
                    "llama-step-math, or the probe `reclaim`)" % ", ".join(COLOC_LC))
    ap.add_argument("--coloc-be", default=",".join(COLOC_BE), help="coloc suite: trainers (comma list of %s; also "
                    "%s, GPU only: kernels of a few us)" % (", ".join(COLOC_BE), ", ".join(COLOC_BE_EXTRA)))
    ap.add_argument("--be-floor", type=int, default=None,
                    help="coloc suite, the real scheduler: scheduler.be_floor, the SM groups a throttled trainer keeps "
                         "(0 pauses it; default: the scheduler's)")
    ap.add_argument("--gate-depth", type=int, default=0,
                    help="scheduler.gate_depth for the DetShare scheduler: kernels a gated tenant may have in flight "
                         "per stream (0: the scheduler's default)")
    ap.add_argument("--gate-budget-us", type=int, default=0,
                    help="coloc suite, the real scheduler: scheduler.gate_budget in microseconds (0: the default)")
    ap.add_argument("--lc-lend", action="store_true",
                    help="detshare-dynamic: the LC lends its idle guarantee too (the trainer gets every group while "
                         "the LC is idle)")
    ap.add_argument("--lc-stamp", action="store_true",
                    help="coloc suite, GPU only: every LC request stamped on the GPU (worker.py --stamp, "
                         "probes/stamp.cu): report.py splits its service time into the wait before its first kernel "
                         "ran and the span of its kernels")
    ap.add_argument("--lc-slo-ms", type=float, default=0.0,
                    help="detshare-dynamic: the LC's slo-p99 in ms (0: none, the LC takes every group while busy)")
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "lib", "libdetshare.so"))
    # accepted for old command lines: the real scheduler is the only one (the Python stand-in is gone)
    ap.add_argument("--scheduler", default="detshare", help=argparse.SUPPRESS)
    ap.add_argument("--detshare", default=os.path.join(REPO, "build", "bin", "detshare"),
                    help="the detshare binary: `detshare sched` grants SMs and `detshare run` starts the workers "
                         "in the library configurations")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the workers (needs torch)")
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: tiny models, no MPS, no library: checks the harness on a machine without a GPU")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (cases, environments) and exit")
    ap.add_argument("--worker-timeout", type=float, default=240.0, help="seconds a case may take beyond its window")
    a = ap.parse_args(argv)
    a.suites = [s for s in a.suite.split(",") if s]
    for s in a.suites:
        if s not in SUITES:
            ap.error("--suite: %r is not one of %s" % (s, ", ".join(SUITES)))
    if a.be_sm_target < 0 or (a.be_sm_target and a.device == "cpu"):
        ap.error("--be-sm-target %d: a number of SMs >= 1 (0: off), on --device cuda only" % a.be_sm_target)
    a.be_env_map = {}
    for kv in a.be_env:
        k, eq, v = kv.partition("=")
        if not eq or not k or not k.replace("_", "").isalnum() or k.startswith(("CUDA_MPS_", "DETSHARE_", "LD_")):
            ap.error("--be-env %r: KEY=VALUE with KEY a variable name, not one the harness sets itself "
                     "(CUDA_MPS_*, DETSHARE_*, LD_*)" % kv)
        a.be_env_map[k] = v
    a.only = set(c for c in a.configs.split(",") if c)
    known = (set(PAIR_CONFIGS) | set(LLM_CONFIGS) | set(TRAIN_CONFIGS) | set(COLOC_CONFIGS) | set(COLOC_OPTIONAL) |
             set(COLOC_NAMED))
    known.add("detshare-default")
    for c in a.only:
        fam, n = param_config(c)
        if fam in HAMI and not 1 <= n <= 100:
            ap.error("--configs %s: HAMi-core's SM limit is a percentage 1..100" % c)
        if fam in HAMI and a.device == "cpu" and not a.dry_run:
            ap.error("--configs %s: HAMi-core limits a GPU; on --device cpu only with --dry-run" % c)
        if fam in HAMI and a.device == "cuda" and not os.path.isfile(a.hami_lib):
            ap.error("--configs %s: HAMi-core's library %s is missing (build it on the GPU machine: bash "
                     "integration/gpu/hami.sh SRC, or pass --hami-lib)" % (c, a.hami_lib))
        if fam in ("mps-pct", "trainer-mps") and not 1 <= n <= 100:
            ap.error("--configs %s: the thread percentage must be 1..100" % c)
        if fam == "trainer-sm" and n < 1:
            ap.error("--configs %s: the trainer needs at least one SM" % c)
        if fam in ("detshare-reserve", "detshare-overlap") and not 0 <= n <= 1:
            ap.error("--configs %s: lc_reserve is 0..1" % c)
        if fam in ("detshare-floor", "detshare-pinned") and n < 0:
            ap.error("--configs %s: a group count must be 0 or more" % c)
        base, narrow = narrow_suffix(c)
        if narrow is not None and not 0 <= narrow <= 63:
            ap.error("--configs %s: narrow_groups (-n<N>) is 0..63" % c)
        if narrow is not None and base != "detshare-default" and fam in (None, "mps-pct", "detshare-narrow") + TRAINER_ALONE:
            # the named configurations are recognised by their whole name (detshare-share, detshare-temporal, ...)
            ap.error("--configs %s: -n<N> applies to detshare-default and the numbered DetShare configurations "
                     "(detshare-reserve<F>, detshare-overlap<F>, detshare-slo<X>x, detshare-sloov<X>x, "
                     "detshare-pinned<N>, detshare-floor<N>)" % c)
        if narrow_suffix(c)[0] not in known and fam is None:
            ap.error("--configs: %r is not one of %s, or mps-pct<P>, detshare-floor<N>, detshare-pinned<N>, "
                     "detshare-slo<X>x, detshare-sloov<X>x, detshare-reserve<F>, detshare-overlap<F>, detshare-narrow<N>, "
                     "trainer-mps<P>, trainer-sm<S>, trainer-hami<P>, hami-sm<P>" % (c, ", ".join(sorted(known))))
        if fam in TRAINER_ALONE and "coloc" not in a.suites:
            ap.error("--configs %s: the trainer-alone configurations belong to --suite coloc" % c)
    a.config_order = [c for c in a.configs.split(",") if c]
    pairs = []
    for pair in (x for x in a.train_pairs.split(",") if x):
        ms = pair.split(":")
        for m in ms:
            name, at, batch = m.partition("@")
            if name not in ("resnet50", "gpt2", "lin8192-bf16", "lin8192-fp32") or (at and not batch.isdigit()):
                ap.error("--train-pairs %s: a trainer is resnet50, gpt2, lin8192-bf16 or lin8192-fp32, optionally "
                         "with @N (batch N)" % m)
        if len(ms) != 2:
            ap.error("--train-pairs %s: a pair is A:B" % pair)
        pairs.append(tuple(ms))
    a.train_pairs = pairs
    hami_on_gpu = sorted(c for c in a.only if param_config(c)[0] in HAMI) if a.device == "cuda" else []
    if hami_on_gpu and a.duration and a.duration < HAMI_MIN_DURATION:
        ap.error("--duration %g with --configs %s: HAMi-core's limiter settles over seconds (its watcher refills a "
                 "token bucket every 120 ms from NVML's SM utilisation; a process runs about unlimited for its first "
                 "3-4 s, then cycles with a 3-4 s period), so its cases need --duration >= %g"
                 % (a.duration, ",".join(hami_on_gpu), HAMI_MIN_DURATION))
    if not a.duration:
        a.duration = HAMI_MIN_DURATION if hami_on_gpu else 6.0 if a.quick else 8.0
    if not a.pairs:
        a.pairs = "quick" if a.quick else "default"
    if a.scheduler != "detshare":
        ap.error("--scheduler=%r: the only scheduler is the real `detshare sched` (allowed: detshare; the Python "
                 "stand-in was removed)" % a.scheduler)
    if a.decode_boost < 0:
        ap.error("--decode-boost=%d: must be 1 or more (0: the scheduler's default)" % a.decode_boost)
    a.coloc_lcs = [x for x in a.coloc_lc.split(",") if x]
    a.coloc_bes = [x for x in a.coloc_be.split(",") if x]
    for x in a.coloc_lcs:
        if x not in COLOC_LC + COLOC_EXTRA + COLOC_PROBES:
            ap.error("--coloc-lc: %r is not one of %s" % (x, ", ".join(COLOC_LC + COLOC_EXTRA + COLOC_PROBES)))
        if x in COLOC_PROBES and a.device == "cpu":
            ap.error("--coloc-lc %s: the probe measures SMs, it needs --device cuda" % x)
        if x in COLOC_PROBES and a.lc_stamp:
            ap.error("--lc-stamp with --coloc-lc %s: the probe stamps its own requests" % x)
    if a.lc_stamp and a.device == "cpu":
        ap.error("--lc-stamp: the stamps are GPU kernels, it needs --device cuda")
    for x in a.coloc_bes:
        if x not in COLOC_BE + COLOC_BE_EXTRA:
            ap.error("--coloc-be: %r is not one of %s" % (x, ", ".join(COLOC_BE + COLOC_BE_EXTRA)))
        if x in COLOC_BE_EXTRA and a.device == "cpu":
            ap.error("--coloc-be %s: already the CPU's size of lin8192-bf16; on --device cpu name lin8192-bf16" % x)
    if not 0 < a.load < 1:
        ap.error("--load=%s: must be between 0 and 1 (fraction of solo capacity)" % a.load)
    return a


def log(msg, *args):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), msg % args if args else msg))
    sys.stderr.flush()


# ------------------------------------------------------------------------------------------------ MPS ----------
class MPS:
    """An MPS control daemon with private pipe and log directories (never the system's), stopped on exit."""

    def __init__(self, binary, root):
        self.binary, self.pipe, self.logdir = binary, os.path.join(root, "mps-pipe"), os.path.join(root, "mps-log")
        self.running = False

    def env(self):
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe, "CUDA_MPS_LOG_DIRECTORY": self.logdir}

    def start(self):
        os.makedirs(self.pipe, exist_ok=True)
        os.makedirs(self.logdir, exist_ok=True)
        env = dict(os.environ, **self.env())
        subprocess.run([self.binary, "-d"], env=env, check=True, timeout=30)
        for _ in range(200):
            if os.path.exists(os.path.join(self.pipe, "control")):
                self.running = True
                return
            time.sleep(0.05)
        raise RuntimeError("MPS control daemon started but %s/control never appeared (see %s)" % (self.pipe,
                                                                                                 self.logdir))

    def stop(self):
        if not self.running:
            return
        env = dict(os.environ, **self.env())
        try:
            subprocess.run([self.binary], input=b"quit\n", env=env, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            log("MPS control daemon did not quit within 30 s")
        for _ in range(100):
            if not os.path.exists(os.path.join(self.pipe, "control")):
                break
            time.sleep(0.05)
        self.running = False


# ------------------------------------------------------------------------------------------- power log ----------
class PowerLog(threading.Thread):
    """Board power, power limit and SM clock every 100 ms (nvidia-smi queries; card settings are never changed),
    each line stamped with time.time() so that report.py can cut it into the cases' windows."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.proc = path, None

    def run(self):
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=power.draw,power.limit,clocks.sm",
                                          "--format=csv,noheader,nounits", "-lms", "100"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        except OSError as e:
            log("power log: nvidia-smi not started (%s)", e)
            return
        with open(self.path, "w") as f:
            f.write("time,power_w,power_limit_w,sm_clock_mhz\n")
            for line in self.proc.stdout:
                f.write("%.3f,%s\n" % (time.time(), ",".join(x.strip() for x in line.split(","))))
                f.flush()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ------------------------------------------------------------------------------------- scheduler snapshots ------
# what SchedWatch keeps of each tenant at every look (logs/<case>__looks.jsonl)
LOOK_KEYS = ("id", "grant_groups", "narrow_groups", "slo_given_back_groups", "slo_window_p99_ms", "slo_state")


def looks_path(status_path):
    """Where SchedWatch appends its looks beside the last one (<case>__status.json -> <case>__looks.jsonl)."""
    return status_path[:-len("__status.json")] + "__looks.jsonl" if status_path.endswith("__status.json") \
        else status_path + ".looks.jsonl"


class SchedWatch(threading.Thread):
    """Looks at `detshare status --json` every `period` s from the start signal on and keeps the last look in which
    every tenant of the case was registered (written to `path`): what the scheduler granted while the workers ran,
    however late a loaded machine runs the look."""

    def __init__(self, detshare, run_dir, tenants, path, period=0.25):
        super().__init__(daemon=True)
        self.cmd = [detshare, "--run-dir", run_dir, "status", "--json"]
        self.tenants, self.path, self.period = set(tenants), path, period
        self.last, self.error, self._stop_ev = None, "", threading.Event()

    def run(self):
        while True:
            r = subprocess.run(self.cmd, capture_output=True, text=True)
            try:
                snap = json.loads(r.stdout) if r.returncode == 0 else None
            except ValueError:
                snap = None
            if snap is None:
                self.error = r.stdout + r.stderr
            elif self.tenants <= set(tn.get("id") for tn in snap.get("tenants") or []
                                     if tn.get("grant_mode") not in (None, "", "none")):
                # every tenant present and decided: a look between a registration and the scheduler's first
                # decision for it (grant mode none) says nothing about the run (a loaded CI machine took one)
                self.last = snap
                with open(self.path + ".tmp", "w") as f:
                    json.dump(snap, f, indent=1)
                os.rename(self.path + ".tmp", self.path)
                # every look, in short: what the SLO controller gave over the run, not only where it ended
                with open(looks_path(self.path), "a") as f:
                    f.write(json.dumps({"t": round(time.time(), 3), "tenants": [
                        {k: tn[k] for k in LOOK_KEYS if k in tn} for tn in snap.get("tenants") or []]}) + "\n")
            if self._stop_ev.wait(self.period):
                break
        if self.last is None:  # say why there is no snapshot rather than leave nothing
            with open(self.path, "w") as f:
                f.write(self.error or "no look at the scheduler saw every tenant of the case registered\n")

    def stop(self):
        self._stop_ev.set()
        if self.is_alive():
            self.join()


# ------------------------------------------------------------------------------------------------ cases --------
class Case:
    def __init__(self, name, config, workers, needs_mps=False):
        self.name, self.config, self.workers, self.needs_mps = name, config, workers, needs_mps

    def uses_lib(self):
        """Library configurations: run under `detshare sched`, each worker started by `detshare run`."""
        return self.config.startswith(("detshare", "trainer-sm")) or self.config in ("alone-lib", "alone-grant")


class Worker:
    def __init__(self, label, args, env=None, tenant=None, mps_pct=None):
        self.label, self.args, self.env, self.tenant, self.mps_pct = label, args, env or {}, tenant, mps_pct


class Runner:
    def __init__(self, a):
        self.a = a
        self.out = os.path.abspath(a.out)
        self.raw = os.path.join(self.out, "raw")
        self.logs = os.path.join(self.out, "logs")
        self.tmp = tempfile.mkdtemp(prefix="detshare-bench-")
        self.mps = MPS(a.mps_control, self.tmp)
        self.rates = {}
        self.solo_p99 = {}  # coloc:<lc> -> the LC's service P99 alone, seconds (detshare-slo<X>x)
        self.gpu = None
        self.procs = []

    # GPU facts, through the driver (gpuinfo.py) in a child so this process never initialises CUDA itself
    def gpu_info(self):
        if self.a.device == "cpu":
            return {"name": "cpu (harness check, no GPU)", "sms": 132, "split": {"groups": [8] * 15}, "cpu": True}
        r = subprocess.run([sys.executable, os.path.join(HERE, "gpuinfo.py")], capture_output=True, text=True,
                           timeout=60)
        info = json.loads(r.stdout or "{}") if r.stdout.strip().startswith("{") else {"error": r.stderr}
        if "error" in info:
            raise RuntimeError("cannot query GPU 0 through the driver: %s" % info["error"])
        return info

    def groups(self):
        sp = self.gpu.get("split")
        if not sp:
            raise RuntimeError("the driver gave no SM split (%s): DetShare's spatial mode needs green contexts "
                               "(CUDA 12.5+ driver)" % self.gpu.get("split_error"))
        return sp["groups"]

    def run(self):
        a = self.a
        os.makedirs(self.raw, exist_ok=True)
        os.makedirs(self.logs, exist_ok=True)
        self.gpu = self.gpu_info()
        plan = self.plan()
        meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv, "gpu": self.gpu,
                "duration": a.duration, "load": a.load, "lc_groups": a.lc_groups, "tpot_slo_ms": a.tpot_slo_ms,
                "device": a.device, "driver": _nvidia_smi_field("driver_version"), "lc_slo_ms": a.lc_slo_ms,
                "lc_lend": a.lc_lend, "be_floor": a.be_floor, "gate_budget_us": a.gate_budget_us,
                "gate_depth": a.gate_depth, "decode_boost": a.decode_boost, "scheduler": "detshare sched",
                "cases": [{"name": c.name, "config": c.config, "workers": [w.label for w in c.workers]}
                          for c in plan]}
        est = len(plan) * (a.duration + (4 if a.device == "cpu" else 15))
        log("%d cases, about %.1f minutes", len(plan), est / 60)
        if not a.dry_run and any(c.uses_lib() for c in plan):
            for path, what in ((a.detshare, "--detshare"), (a.lib, "--lib")):
                if not os.access(path, os.R_OK) or (what == "--detshare" and not os.access(path, os.X_OK)):
                    raise RuntimeError("%s=%s: missing or not executable; the library configurations need "
                                       "`detshare sched`/`detshare run` and libdetshare (run `make build`)"
                                       % (what, path))
        if a.dry_run:
            for c in plan:
                print("%-32s %-14s %s%s" % (c.name, c.config, " | ".join(
                    "%s: %s%s%s" % (w.label, " ".join(w.args), " (MPS %s%%)" % w.mps_pct if w.mps_pct else "",
                                    "".join(" (%s=%s)" % kv for kv in sorted(w.env.items())))
                    for w in c.workers), " [MPS]" if c.needs_mps else ""))
            return 0
        with open(os.path.join(self.out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        failed = []
        power = None
        if a.device == "cuda" and shutil.which("nvidia-smi"):
            power = PowerLog(os.path.join(self.out, "power.csv"))
            power.start()
        try:
            for c in plan:
                try:
                    self.run_case(c)
                except Exception as e:  # one broken case must not lose the others' results
                    log("case %s FAILED: %s", c.name, e)
                    failed.append({"case": c.name, "error": str(e)})
                    self.kill_all()
        finally:
            if power:
                power.stop()
            self.mps.stop()
            shutil.rmtree(self.tmp, ignore_errors=True)
        meta["failed"] = failed
        meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(os.path.join(self.out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        return 1 if failed else 0

    # ----------------------------------------------------------------------------------------- the plan -------
    def plan(self):
        a = self.a
        cases = []
        dev = ["--device", a.device]
        tiny = "-tiny" if a.device == "cpu" else ""

        def want(cfg):
            return not a.only or cfg in a.only

        if "infer" in a.suites:
            for lc, be in INFER_PAIRS[a.pairs]:
                pair = "%s+%s" % (lc, be)
                lcw = ["--role", "infer", "--model", lc + tiny] + dev
                bew = ["--role", "train", "--model", be + tiny] + dev
                for cfg in PAIR_CONFIGS:
                    if not want(cfg):
                        continue
                    if cfg == "alone-grant":
                        cases.append(self.case("infer/%s/%s/lc" % (pair, cfg), cfg, [("lc", lcw, "lc", pair)]))
                    elif cfg in ("alone", "alone-lib"):
                        cases.append(self.case("infer/%s/%s/lc" % (pair, cfg), cfg, [("lc", lcw, "lc", pair)]))
                        cases.append(self.case("infer/%s/%s/be" % (pair, cfg), cfg, [("be", bew, "be", pair)]))
                    else:
                        cases.append(self.case("infer/%s/%s" % (pair, cfg), cfg,
                                               [("lc", lcw, "lc", pair), ("be", bew, "be", pair)]))
        if "llm" in a.suites:
            pw = ["--role", "prefill", "--model", "llama" + tiny] + dev
            dw = ["--role", "decode", "--model", "llama" + tiny] + dev
            for cfg in LLM_CONFIGS:
                if not want(cfg):
                    continue
                if cfg == "alone":
                    cases.append(self.case("llm/alone/prefill", cfg, [("prefill", pw, "prefill", "llm")]))
                    cases.append(self.case("llm/alone/decode", cfg, [("decode", dw, "decode", "llm")]))
                else:
                    cases.append(self.case("llm/" + cfg, cfg, [("prefill", pw, "prefill", "llm"),
                                                               ("decode", dw, "decode", "llm")]))
        if "coloc" in a.suites:
            # alone first (each workload once: the LC's Poisson rate comes from its solo capacity), then the shared
            # configurations without MPS, then with it (MPS starts once)
            for lc in a.coloc_lcs:
                if want("alone"):
                    cases.append(self.case("coloc/%s/alone" % lc, "alone",
                                           [("lc", self.coloc_lc_args(lc, tiny, dev), "lc", "coloc:" + lc)]))
            for lc in a.coloc_lcs:
                if "alone-flush" in a.only:  # what a trainer's traffic through L2 alone costs the LC
                    cases.append(self.case("coloc/%s/alone-flush" % lc, "alone-flush",
                                           [("lc", self.coloc_lc_args(lc, tiny, dev) + ["--l2-flush-mb", str(L2_FLUSH_MB)],
                                             "lc", "coloc:" + lc)]))
                    cases[-1].workers[0].rate_key = ("coloc:" + lc, "lc")
            for lc in a.coloc_lcs:
                if want("alone-mps"):
                    cases.append(self.case("coloc/%s/alone-mps" % lc, "alone-mps",
                                           [("lc", self.coloc_lc_args(lc, tiny, dev), "lc", "coloc:" + lc)]))
                    cases[-1].workers[0].rate_key = ("coloc:" + lc, "lc")
            for be in a.coloc_bes:
                if want("alone"):
                    cases.append(self.case("coloc/%s/alone" % be, "alone",
                                           [("be", ["--role", "train", "--model", be + tiny] + dev, "be",
                                             "coloc:" + be)]))
            for cfg in a.config_order:  # each trainer alone on part of the GPU
                if param_config(cfg)[0] in TRAINER_ALONE:
                    for be in a.coloc_bes:
                        cases.append(self.case("coloc/%s/%s" % (be, cfg), cfg,
                                               [("be", ["--role", "train", "--model", be + tiny] + dev, "be",
                                                 "coloc:" + be)]))
            shared = [c for c in COLOC_CONFIGS[2:] if want(c)]
            shared += [c for c in a.config_order if c not in COLOC_CONFIGS and c not in COLOC_OPTIONAL and
                       param_config(c)[0] not in TRAINER_ALONE]
            for cfg in shared:
                for be in a.coloc_bes:
                    for lc in a.coloc_lcs:
                        pair = "coloc:%s+%s" % (lc, be)
                        c = self.case(coloc_case(lc, be, cfg), cfg,
                                      [("lc", self.coloc_lc_args(lc, tiny, dev), "lc", pair),
                                       ("be", ["--role", "train", "--model", be + tiny] + dev, "be", pair)])
                        c.workers[0].rate_key = ("coloc:" + lc, "lc")
                        cases.append(c)
        if "train" in a.suites:
            def targs(m):  # resnet50@16: resnet50 at batch 16
                name, _, batch = m.partition("@")
                return ["--role", "train", "--model", name + tiny] + (["--batch", batch] if batch else []) + dev
            models = []
            for x, y in a.train_pairs:
                models += [m for m in (x, y) if m not in models]
            for cfg in TRAIN_CONFIGS:
                if not want(cfg):
                    continue
                if cfg == "alone":  # each trainer alone once, shared by every pair it is in
                    for m in models:
                        cases.append(self.case("train/alone/" + m, cfg, [("a", targs(m), "a", "train-solo:" + m)]))
                    continue
                for x, y in a.train_pairs:
                    g = "train:%s+%s" % (x, y)
                    cases.append(self.case("train/%s+%s/%s" % (x, y, cfg), cfg,
                                           [("a", targs(x), "a", g), ("b", targs(y), "b", g)]))
        return cases

    def coloc_lc_args(self, lc, tiny, dev):
        return ["--role", "infer", "--model", lc + tiny] + dev + (["--stamp"] if self.a.lc_stamp else [])

    def case(self, name, cfg, workers):
        ws = []
        fam, num = param_config(cfg)
        for label, args, tenant, group in workers:
            pct = None
            if cfg == "mps-pct" and label == "be":
                groups = self.groups()
                pct = max(1, int(100 * sum(groups[self.a.lc_groups:]) / self.gpu["sms"]))
            elif fam in ("mps-pct", "trainer-mps") and label == "be":
                pct = int(num)
            env = {}
            if label == "be":
                env.update(self.a.be_env_map)
            if fam in HAMI and label == "be":
                # HAMi-core: its library preloaded with an SM utilisation limit; its shared state in the case's
                # own file (HAMi-core keeps it in /tmp/cudevshr.cache unless told otherwise). CUDA_REDIRECT names the
                # library its dlsym hook resolves cu* functions from, as HAMi's deployment does by installing it at
                # the hook's default, /usr/local/vgpu/libvgpu.so. The library must export its hooks (hami.sh checks):
                # a Release build hides them and limits nothing, with or without CUDA_REDIRECT (BENCHMARKS.md, J1-M1)
                env.update({"LD_PRELOAD": self.a.hami_lib, "CUDA_REDIRECT": self.a.hami_lib,
                            "CUDA_DEVICE_SM_LIMIT": str(int(num)),
                            "CUDA_DEVICE_MEMORY_SHARED_CACHE": os.path.join(self.tmp, "hami-%s.cache" %
                                                                            case_slug(name))})
            if self.a.be_sm_target and label == "be" and cfg != "alone":
                env["BENCH_CUBLAS_SM_TARGET"] = str(self.a.be_sm_target)
            if cfg == "mps-prio" and label == "be":
                env["CUDA_MPS_CLIENT_PRIORITY"] = "1"  # below normal; the LC stays at normal (0)
            if cfg.endswith("-noprio"):
                env["DETSHARE_MPS_PRIORITY"] = "off"  # the library leaves every tenant at normal priority
            ws.append(Worker(label, list(args), env=env, tenant=tenant, mps_pct=pct))
            ws[-1].group = group
        return Case(name, cfg, ws, needs_mps=cfg.startswith(("mps", "trainer-mps", "trainer-sm")) or (cfg.startswith("detshare") and
                                                                                  cfg not in NO_MPS) or
                    cfg in ("alone-grant", "alone-mps"))

    # ----------------------------------------------------------------------------------------- one case -------
    def run_case(self, c):
        a = self.a
        slug = case_slug(c.name)
        log("case %s", c.name)
        cpu = a.device == "cpu"
        if c.needs_mps and not cpu and not self.mps.running:
            if not shutil.which(a.mps_control):
                raise RuntimeError("%s not found: MPS configurations need it" % a.mps_control)
            self.mps.start()
        if not c.needs_mps and self.mps.running:
            self.mps.stop()
        sched = None
        if c.uses_lib():
            if self.mps.running:  # the scheduler runs its own MPS daemon; never two on one GPU
                self.mps.stop()
            sched = self.start_sched(c, slug)
        casedir = os.path.join(self.tmp, slug)
        os.makedirs(casedir, exist_ok=True)
        go = os.path.join(casedir, "go")
        procs = []
        try:
            for w in c.workers:
                env = dict(os.environ)
                env["PYTHONUNBUFFERED"] = "1"
                if sched:
                    env["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(sched["run_dir"], "mps", "gpu0", "pipe")
                elif c.needs_mps and not cpu:
                    env.update(self.mps.env())
                else:  # never attach to an MPS server someone else runs
                    env["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(self.tmp, "no-mps")
                env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
                if w.mps_pct:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(w.mps_pct)
                env.pop("CUDA_MPS_CLIENT_PRIORITY", None)
                env.pop("LD_PRELOAD", None)  # `detshare run` preloads the library where the case has it
                env.update(w.env)  # a peer's library (HAMi-core) is the case's own LD_PRELOAD
                env.pop("DETSHARE_QUOTA_FILE", None)
                if sched:
                    env["DETSHARE_RUN_DIR"] = sched["run_dir"]
                    env.setdefault("DETSHARE_LOG", "info")
                out = os.path.join(self.raw, "%s__%s.json" % (slug, w.label))
                args = [a.python, os.path.join(HERE, "worker.py")] + w.args + [
                    "--out", out, "--ready", os.path.join(casedir, w.label + ".ready"), "--go", go,
                    "--duration", str(a.duration), "--tag", c.config, "--seed", "1234"]
                rate_key = getattr(w, "rate_key", None) or (w.group, w.label)
                if w.label in ("lc", "prefill"):
                    if rate_key in self.rates:
                        args += ["--rate", "%.6f" % self.rates[rate_key]]
                    else:
                        args += ["--load", str(a.load)]
                if cpu:
                    args += ["--warmup", "2"]
                if sched:
                    args = [a.detshare, "--run-dir", sched["run_dir"], "run", "--name", w.tenant, "--lib", a.lib,
                            "--strict"] + sched["flags"][w.tenant] + ["--"] + args
                logf = open(os.path.join(self.logs, "%s__%s.log" % (slug, w.label)), "w")
                p = subprocess.Popen(args, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
                p.logf, p.out, p.w = logf, out, w
                procs.append(p)
                self.procs.append(p)
            # wait until every worker warmed up, then start them together
            deadline = time.time() + a.worker_timeout
            while not all(os.path.exists(os.path.join(casedir, w.label + ".ready")) for w in c.workers):
                for p in procs:
                    if p.poll() is not None:
                        raise RuntimeError("worker %s exited with %s before it was ready (log: %s)"
                                           % (p.w.label, p.returncode, p.logf.name))
                if time.time() > deadline:
                    raise RuntimeError("workers not ready after %.0f s" % a.worker_timeout)
                time.sleep(0.05)
            if sched:
                sched["watch"] = SchedWatch(a.detshare, sched["run_dir"], [w.tenant for w in c.workers],
                                            os.path.join(self.logs, "%s__status.json" % slug))
                sched["watch"].start()
            with open(go + ".tmp", "w") as f:
                f.write("%.6f" % (time.time() + 0.5))
            os.rename(go + ".tmp", go)
            for p in procs:
                left = max(1.0, deadline + a.duration - time.time())
                try:
                    p.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    raise RuntimeError("worker %s did not finish (log: %s)" % (p.w.label, p.logf.name)) from None
                if p.returncode != 0:
                    raise RuntimeError("worker %s exited with %s (log: %s)" % (p.w.label, p.returncode, p.logf.name))
                with open(p.out) as f:
                    res = json.load(f)
                rk = getattr(p.w, "rate_key", None) or (p.w.group, p.w.label)
                if c.config == "alone" and p.w.label == "lc" and res.get("requests"):
                    svc = sorted(e - s for _, s, e in res["requests"])
                    self.solo_p99[p.w.group] = svc[min(len(svc) - 1, int(0.99 * len(svc)))]
                if p.w.label in ("lc", "prefill") and "rate" in res and rk not in self.rates:
                    self.rates[rk] = res["rate"]
                    log("  %s %s solo capacity -> Poisson rate %.2f/s at load %.2f", p.w.group, p.w.label,
                        res["rate"], a.load)
                res.update(case=c.name, config=c.config, label=p.w.label, group=p.w.group)
                if sched:
                    res["scheduler"] = "detshare sched (policy %s)" % sched["policy"]
                    if p is procs[0]:
                        sched["watch"].stop()  # a worker has finished: later looks would not be mid-run
                    snap = sched["watch"].last or {}
                    for tn in snap.get("tenants", []):
                        if tn.get("id") == p.w.tenant:
                            # what the scheduler had granted the tenant in the last look with every tenant present
                            res["grant_mid_run"] = {"sms": tn.get("granted_sms"), "groups": tn.get("grant_groups"),
                                                    "mode": tn.get("grant_mode"), "pinned": tn.get("pinned"),
                                                    "guaranteed_sms": tn.get("guaranteed_sms")}
                    gpus = snap.get("gpus") or [{}]
                    if "grant_changes" in gpus[0]:
                        res["grant_changes"] = gpus[0]["grant_changes"]
                with open(p.out, "w") as f:
                    json.dump(res, f)
        finally:
            if sched and sched.get("watch"):
                sched["watch"].stop()
            for p in procs:
                if p.poll() is None:
                    _killpg(p)
                p.logf.close()
                if p in self.procs:
                    self.procs.remove(p)
            if sched:
                self.stop_sched(sched)

    # ------------------------------------------------------------------------------ the real scheduler ------
    def sched_config(self, c):
        """The config.toml of the case's `detshare sched`: its policy and the scheduler settings its name asks for."""
        a = self.a
        policy = sched_policy(c.config)
        fam, num = param_config(c.config)
        floor = 0 if c.config == "detshare-dynamic-pause" else int(num) if fam == "detshare-floor" else a.be_floor
        return ('[scheduler]\npolicy = "%s"\n%s[mps]\nenable = %s\ncontrol = "%s"\n[metrics]\nlisten = ""\n'
                % (policy, ("be_floor = %d\n" % floor if floor is not None else "") +
                   ("decode_boost = %d\n" % a.decode_boost if a.decode_boost and policy == "tpot-first" else "") +
                   ('gate_budget = "%dus"\n' % a.gate_budget_us if a.gate_budget_us else "") +
                   ("gate_depth = %d\n" % a.gate_depth if a.gate_depth else "") +
                   ("lc_reserve = %g\n" % (0 if fam == "detshare-floor" or c.config.startswith("detshare-dynamic")
                                             else num) if fam in ("detshare-floor", "detshare-reserve",
                                                                  "detshare-overlap") or
                    c.config.startswith("detshare-dynamic") else "") +
                   ("lc_overlap = true\n" if fam in ("detshare-overlap", "detshare-sloov") else "") +
                   ("share_overlap = true\n" if c.config in ("detshare-share",) + SHARED else "") +
                   ("narrow_groups = %d\n" % num if fam == "detshare-narrow" else
                    "narrow_groups = %d\n" % narrow_suffix(c.config)[1]
                    if narrow_suffix(c.config)[1] is not None else ""),
                   "false" if c.config in NO_MPS else "true", a.mps_control))

    def tenant_flags(self, c):
        """`detshare run` flags of each tenant of the case (tier, guarantee, pinning, SLO), by tenant name."""
        a = self.a
        fam, num = param_config(c.config)
        sms = sum(self.groups()[:a.lc_groups])
        flags = {}
        for w in c.workers:
            if fam == "trainer-sm":  # the trainer alone, pinned to its SMs: nothing beside it narrows or gates it
                flags[w.tenant] = ["--tier", "latency-critical", "--sm", str(int(num)), "--pinned"]
            elif c.config in ("alone-lib",) + SHARED or w.tenant in ("be", "a", "b"):
                # detshare-shared: the LC is labelled best-effort too, so nothing protects it and, with
                # share_overlap, both run on every group as under plain MPS (the frontier's unprotected end), or
                # without MPS both run whenever they have work, time-sliced by the driver (detshare-timeshared)
                flags[w.tenant] = ["--tier", "best-effort"]
            elif w.tenant == "lc":
                flags[w.tenant] = ["--tier", "latency-critical", "--sm", str(sms)]
                if c.config in ("detshare", "detshare-static", "alone-grant"):
                    # a static partition: the LC runs on exactly its guarantee, the BE keeps the complement
                    flags[w.tenant].append("--pinned")
                elif fam == "detshare-pinned":
                    flags[w.tenant] = ["--tier", "latency-critical", "--sm", str(sum(self.groups()[:int(num)])),
                                       "--pinned"]
                elif fam in ("detshare-slo", "detshare-sloov"):
                    solo = self.solo_p99.get(w.group.split("+")[0])
                    if not solo:
                        raise RuntimeError("%s: the LC's solo P99 is unknown (run the alone configuration first)"
                                           % c.config)
                    flags[w.tenant] += ["--slo-p99", "%dus" % max(1, int(round(num * solo * 1e6)))]
                    log("  %s: slo-p99 %.3f ms (%.2fx solo P99 %.3f ms)", c.name, num * solo * 1e3, num, solo * 1e3)
                elif c.config in ("detshare-dynamic", "detshare-dynamic-pause", "detshare-dynamic-noprio",
                                  "detshare-temporal"):
                    if a.lc_slo_ms:
                        flags[w.tenant] += ["--slo-p99", "%gms" % a.lc_slo_ms]
                    if a.lc_lend:
                        flags[w.tenant].append("--lend")
                if c.config.endswith("-lend"):
                    flags[w.tenant].append("--lend")  # its partition, idle, is lent to the trainer
            elif w.tenant in ("prefill", "decode"):
                flags[w.tenant] = ["--tier", "best-effort", "--role", w.tenant]
        return flags

    def start_sched(self, c, slug):
        """`detshare sched` on a private run directory, with the case's policy; tenants come from `detshare run`."""
        a = self.a
        # short: the MPS control daemon's sockets live under <run dir>/mps/gpu0/pipe and a Unix socket path has at
        # most 107 bytes (with the long case names of the coloc suite nvidia-cuda-mps-control failed to start)
        self.nsched = getattr(self, "nsched", 0) + 1
        run_dir = os.path.join(self.tmp, "ds%d" % self.nsched)
        os.makedirs(run_dir, exist_ok=True)
        cfg = os.path.join(run_dir, "config.toml")
        with open(cfg, "w") as f:
            f.write(self.sched_config(c))
        flags = self.tenant_flags(c)
        env = dict(os.environ, DETSHARE_LOG_LEVEL=os.environ.get("DETSHARE_BENCH_SCHED_LOG", "info"))
        if a.device == "cpu":
            # harness check: the scheduler describes the simulated GPU (a test double), whose MPS is simulated too, so
            # grants are spatial as on a GPU
            env["DETSHARE_SIMGPU"] = "1"
        logf = open(os.path.join(self.logs, "%s__sched.log" % slug), "w")
        p = subprocess.Popen([a.detshare, "--run-dir", run_dir, "sched", "--config", cfg], env=env, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        p.logf = logf
        for _ in range(100):
            r = subprocess.run([a.detshare, "--run-dir", run_dir, "status", "--json"], capture_output=True, text=True)
            if r.returncode == 0:
                break
            if p.poll() is not None:
                raise RuntimeError("detshare sched exited with %s (log: %s)" % (p.returncode, logf.name))
            time.sleep(0.1)
        else:
            _killpg(p)
            raise RuntimeError("detshare sched did not come up (log: %s)" % logf.name)
        return {"proc": p, "run_dir": run_dir, "policy": sched_policy(c.config), "flags": flags}

    def stop_sched(self, sched):
        p = sched["proc"]
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                _killpg(p)
        p.logf.close()

    def kill_all(self):
        for p in list(self.procs):
            _killpg(p)


def _killpg(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _nvidia_smi_field(field):
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + field, "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main(argv=None):
    a = parse(argv)
    r = Runner(a)

    def on_signal(sig, _frame):
        log("signal %d: stopping workers and MPS", sig)
        r.kill_all()
        r.mps.stop()
        sys.exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return r.run()
    except RuntimeError as e:
        log("error: %s", e)
        r.kill_all()
        r.mps.stop()
        return 1


if __name__ == "__main__":
    sys.exit(main())
