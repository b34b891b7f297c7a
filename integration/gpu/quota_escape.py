"""quota_escape.py — a hostile tenant's attempts to take device memory past its quota (issue 13 items 2 and 3),
through the CUDA driver API with ctypes (no PyTorch, so each attempt takes a fraction of a second).

  python3 quota_escape.py graph GIB [--hold S]    one graph memory-allocation node of GIB GiB, instantiated, launched
  python3 quota_escape.py capture GIB [--hold S]  cuMemAllocAsync of GIB GiB captured into a graph, launched
  python3 quota_escape.py pool GIB                default pool, release threshold UINT64_MAX, alloc+free GIB GiB:
                                                  how much the pool keeps after the free (reserved bytes)
  python3 quota_escape.py bypass GIB [--hold S]   cuMemAlloc_v2 resolved with glibc's own dlsym (the interception
                                                  library never sees the call)

Each prints one JSON line: mode, rc (CUresult; 2 = CUDA_ERROR_OUT_OF_MEMORY), the step that failed, and what
cuMemGetInfo says. Run under `detshare run --memory 4Gi` (see quota_escape.sh).
"""
import argparse
import ctypes as C
import json
import sys
import time

GIB = 1 << 30


class PoolProps(C.Structure):  # CUmemPoolProps, 88 bytes
    _fields_ = [("allocType", C.c_int), ("handleTypes", C.c_int), ("locType", C.c_int), ("locId", C.c_int),
                ("win32", C.c_void_p), ("maxSize", C.c_size_t), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 54)]


class MemAllocNodeParams(C.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS_v1
    _fields_ = [("poolProps", PoolProps), ("accessDescs", C.c_void_p), ("accessDescCount", C.c_size_t),
                ("bytesize", C.c_size_t), ("dptr", C.c_uint64)]


assert C.sizeof(PoolProps) == 88 and MemAllocNodeParams.bytesize.offset == 104


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["graph", "capture", "pool", "bypass"])
    ap.add_argument("gib", type=float)
    ap.add_argument("--hold", type=float, default=0.0, help="seconds to keep the memory before exiting")
    a = ap.parse_args(argv)
    size = int(a.gib * GIB)
    cu = C.CDLL("libcuda.so.1")
    out = {"mode": a.mode, "bytes": size}

    def call(step, rc):
        if rc != 0 and "rc" not in out:
            out["rc"], out["step"] = rc, step
        return rc

    ctx, dev = C.c_void_p(), C.c_int()
    for step, rc in (("cuInit", lambda: cu.cuInit(0)), ("cuDeviceGet", lambda: cu.cuDeviceGet(C.byref(dev), 0)),
                     ("retain", lambda: cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev)),
                     ("setcurrent", lambda: cu.cuCtxSetCurrent(ctx))):
        if call(step, rc()):
            print(json.dumps(out), flush=True)
            return 1
    if a.mode == "graph":
        g, node, ex = C.c_void_p(), C.c_void_p(), C.c_void_p()
        p = MemAllocNodeParams()
        p.poolProps.allocType, p.poolProps.locType, p.poolProps.locId = 1, 1, 0
        p.bytesize = size
        call("cuGraphCreate", cu.cuGraphCreate(C.byref(g), 0)) or \
            call("cuGraphAddMemAllocNode", cu.cuGraphAddMemAllocNode(C.byref(node), g, None, C.c_size_t(0), C.byref(p))) or \
            call("cuGraphInstantiateWithFlags", cu.cuGraphInstantiateWithFlags(C.byref(ex), g, C.c_ulonglong(0))) or \
            call("cuGraphLaunch", cu.cuGraphLaunch(ex, None)) or \
            call("cuCtxSynchronize", cu.cuCtxSynchronize())
    elif a.mode == "capture":
        s, g, ex, ptr = C.c_void_p(), C.c_void_p(), C.c_void_p(), C.c_uint64()
        call("cuStreamCreate", cu.cuStreamCreate(C.byref(s), 1)) or \
            call("cuStreamBeginCapture_v2", cu.cuStreamBeginCapture_v2(s, 0)) or \
            call("cuMemAllocAsync", cu.cuMemAllocAsync(C.byref(ptr), C.c_size_t(size), s))
        call("cuStreamEndCapture", cu.cuStreamEndCapture(s, C.byref(g)))
        if "rc" not in out:
            call("cuGraphInstantiateWithFlags", cu.cuGraphInstantiateWithFlags(C.byref(ex), g, C.c_ulonglong(0))) or \
                call("cuGraphLaunch", cu.cuGraphLaunch(ex, s)) or call("cuStreamSynchronize", cu.cuStreamSynchronize(s))
    elif a.mode == "pool":
        pool, ptr = C.c_void_p(), C.c_uint64()
        thr = C.c_uint64(2**64 - 1)
        got, reserved = C.c_uint64(), C.c_uint64()
        call("cuDeviceGetDefaultMemPool", cu.cuDeviceGetDefaultMemPool(C.byref(pool), dev)) or \
            call("cuMemPoolSetAttribute", cu.cuMemPoolSetAttribute(pool, 4, C.byref(thr))) or \
            call("cuMemPoolGetAttribute", cu.cuMemPoolGetAttribute(pool, 4, C.byref(got))) or \
            call("cuMemAllocAsync", cu.cuMemAllocAsync(C.byref(ptr), C.c_size_t(size), None)) or \
            call("cuMemFreeAsync", cu.cuMemFreeAsync(ptr, None)) or call("cuCtxSynchronize", cu.cuCtxSynchronize())
        cu.cuMemPoolGetAttribute(pool, 5, C.byref(reserved))  # CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
        out["threshold_in_driver"], out["pool_reserved_after_free"] = got.value, reserved.value
    elif a.mode == "bypass":
        libc = C.CDLL("libc.so.6")
        libc.dlvsym.restype = C.c_void_p
        libc.dlvsym.argtypes = [C.c_void_p, C.c_char_p, C.c_char_p]
        raw_dlsym = libc.dlvsym(libc._handle, b"dlsym", b"GLIBC_2.34") or \
            libc.dlvsym(libc._handle, b"dlsym", b"GLIBC_2.2.5")
        dlsym = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_char_p)(raw_dlsym)
        fn = dlsym(cu._handle, b"cuMemAlloc_v2")
        ptr = C.c_uint64()
        alloc = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_uint64), C.c_size_t)(fn)
        call("raw cuMemAlloc_v2", alloc(C.byref(ptr), size))
    out.setdefault("rc", 0)
    free, total = C.c_size_t(), C.c_size_t()
    cu.cuMemGetInfo_v2(C.byref(free), C.byref(total))
    out["meminfo_free"], out["meminfo_total"] = free.value, total.value
    print(json.dumps(out), flush=True)
    time.sleep(a.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
