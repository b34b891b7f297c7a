#!/usr/bin/env python3
"""graphsync: does a synchronisation wait for a replayed CUDA graph? (the llama-step bug of the issue-12 run)

The LC of the co-location suite (worker.py --role infer --model llama-step: one LLM decode step captured as a CUDA
graph and replayed per request) showed 0.08-0.12 ms service times under libdetshare, where the step reads 2.2 GB of
weights. Its outputs are not bit-reproducible under any concurrency, so this script checks completion without
comparing outputs:
  - sentinel: before each request the graph's output buffer is filled with NaN (then synchronised); after
    graph.replay() + torch.cuda.synchronize() the buffer is copied to the host on a non-blocking side stream (which
    is not ordered after the replay): NaN left means the synchronisation returned before the graph wrote it;
  - event: an event recorded after the replay on the replay's stream must be complete when synchronize() returns;
  - late: after a further synchronisation and 20 ms, the buffer must have been written (else the graph was
    dropped, not just waited for too early);
  - GPU time between events recorded before and after the replay, and the wall-clock service time.
Requests are spaced by --gap ms so that a latency-critical tenant goes idle between them (the dynamic policy
then changes its grant on every request). Prints one JSON summary line and writes it to --out.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-step", help="worker.py infer model (llama-step, bert, resnet50, ...)")
    ap.add_argument("--n", type=int, default=80, help="requests")
    ap.add_argument("--gap", type=float, default=5.0, help="idle ms between requests")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump", default="", help="write the captured graph (DOT, node types) here")
    ap.add_argument("--sync", default="context", choices=["context", "stream"],
                    help="how a request ends: torch.cuda.synchronize() (context) or the current stream's synchronize()")
    ap.add_argument("--no-events", action="store_true",
                    help="replay then synchronise with no event recorded in between (as worker.py's requests do); "
                         "the event columns are then not measured")
    a = ap.parse_args()

    import torch
    import worker

    torch.manual_seed(1234)
    wa = argparse.Namespace(model=a.model, seq=0, batch=0, device="cuda")
    m, x, _ = worker.build_infer(wa, torch, "cuda")
    static_x = x.clone()
    with torch.inference_mode():
        for _ in range(5):
            m(static_x)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        if a.dump:
            try:
                graph.enable_debug_mode()
            except Exception as e:  # older PyTorch: no node dump, the check still runs
                print("graphsync: no debug dump: %s" % e, flush=True)
                a.dump = ""
        with torch.cuda.graph(graph):
            static_y = m(static_x)
        if a.dump:
            try:
                graph.debug_dump(a.dump)
            except Exception as e:
                print("graphsync: debug_dump: %s" % e, flush=True)
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()

        side = torch.cuda.Stream()  # non-blocking (PyTorch's pool streams): not ordered after the replay
        nan = float("nan")
        rows = []
        for i in range(a.n):
            static_y.fill_(nan)
            torch.cuda.synchronize()
            time.sleep(a.gap / 1000.0)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            st = time.perf_counter()
            if not a.no_events:
                e0.record()
            graph.replay()
            if not a.no_events:
                e1.record()
            if a.sync == "stream":
                torch.cuda.current_stream().synchronize()
            else:
                torch.cuda.synchronize()
            svc = time.perf_counter() - st
            ev_done = True if a.no_events else e1.query()
            with torch.cuda.stream(side):
                early = torch.isnan(static_y.float()).any().item()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            extra = time.perf_counter() - t1
            time.sleep(0.02)
            torch.cuda.synchronize()
            late = torch.isnan(static_y.float()).any().item()
            rows.append({"svc_ms": svc * 1e3, "gpu_ms": 0.0 if a.no_events else e0.elapsed_time(e1), "event_done": bool(ev_done),
                         "nan_after_sync": bool(early), "nan_late": bool(late), "extra_sync_ms": extra * 1e3})

    def q(v, p):
        v = sorted(v)
        return v[min(len(v) - 1, int(math.ceil(p * len(v))) - 1)] if v else None

    svc = [r["svc_ms"] for r in rows]
    gpu = [r["gpu_ms"] for r in rows]
    res = {"tag": a.tag, "model": a.model, "n": len(rows), "gap_ms": a.gap, "events": not a.no_events, "sync": a.sync,
           "preload": os.environ.get("LD_PRELOAD", ""),
           "svc_ms_p50": q(svc, 0.5), "svc_ms_p99": q(svc, 0.99), "svc_ms_min": min(svc),
           "gpu_ms_p50": q(gpu, 0.5),
           "sync_early_nan": sum(r["nan_after_sync"] for r in rows),
           "event_not_done_after_sync": sum(not r["event_done"] for r in rows),
           "never_written": sum(r["nan_late"] for r in rows),
           "svc_under_half_gpu": sum(r["svc_ms"] < 0.5 * r["gpu_ms"] for r in rows),
           "rows": rows}
    with open(a.out, "w") as f:
        json.dump(res, f)
    print("GRAPHSYNC " + json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
