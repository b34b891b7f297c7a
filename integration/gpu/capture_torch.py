#!/usr/bin/env python3
"""capture_torch: PyTorch's CUDA-graph capture patterns (issue 28) give the bits of eager execution.

Each pattern runs eagerly, then is captured with torch.cuda.graph and replayed on the same static buffers; the
outputs must be bit-identical (torch.equal). Patterns: memsets (zero_, fill_ and a 0.5 GiB torch.zeros allocated
inside the capture, as the issue's failing case), copies (device to device, pinned host to device and device to
pinned host, non-blocking), a side stream forked and joined through wait_stream, and event record/wait. With
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync the allocations inside the capture are stream-ordered (graph memory
nodes). Prints one "pattern=<name> ok=<yes|no>" line each and "CAPTURE_TORCH ok=<n>/<m>"; exit status 0 only when
every pattern matches. capture_patterns.sh runs it natively and under the library, without and with MPS.
"""
import sys

import torch

N = 1 << 20
BIG = 512 << 20  # bytes: the 0.5 GiB memset


def memset(st):
    st["a"].zero_()
    st["b"].fill_(0)
    big = torch.zeros(BIG, dtype=torch.uint8, device="cuda")  # cudaMemsetAsync of 0.5 GiB inside the capture
    st["a"] += st["x"] + big[:N].float()
    st["b"] += 3


def copies(st):
    st["a"].copy_(st["x"])                                   # device to device
    st["b"].copy_(st["pinned_in"], non_blocking=True)        # pinned host to device
    st["pinned_out"].copy_(st["a"], non_blocking=True)       # device to pinned host


def side_stream(st):
    cur = torch.cuda.current_stream()
    s = st["side"]
    s.wait_stream(cur)
    with torch.cuda.stream(s):
        st["b"].zero_()
        st["b"] += st["x"] * 2
    cur.wait_stream(s)
    st["a"].copy_(st["b"] + 1)


def events(st):
    e = st["event"]
    st["a"].fill_(1)
    e.record()
    torch.cuda.current_stream().wait_event(e)
    st["b"].copy_(st["a"] * st["x"])


PATTERNS = [("memset", memset), ("copies", copies), ("side_stream", side_stream), ("events", events)]


def state():
    return {"x": torch.arange(N, dtype=torch.float32, device="cuda"),
            "a": torch.full((N,), 7.0, device="cuda"), "b": torch.full((N,), 7.0, device="cuda"),
            "pinned_in": torch.arange(N, dtype=torch.float32).mul_(0.5).pin_memory(),
            "pinned_out": torch.zeros(N, dtype=torch.float32).pin_memory(),
            "side": torch.cuda.Stream(), "event": torch.cuda.Event()}


def outputs(st):
    return [st["a"].clone(), st["b"].clone(), st["pinned_out"].clone()]


def reset(st):
    st["a"].fill_(7.0)
    st["b"].fill_(7.0)
    st["pinned_out"].zero_()
    torch.cuda.synchronize()


def main():
    torch.cuda.init()
    print("info: device=%s torch=%s cuda=%s alloc=%s" % (torch.cuda.get_device_name(0), torch.__version__,
                                                         torch.version.cuda, torch.cuda.get_allocator_backend()))
    good = 0
    for name, fn in PATTERNS:
        st = state()
        reset(st)
        fn(st)
        torch.cuda.synchronize()
        want = outputs(st)
        reset(st)
        err = ""
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(st)
            torch.cuda.synchronize()
            g.replay()
            torch.cuda.synchronize()
            got = outputs(st)
            ok = all(torch.equal(w, h) for w, h in zip(want, got))
        except Exception as e:  # noqa: BLE001 (a capture invalidated under the library raises here)
            ok, err = False, "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        good += ok
        print("pattern=%s ok=%s%s" % (name, "yes" if ok else "no", (" error=%r" % err) if err else ""), flush=True)
    print("CAPTURE_TORCH ok=%d/%d" % (good, len(PATTERNS)))
    return 0 if good == len(PATTERNS) else 1


if __name__ == "__main__":
    sys.exit(main())
