"""ResNet-50 batch 1 latency, eager (about 160 kernel launches a forward) and replayed from a CUDA graph: what
overhead.sh and libab.sh time under each setting. Prints one line: LABEL eager p50=… p99=… ms graph p50=… p99=… ms.

    python3 r50lat.py LABEL
"""
import sys
import time

import torch
import torchvision

torch.backends.cudnn.benchmark = False
m = torchvision.models.resnet50().cuda().eval()
x = torch.randn(1, 3, 224, 224, device="cuda")


def lat(f, n=300):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[n // 2], ts[int(n * 0.99)]


with torch.no_grad():
    e50, e99 = lat(lambda: m(x))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            m(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = m(x)
    g50, g99 = lat(g.replay)
print(f"{sys.argv[1]:<34} eager p50={e50:.4f} p99={e99:.4f} ms   graph p50={g50:.4f} p99={g99:.4f} ms", flush=True)
