/*
 * procmap.c — cuGetProcAddress answers that are not one of the driver's exported functions (the null driver hands
 * out an internal function for cuMemAlloc): libdetshare must still return its wrapper, chosen by name and version,
 * so the allocation is counted. Prints "<lookup> sym=<symbol> obj=<object>" and the result of calling it.
 */
#include "cgroupgpu/cuda/cuda_abi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char *obj_of(void *p, const char **sym) {
    Dl_info i;
    *sym = "?";
    if (!p || !dladdr(p, &i) || !i.dli_fname)
        return "?";
    if (i.dli_sname)
        *sym = i.dli_sname;
    const char *b = strrchr(i.dli_fname, '/');
    return b ? b + 1 : i.dli_fname;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    PFN_cuGetProcAddress_v2 gp = h ? (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2") : NULL;
    PFN_cuInit init = NULL;
    if (!gp || gp("cuInit", (void **)&init, 2000, 0, NULL) || init(0)) {
        printf("setup failed\n");
        return 3;
    }
    void *p = NULL;
    const char *sym, *obj;
    CUresult r = gp("cuMemAlloc", &p, 3020, 0, NULL);
    obj = obj_of(p, &sym);
    printf("memalloc rc=%d sym=%s obj=%s\n", r, sym, obj);
    CUdeviceptr d = 0;
    r = p ? ((PFN_cuMemAlloc_v2)p)(&d, 1 << 20) : CUDA_ERROR_NOT_FOUND;
    printf("call rc=%d ptr=%d\n", r, d != 0);
    p = NULL;
    r = gp("cuMemAlloc", &p, 20000, 0, NULL);
    obj = obj_of(p, &sym);
    printf("future rc=%d sym=%s obj=%s\n", r, sym, obj);
    p = NULL;
    r = gp("cuLaunchKernel", &p, 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL);
    obj = obj_of(p, &sym);
    printf("launchpt rc=%d sym=%s obj=%s\n", r, sym, obj);
    return 0;
}
