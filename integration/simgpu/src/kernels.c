/*
 * kernels.c — the built-in "kernels" of the simulated GPU (test double). Every module contains all of them.
 * Each block takes `us` microseconds of simulated SM time (the last argument); the effect is computed on the host
 * memory behind the device pointers, so results are checkable and deterministic.
 *
 *   ds_spin(u32 us)
 *   ds_fill_u32(u64 dst, u32 value, u64 n, u32 us)              dst[i] = value
 *   ds_add_f32(u64 dst, u64 a, u64 b, u64 n, u32 us)            dst[i] = a[i] + b[i]
 *   ds_axpy(u64 y, u64 x, f32 alpha, u64 n, u32 us)             y[i] = alpha * x[i] + y[i]
 *   ds_smid(u64 out, u32 us)                                    out[block] = SM that ran the block (u32, like %smid)
 */
#include "simgpu.h"

#include <string.h>

#define ARG(i, T) (*(const T *)args[i])

static CUresult k_spin(void *const *args, unsigned nblocks, const uint16_t *smids) {
    (void)args, (void)nblocks, (void)smids;
    return CUDA_SUCCESS;
}

static CUresult k_fill(void *const *args, unsigned nblocks, const uint16_t *smids) {
    (void)nblocks, (void)smids;
    CUdeviceptr dst = ARG(0, uint64_t);
    uint32_t v = ARG(1, uint32_t);
    uint64_t n = ARG(2, uint64_t);
    if (n > SIZE_MAX / 4 || sim_mem_check_range(dst, (size_t)n * 4))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint32_t *p = sim_devptr(dst);
    for (uint64_t i = 0; i < n; i++)
        p[i] = v;
    return CUDA_SUCCESS;
}

static CUresult k_add(void *const *args, unsigned nblocks, const uint16_t *smids) {
    (void)nblocks, (void)smids;
    CUdeviceptr d = ARG(0, uint64_t), a = ARG(1, uint64_t), b = ARG(2, uint64_t);
    uint64_t n = ARG(3, uint64_t);
    size_t bytes = (size_t)n * 4;
    if (n > SIZE_MAX / 4 || sim_mem_check_range(d, bytes) || sim_mem_check_range(a, bytes) ||
        sim_mem_check_range(b, bytes))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    float *pd = sim_devptr(d);
    const float *pa = sim_devptr(a), *pb = sim_devptr(b);
    for (uint64_t i = 0; i < n; i++)
        pd[i] = pa[i] + pb[i];
    return CUDA_SUCCESS;
}

static CUresult k_axpy(void *const *args, unsigned nblocks, const uint16_t *smids) {
    (void)nblocks, (void)smids;
    CUdeviceptr y = ARG(0, uint64_t), x = ARG(1, uint64_t);
    float alpha = ARG(2, float);
    uint64_t n = ARG(3, uint64_t);
    size_t bytes = (size_t)n * 4;
    if (n > SIZE_MAX / 4 || sim_mem_check_range(y, bytes) || sim_mem_check_range(x, bytes))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    float *py = sim_devptr(y);
    const float *px = sim_devptr(x);
    for (uint64_t i = 0; i < n; i++)
        py[i] = alpha * px[i] + py[i];
    return CUDA_SUCCESS;
}

static CUresult k_smid(void *const *args, unsigned nblocks, const uint16_t *smids) {
    CUdeviceptr out = ARG(0, uint64_t);
    if (sim_mem_check_range(out, (size_t)nblocks * 4))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint32_t *p = sim_devptr(out);
    for (unsigned b = 0; b < nblocks; b++)
        p[b] = smids ? smids[b] : 0;
    return CUDA_SUCCESS;
}

static const sim_kernel_def defs[] = {
    {"ds_spin", 1, {4}, 0, k_spin},
    {"ds_fill_u32", 4, {8, 4, 8, 4}, 3, k_fill},
    {"ds_add_f32", 5, {8, 8, 8, 8, 4}, 4, k_add},
    {"ds_axpy", 5, {8, 8, 4, 8, 4}, 4, k_axpy},
    {"ds_smid", 2, {8, 4}, 1, k_smid},
};

const sim_kernel_def *sim_kernel_find(const char *name) {
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        if (!strcmp(defs[i].name, name))
            return &defs[i];
    return NULL;
}
