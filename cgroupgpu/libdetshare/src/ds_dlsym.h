/*
 * ds_dlsym.h — the ways into the driver that are not a direct call (ds_dlsym.c): dlsym and cuGetProcAddress.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_DLSYM_H
#define DETSHARE_LIBDETSHARE_DS_DLSYM_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

void *ds_map_proc(const char *symbol, void *real, int version, cuuint64_t flags);

#endif /* DETSHARE_LIBDETSHARE_DS_DLSYM_H */
