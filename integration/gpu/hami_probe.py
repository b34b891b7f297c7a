#!/usr/bin/env python3
"""hami_probe.py: does an SM limiter preloaded by the caller (HAMi-core's) apply at all, to a program that uses the
CUDA driver API directly, without the CUDA runtime? Issue 26 found that the HAMi-core hami.sh first built (as Release)
limited neither PyTorch trainers nor this probe: the probe tells "the limiter does nothing here" apart from "the
application's CUDA runtime goes around the limiter's hooks".

It loads libcuda.so.1 through ctypes (every cu* symbol through dlsym, which HAMi-core hooks), JIT-compiles a kernel
whose blocks each spin for --spin-us of the SM clock, launches it over every SM back to back for --duration seconds
(one stream, synchronising every 8 launches) and prints one JSON line: launches per second and the GPU time a launch
took. Run it alone and under the limit; the ratio is what the limit leaves. HAMi-core's limit is a feedback loop
over seconds (a token bucket refilled every 120 ms from NVML's per-process SM utilisation): a process runs about
unlimited for its first 3-4 s and then cycles with a 3-4 s period, so the default window is 10 s (under
CUDA_DEVICE_SM_LIMIT=30, 3 s left 0.88 of the launch rate, 10 s 0.60-0.67; BENCHMARKS.md, issue 26, runs Q1-Q3
and D). The kernel is named ds_spin, as the simulated GPU's built-in spin kernel is, so that the probe also runs on
that test double (which runs no PTX: there its launches show only that the driver-API path works).

    python3 integration/gpu/hami_probe.py
    LD_PRELOAD=build/hami/libvgpu.so CUDA_DEVICE_SM_LIMIT=30 python3 integration/gpu/hami_probe.py
"""
import argparse
import ctypes
import json
import sys
import time

PTX = rb"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry ds_spin(.param .u64 cycles)
{
    .reg .u64 %c<4>;
    .reg .pred %p;
    ld.param.u64 %c0, [cycles];
    mov.u64 %c1, %clock64;
LOOP:
    mov.u64 %c2, %clock64;
    sub.u64 %c3, %c2, %c1;
    setp.lt.u64 %p, %c3, %c0;
    @%p bra LOOP;
    ret;
}
"""

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz


def check(cu, what, rc):
    if rc != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(rc, ctypes.byref(name))
        raise SystemExit("hami_probe: %s failed: %d %s" % (what, rc, (name.value or b"?").decode()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0,
                    help="seconds of launches (default 10: HAMi-core's limiter takes 3-4 s to start limiting)")
    ap.add_argument("--spin-us", type=float, default=200.0, help="how long each block spins, in microseconds")
    ap.add_argument("--blocks-per-sm", type=int, default=4, help="blocks of 128 threads per SM in each launch")
    a = ap.parse_args(argv)
    if a.duration <= 0 or a.spin_us <= 0 or a.blocks_per_sm < 1:
        ap.error("--duration and --spin-us must be > 0 and --blocks-per-sm >= 1")
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise SystemExit("hami_probe: no CUDA driver here (libcuda.so.1: %s); run it on the GPU machine" % e)
    check(cu, "cuInit", cu.cuInit(0))
    dev, ctx, mod, fn, stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), None
    check(cu, "cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
    sms, khz = ctypes.c_int(), ctypes.c_int()
    check(cu, "cuDeviceGetAttribute", cu.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    check(cu, "cuDeviceGetAttribute", cu.cuDeviceGetAttribute(ctypes.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev))
    check(cu, "cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check(cu, "cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    check(cu, "cuModuleLoadData", cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX + b"\0")))
    check(cu, "cuModuleGetFunction", cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"ds_spin"))
    cycles = ctypes.c_uint64(int(a.spin_us * khz.value / 1000))
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(cycles), ctypes.c_void_p))
    grid = sms.value * a.blocks_per_sm

    def launch():
        check(cu, "cuLaunchKernel", cu.cuLaunchKernel(fn, grid, 1, 1, 128, 1, 1, 0, stream, params, None))

    launch()  # the JIT and the first launch outside the timed window
    check(cu, "cuCtxSynchronize", cu.cuCtxSynchronize())
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < a.duration:
        for _ in range(8):
            launch()
        check(cu, "cuCtxSynchronize", cu.cuCtxSynchronize())
        n += 8
    el = time.monotonic() - t0
    print(json.dumps({"launches": n, "seconds": round(el, 3), "launches_per_s": round(n / el, 1),
                      "ms_per_launch": round(1000 * el / n, 3), "spin_us": a.spin_us, "grid": grid,
                      "sms": sms.value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
