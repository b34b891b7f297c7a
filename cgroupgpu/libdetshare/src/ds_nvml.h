/*
 * ds_nvml.h — NVML (ds_nvml.c): the tenant's view of GPU memory for nvidia-smi, pynvml and the like.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_NVML_H
#define DETSHARE_LIBDETSHARE_DS_NVML_H



/* The wrapper of an NVML entry point the library hooks, or NULL. */
void *ds_nvml_wrapper_for(const char *name);

#endif /* DETSHARE_LIBDETSHARE_DS_NVML_H */
