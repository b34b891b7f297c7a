#!/usr/bin/env python3
"""greenperf_torch: does a real model's CUDA graph replay slower from a green context? No DetShare code involved.

ResNet-50 batch 1 (torchvision, random weights, cuDNN autotuning off), eager and CUDA graph, on:
  a primary-context stream; a green-context stream over every SM group; one over 4 groups (32 SMs on an H100).
Graphs are captured on each stream and replayed on the stream they were captured on (and the green captures also on
the primary stream). Green contexts are made with the driver API through ctypes. Prints one line per setting with
P50/P99 latency (launch + synchronize, ms).

    python3 integration/gpu/probes/greenperf_torch.py [--n 300]
"""
import argparse
import ctypes
import time

import torch
import torchvision

RES_BYTES = 144  # sizeof(CUdevResource), 12.4+ (cgroupgpu/cuda/cuda_abi.h asserts it)
SM_COUNT_OFF = 96


def green_stream(cu, first, n, parts):
    desc = ctypes.c_void_p()
    r = cu.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(parts, first * RES_BYTES), n)
    assert r == 0, "cuDevResourceGenerateDesc %d" % r
    g = ctypes.c_void_p()
    r = cu.cuGreenCtxCreate(ctypes.byref(g), desc, ctypes.c_int(0), 1)  # CU_GREEN_CTX_DEFAULT_STREAM
    assert r == 0, "cuGreenCtxCreate %d" % r
    s = ctypes.c_void_p()
    r = cu.cuGreenCtxStreamCreate(ctypes.byref(s), g, 1, 0)  # CU_STREAM_NON_BLOCKING
    assert r == 0, "cuGreenCtxStreamCreate %d" % r
    return torch.cuda.ExternalStream(s.value)


def lat(f, stream, n):
    for _ in range(20):
        f()
    stream.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        stream.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[n // 2], ts[int(n * 0.99)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = False
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    cu = ctypes.CDLL("libcuda.so.1")
    allres = (ctypes.c_ubyte * RES_BYTES)()
    assert cu.cuDeviceGetDevResource(ctypes.c_int(0), allres, 1) == 0  # CU_DEV_RESOURCE_TYPE_SM
    parts = (ctypes.c_ubyte * (RES_BYTES * 64))()
    rem = (ctypes.c_ubyte * RES_BYTES)()
    nb = ctypes.c_uint(64)
    assert cu.cuDevSmResourceSplitByCount(parts, ctypes.byref(nb), allres, rem, 0, 8) == 0
    ngroups = nb.value
    gsms = int.from_bytes(bytes(parts[SM_COUNT_OFF:SM_COUNT_OFF + 4]), "little")
    streams = {"primary": torch.cuda.Stream(), "green-all": green_stream(cu, 0, ngroups, parts),
               "green-4": green_stream(cu, 0, 4, parts)}
    print("groups %d of %d SMs" % (ngroups, gsms), flush=True)
    m = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    graphs = {}
    with torch.no_grad():
        for name, s in streams.items():
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                e50, e99 = lat(lambda: m(x), s, a.n)
            print("%-10s eager            p50 %.3f p99 %.3f ms" % (name, e50, e99), flush=True)
            with torch.cuda.stream(s):
                for _ in range(3):
                    m(x)
            s.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                m(x)
            graphs[name] = g
        for name, g in graphs.items():
            for on in ([name] if name == "primary" else [name, "primary"]):
                s = streams[on]

                def replay(g=g, s=s):
                    with torch.cuda.stream(s):
                        g.replay()

                g50, g99 = lat(replay, s, a.n)
                print("%-10s graph on %-9s p50 %.3f p99 %.3f ms" % (name, on, g50, g99), flush=True)


if __name__ == "__main__":
    main()
