/*
 * ds_narrow.c — memory-bound kernels of a lower tier on a narrow part of its grant (issue 26).
 *
 * Why. Beside a latency-critical (LC) tenant on its own SMs, what still slows the LC is memory traffic, and most of
 * it comes from the neighbour's memory-bound kernels, not its GEMMs. Measured on the H100 (BENCHMARKS.md, "The
 * neighbour's optimizer, not its GEMMs, slows the LC"): beside the fp32 trainer's GEMMs alone a batch-1 BERT runs at
 * x1.58 of its solo P99, beside its AdamW step alone at x2.66, beside the whole step x2.54; the AdamW step on 10 % of
 * the SMs still runs at 0.43 of its solo speed and leaves the LC at x1.37. Memory-bound kernels saturate HBM on few
 * SMs while GEMMs need every SM they can get, so the scheduler gives a lower tier beside an LC a narrow part of its
 * grant (ds_container.narrow_groups, its lowest groups) for memory-bound kernels, and the whole grant for the rest.
 *
 * Which kernels. On the H100 every GEMM, convolution and attention kernel of the measured trainers (cuBLAS, cuDNN,
 * CUTLASS, nvjet; integration/gpu/kernelgrid.py) uses 12 KiB of shared memory or more, and every elementwise,
 * optimizer (multi_tensor_apply), reduction, softmax and layer-norm kernel 2 KiB or less. So a kernel with less than
 * DS_NARROW_SMEM_MAX bytes of shared memory, static (cuFuncGetAttribute, once per function) plus dynamic (the
 * launch's), is taken as memory-bound. A kernel misjudged runs slower or interferes more; its result is the same
 * (kernels, configurations and arguments are never changed, only the stream they are sent to, as at any grant change).
 *
 * Trust: the narrow part lies inside the tenant's own grant, so a tenant that asks for shared memory it does not need
 * (or launches through a path that is never narrowed) only keeps its memory-bound kernels on the rest of its own
 * grant: it can make itself a worse neighbour of the latency-critical tenant, as it could with any kernel on its
 * grant, never run outside it. narrow_groups is written by the scheduler in the table, which tenants cannot write.
 *
 * Cost: only with narrow_groups set, one lookup in a lock-free direct-mapped cache per launch; a function not in it
 * (first launch, or evicted by a collision) asks the driver again.
 */
#include "ds_narrow.h"

#include "ds_driver.h"

#include <stdatomic.h>
#include <stdint.h>

#define SMEM_SLOTS 1024u
#define SMEM_UNKNOWN UINT32_MAX

struct smem_slot {
    _Atomic(uintptr_t) key; /* the function; 0 while the slot is written */
    atomic_uint smem;       /* its static shared memory, SMEM_UNKNOWN when the driver could not say */
};
static struct smem_slot g_smem[SMEM_SLOTS];

static unsigned slot_of(uintptr_t k) { return (unsigned)((k >> 4) ^ (k >> 14) ^ (k >> 24)) % SMEM_SLOTS; }

static uint32_t static_smem(CUfunction f) {
    int v = -1;
    if (ds_real.cuFuncGetAttribute &&
        ds_real.cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f) == CUDA_SUCCESS && v >= 0)
        return (uint32_t)v;
    /* the runtime may launch a CUkernel in place of a CUfunction: ask for it on the current device */
    CUdevice dev = 0;
    if (ds_real.cuKernelGetAttribute && ds_real.cuCtxGetDevice && ds_real.cuCtxGetDevice(&dev) == CUDA_SUCCESS &&
        ds_real.cuKernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, (CUkernel)f, dev) == CUDA_SUCCESS &&
        v >= 0)
        return (uint32_t)v;
    return SMEM_UNKNOWN;
}

bool ds_kernel_memory_bound(CUfunction f, unsigned dyn_smem) {
    if (!f || dyn_smem >= DS_NARROW_SMEM_MAX)
        return false;
    uintptr_t k = (uintptr_t)f;
    struct smem_slot *s = &g_smem[slot_of(k)];
    uint32_t st;
    /* key, value, key again: a writer clears the key before it changes the value */
    if (atomic_load(&s->key) == k) {
        st = atomic_load(&s->smem);
        if (atomic_load(&s->key) == k)
            return st != SMEM_UNKNOWN && st + dyn_smem < DS_NARROW_SMEM_MAX;
    }
    st = static_smem(f);
    atomic_store(&s->key, 0);
    atomic_store(&s->smem, st);
    atomic_store(&s->key, k);
    return st != SMEM_UNKNOWN && st + dyn_smem < DS_NARROW_SMEM_MAX;
}
