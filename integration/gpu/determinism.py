#!/usr/bin/env python3
"""determinism: bit-identical training and decoding with and without DetShare, and under grant changes.

Each mode runs the same program in a fresh process (the library is preloaded at start, so modes cannot share a
process):
  native          no library
  native-2        no library again: proves the program itself is reproducible run to run
  lib             libdetshare, a fixed grant (--fixed-groups, default the first 4 groups)
  lib-changing    libdetshare while dstable.GrantChanger publishes a new grant every --period-ms (default 3 ms),
                  cycling through disjoint and overlapping group sets: every change rebinds the streams at the next
                  kernel boundary
The program: --steps (50) training steps of a GPT-2-like model with deterministic settings
(torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, cuDNN deterministic, fixed seed), recording
every loss exactly (float.hex) and a sha256 of all weights at the end; then a Llama-like greedy decode of 64
tokens through a CUDA graph, hashing tokens and logits. The verdict is byte equality across modes.
Writes OUTDIR/determinism.json and OUTDIR/determinism.md. Runs under a private MPS daemon when one can be started
(DetShare's spatial mode), else without (said in the output).
"""
import argparse
import hashlib
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
    import models

    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # warn_only: an op without a deterministic implementation must not abort the run; the native-2 mode (a second
    # native run) shows whether the program itself is reproducible before any difference is blamed on sharing
    torch.use_deterministic_algorithms(True, warn_only=True)
    models.FORCE_MATH_ATTENTION = True
    dev = a.device
    kw = dict(layers=6, d=512, heads=8, vocab=8192, max_seq=512) if not a.tiny else models.MODEL_SIZES["gpt2-tiny"]
    m = models.GPT(**kw).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    seq = 256 if not a.tiny else 32
    vocab = kw.get("vocab", 50257)
    losses = []
    t0 = time.time()
    for _ in range(a.steps):
        ids = torch.randint(0, vocab, (8 if not a.tiny else 2, seq + 1), generator=g).to(dev)
        opt.zero_grad(set_to_none=True)
        logits = m(ids[:, :-1])
        # cross-entropy written with a one-hot product: only element-wise ops and reductions, no scatter/gather
        # backward (atomics) whatever the PyTorch version
        logp = torch.log_softmax(logits.reshape(-1, vocab).float(), -1)
        loss = -(logp * torch.nn.functional.one_hot(ids[:, 1:].reshape(-1), vocab).float()).sum(-1).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()).hex())
    train_s = time.time() - t0
    h = hashlib.sha256()
    for name, p in sorted(m.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    weights = h.hexdigest()
    # CUDA-graph greedy decode
    lk = dict(layers=4, d=512, heads=8, ff=1408, vocab=8192) if not a.tiny else models.MODEL_SIZES["llama-tiny"]
    torch.manual_seed(a.seed + 1)
    dtype = torch.float16 if dev == "cuda" else torch.float32
    lm = models.Llama(**lk).to(dev, dtype).eval()
    bs, prompt, max_seq = 4, 16, 96
    with torch.inference_mode():
        cache = lm.new_cache(bs, max_seq, dev, dtype)
        pids = torch.randint(0, lk["vocab"], (bs, prompt), generator=g).to(dev)
        lm(pids, torch.arange(prompt, device=dev), cache, True)
        tok = torch.zeros(bs, 1, dtype=torch.long, device=dev)
        pos = torch.full((1,), prompt, dtype=torch.long, device=dev)

        def raw():
            lg = lm(tok, pos, cache, False)
            tok.copy_(lg.argmax(-1, keepdim=True))
            pos.add_(1)
            return lg

        step, graph = raw, None
        if dev == "cuda":
            # warm-up on a side stream (as PyTorch recommends), then restore the state and capture
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                raw()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = raw()

            def step():
                graph.replay()
                return out
        # the decode starts from the same state in every mode: re-run the prompt into a clean cache
        for kc, vc in cache:
            kc.zero_()
            vc.zero_()
        lm(pids, torch.arange(prompt, device=dev), cache, True)
        tok.zero_()
        pos.fill_(prompt)
        dh = hashlib.sha256()
        toks = []
        for _ in range(64):
            lg = step()
            dh.update(lg.float().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
            toks.append(tok.clone())
        dh.update(torch.cat(toks, 1).cpu().numpy().tobytes())
    res = {"losses": losses, "weights_sha256": weights, "decode_sha256": dh.hexdigest(), "train_s": train_s,
           "graph": graph is not None, "preload": os.environ.get("LD_PRELOAD", "")}
    with open(a.out, "w") as f:
        json.dump(res, f)
    return 0


def parent(a):
    import bench
    import dstable

    os.makedirs(a.outdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="detshare-det-")
    mps = bench.MPS(a.mps_control, tmp)
    mps_note = "no MPS (CPU check)" if a.device == "cpu" else ""
    results, notes = {}, []
    try:
        if a.device == "cuda":
            if shutil.which(a.mps_control):
                try:
                    mps.start()
                    mps_note = "private MPS daemon"
                except (RuntimeError, subprocess.SubprocessError) as e:
                    mps_note = "MPS failed to start (%s): ran without MPS" % e
            else:
                mps_note = "%s not found: ran without MPS" % a.mps_control
            info = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "gpuinfo.py")], capture_output=True,
                                             text=True, timeout=60).stdout or "{}")
            if not info.get("split"):
                raise RuntimeError("no SM split from the driver: %s" % info)
            groups, sms = info["split"]["groups"], info["sms"]
        else:
            groups, sms = [8] * 15, 132
        n = len(groups)
        fixed = dstable._parse_mask(a.fixed_groups, n)
        masks = [dstable.range_mask(0, min(4, n)), dstable.range_mask(min(4, n - 1), max(1, n - 4)),
                 dstable.full_mask(n), dstable.range_mask(0, max(1, n // 2)), dstable.range_mask(n // 2, n - n // 2)]
        for mode in a.modes.split(","):
            env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
            env.update(mps.env() if mps.running else {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(tmp, "no-mps")})
            table = changer = None
            if not mode.startswith("native"):
                if not os.path.exists(a.lib):
                    raise RuntimeError("%s missing: build libdetshare first" % a.lib)
                table = dstable.Table.create(os.path.join(tmp, "run-" + mode), sms, groups=groups,
                                             mps_pipe_dir=mps.pipe if mps.running else "")
                q = table.register("det", tier="latency-critical" if mode == "lib" else "best-effort",
                                   guaranteed_groups=fixed if mode == "lib" else 0)
                table.publish_grant(q.slot, fixed if mode == "lib" else masks[0])
                env.update(LD_PRELOAD=a.lib, DETSHARE_QUOTA_FILE=q.quota_file, DETSHARE_LOG=env.get("DETSHARE_LOG",
                                                                                                   "info"))
                if mode == "lib-changing":
                    changer = dstable.GrantChanger(table, q.slot, masks, a.period_ms / 1000.0)
                else:
                    changer = dstable.Heartbeat(table)
                changer.start()
            out = os.path.join(a.outdir, "determinism_%s.json" % mode)
            cmd = [a.python, os.path.abspath(__file__), "--child", "--out", out, "--steps", str(a.steps),
                   "--device", a.device, "--seed", str(a.seed)] + (["--tiny"] if a.tiny else [])
            with open(os.path.join(a.outdir, "determinism_%s.log" % mode), "w") as logf:
                rc = subprocess.run(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, timeout=600).returncode
            if changer:
                changer.stop()
            if rc != 0:
                notes.append("mode %s failed (exit %d), see determinism_%s.log" % (mode, rc, mode))
                if table:
                    table.close()
                continue
            with open(out) as f:
                results[mode] = json.load(f)
            if mode == "lib-changing":
                results[mode]["grant_changes"] = changer.changes
            if table:
                table.close()
    finally:
        mps.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = results.get("native")
    rows, ok = [], bool(base) and not notes
    for mode, r in results.items():
        same_l = base is not None and r["losses"] == base["losses"]
        same_w = base is not None and r["weights_sha256"] == base["weights_sha256"]
        same_d = base is not None and r["decode_sha256"] == base["decode_sha256"]
        ok = ok and same_l and same_w and same_d
        rows.append("| %s | %s | %s | %s | %s | %.2f | %s |" % (
            mode, "yes" if same_l else "**NO**", r["weights_sha256"][:16] + ("" if same_w else " **differs**"),
            r["decode_sha256"][:16] + ("" if same_d else " **differs**"), "yes" if r["graph"] else "no",
            r["train_s"], r.get("grant_changes", "—")))
    md = ["Determinism (%d training steps + 64-token CUDA-graph decode; %s; grant change period %g ms): %s" % (
        a.steps, mps_note, a.period_ms, "**bit-identical**" if ok else "**NOT bit-identical or incomplete**"), "",
          "| mode | losses equal to native | weights sha256 | decode sha256 | CUDA graph | train s | grant changes |",
          "|---|---|---|---|---|---|---|"] + rows + [""] + notes
    with open(os.path.join(a.outdir, "determinism.json"), "w") as f:
        json.dump({"ok": ok, "mps": mps_note, "results": results, "notes": notes}, f, indent=1)
    with open(os.path.join(a.outdir, "determinism.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?", help="output directory")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--modes", default="native,native-2,lib,lib-changing")
    ap.add_argument("--period-ms", type=float, default=3.0, help="grant change period in lib-changing")
    ap.add_argument("--fixed-groups", default="0-3", help="grant of the lib mode (groups, e.g. 0-3)")
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "lib", "libdetshare.so"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: harness check only")
    ap.add_argument("--tiny", action="store_true", help="tiny models (harness check)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for m in a.modes.split(","):
        if m not in ("native", "native-2", "lib", "lib-changing"):
            ap.error("--modes: %r is not one of native, native-2, lib, lib-changing" % m)
    if a.child:
        return child(a)
    if not a.outdir:
        ap.error("OUTDIR is required")
    try:
        return parent(a)
    except RuntimeError as e:
        print("determinism: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
