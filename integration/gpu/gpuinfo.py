#!/usr/bin/env python3
"""gpuinfo: what the benchmark needs to know about GPU 0, straight from the CUDA driver through ctypes.

Prints JSON: name, SM count, memory, driver version, and the SM split that green contexts use
(cuDevSmResourceSplitByCount with minSmPartitionSize, as libdetshare does), so the Python table writer publishes
the same split the library computes (on an H100: 15 groups of 8 SMs + 12 left, not 132 // 8). Struct layouts are
those of cgroupgpu/cuda/cuda_abi.h (CUdevResource: 144 bytes, the SM fields at offset 96). Works against the
simulated GPU (a test double) with LD_LIBRARY_PATH=build/lib/simgpu, which is how it is tested without a GPU.
"""
import ctypes
import json
import sys

RESOURCE_BYTES = 144
SM_OFFSET = 96
CU_DEV_RESOURCE_TYPE_SM = 1
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


def probe(min_size=0, device=0):
    cu = ctypes.CDLL("libcuda.so.1")

    def check(name, rc):
        if rc != 0:
            raise RuntimeError("%s failed: CUresult %d" % (name, rc))

    check("cuInit", cu.cuInit(0))
    dev = ctypes.c_int()
    check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), device))
    name = ctypes.create_string_buffer(256)
    check("cuDeviceGetName", cu.cuDeviceGetName(name, 256, dev))
    ver = ctypes.c_int()
    check("cuDriverGetVersion", cu.cuDriverGetVersion(ctypes.byref(ver)))
    mem = ctypes.c_size_t()
    check("cuDeviceTotalMem_v2", cu.cuDeviceTotalMem_v2(ctypes.byref(mem), dev))
    sms = ctypes.c_int()
    check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                                          dev))
    out = {"name": name.value.decode(errors="replace"), "sms": sms.value, "mem_total": mem.value,
           "driver_version": ver.value, "split": None}
    res = ctypes.create_string_buffer(RESOURCE_BYTES)
    rc = cu.cuDeviceGetDevResource(dev, res, CU_DEV_RESOURCE_TYPE_SM) if hasattr(cu, "cuDeviceGetDevResource") else -1
    if rc != 0:
        out["split_error"] = "cuDeviceGetDevResource: %d (driver without green contexts?)" % rc
        return out
    sm_count, part_min, align, _ = ctypes.cast(ctypes.byref(res, SM_OFFSET), ctypes.POINTER(ctypes.c_uint * 4))[0]
    if not min_size:
        min_size = part_min if ver.value >= 13000 and part_min else 8
    groups = (ctypes.c_char * (RESOURCE_BYTES * 64))()
    rem = ctypes.create_string_buffer(RESOURCE_BYTES)
    nb = ctypes.c_uint(64)
    rc = cu.cuDevSmResourceSplitByCount(groups, ctypes.byref(nb), res, rem, 0, min_size)
    if rc != 0:
        out["split_error"] = "cuDevSmResourceSplitByCount(min %d): %d" % (min_size, rc)
        return out
    gs = [ctypes.c_uint.from_buffer(groups, i * RESOURCE_BYTES + SM_OFFSET).value for i in range(nb.value)]
    out["split"] = {"min_size": min_size, "alignment": align or min_size, "groups": gs,
                    "remainder": ctypes.c_uint.from_buffer(rem, SM_OFFSET).value, "resource_sms": sm_count}
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nusage: gpuinfo.py [MIN_PARTITION_SIZE]")
        return 0
    try:
        info = probe(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    except (OSError, RuntimeError) as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
