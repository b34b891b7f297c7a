/*
 * ds_narrow.h — which kernels of a lower tier run on the narrow part of its grant (ds_narrow.c).
 */
#ifndef DETSHARE_LIBDETSHARE_DS_NARROW_H
#define DETSHARE_LIBDETSHARE_DS_NARROW_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <stdbool.h>

/* A kernel whose static plus dynamic shared memory is below this is taken to be memory-bound. */
#define DS_NARROW_SMEM_MAX 8192u

/* Whether kernel f launched with dyn_smem bytes of dynamic shared memory is memory-bound (its static shared memory
 * is asked of the driver once per function and cached without a lock). false when the driver cannot say. */
bool ds_kernel_memory_bound(CUfunction f, unsigned dyn_smem);

#endif /* DETSHARE_LIBDETSHARE_DS_NARROW_H */
