/*
 * ds_mem.h — memory accounting (ds_mem.c): the tenant's limit, charges and credits, the allocation table.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_MEM_H
#define DETSHARE_LIBDETSHARE_DS_MEM_H

#define CUDA_ABI_PROTOTYPES
#include "cgroupgpu/cuda/cuda_abi.h"

#include <stdbool.h>
#include <stdint.h>

uint64_t ds_mem_limit(void);
bool ds_charge(uint64_t size);
void ds_uncharge(uint64_t size);
void ds_track_reset_child(void);
void ds_track_lock_all(void); /* fork handler (ds_init.c, "Lock order") */
void ds_track_unlock_all(void);

/* Graph memory of a graph's second and later executables: charged before the instantiation; *charged says how
 * much (credit it back if the instantiation fails). false: it does not fit (CUDA_ERROR_OUT_OF_MEMORY). */
bool ds_graph_mem_instantiate(CUgraph g, uint64_t *charged);

#endif /* DETSHARE_LIBDETSHARE_DS_MEM_H */
