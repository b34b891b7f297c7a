/*
 * module.c — modules, libraries, functions and kernels of the simulated GPU (test double). Any image loads; every
 * module contains the built-in kernels of kernels.c and nothing else.
 */
#include "simgpu.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static CUresult mod_new(CUmodule *module, const void *image) {
    SIM_CHECK_INIT();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = sim_current_ctx();
    if (!sim_ctx_valid(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SIM_MODULE;
    /* Modules are device resources: loaded while a green context is current they still belong to the primary
     * context, so a graph node made from their functions is not confined by that green context. */
    m->ctx = c->green ? &g_sim.dev[c->device].primary : c;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    SIM_CHECK_INIT();
    if (!fname)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    return mod_new(module, fname);
}
CUresult cuModuleLoadData(CUmodule *module, const void *image) { return mod_new(module, image); }
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues) {
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return mod_new(module, image);
}
CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) { return mod_new(module, fatCubin); }

CUresult cuModuleUnload(CUmodule hmod) {
    SIM_CHECK_INIT();
    if (!hmod || hmod->magic != SIM_MODULE || hmod->lib)
        return CUDA_ERROR_INVALID_HANDLE;
    hmod->magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

static CUresult func_get(struct CUmod_st *m, const char *name, CUfunction *out) {
    const sim_kernel_def *def = sim_kernel_find(name);
    if (!def)
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_sim.lock);
    struct CUfunc_st *f = m->funcs;
    while (f && f->def != def)
        f = f->next;
    if (!f && (f = calloc(1, sizeof *f))) {
        f->magic = SIM_FUNC;
        f->def = def;
        f->mod = m;
        f->next = m->funcs;
        m->funcs = f;
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    SIM_CHECK_INIT();
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != SIM_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    return func_get(hmod, name, hfunc);
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name) {
    SIM_CHECK_INIT();
    (void)dptr, (void)bytes;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != SIM_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_ERROR_NOT_FOUND; /* built-in modules have no globals */
}

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
    SIM_CHECK_INIT();
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

static CUresult lib_new(CUlibrary *library, const void *code, unsigned numJit, CUjit_option *jo, void **jv,
                        unsigned numLib, CUlibraryOption *lo, void **lv) {
    SIM_CHECK_INIT();
    if (!library || !code || (numJit && (!jo || !jv)) || (numLib && (!lo || !lv)))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUlib_st *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = SIM_LIB;
    l->mod.magic = SIM_MODULE;
    l->mod.lib = l; /* context-independent: kernels take their context from the launch stream */
    *library = l;
    return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
                           unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions) {
    return lib_new(library, code, numJitOptions, jitOptions, jitOptionsValues, numLibraryOptions, libraryOptions,
                   libraryOptionValues);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                               void **libraryOptionValues, unsigned int numLibraryOptions) {
    SIM_CHECK_INIT();
    if (!fileName)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fileName, R_OK) != 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    return lib_new(library, fileName, numJitOptions, jitOptions, jitOptionsValues, numLibraryOptions, libraryOptions,
                   libraryOptionValues);
}

CUresult cuLibraryUnload(CUlibrary library) {
    SIM_CHECK_INIT();
    if (!library || library->magic != SIM_LIB)
        return CUDA_ERROR_INVALID_HANDLE;
    library->magic = SIM_DEAD;
    library->mod.magic = SIM_DEAD;
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    SIM_CHECK_INIT();
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!library || library->magic != SIM_LIB)
        return CUDA_ERROR_INVALID_HANDLE;
    const sim_kernel_def *def = sim_kernel_find(name);
    if (!def)
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_sim.lock);
    struct CUkern_st *k = library->kerns;
    while (k && k->def != def)
        k = k->next;
    if (!k && (k = calloc(1, sizeof *k))) {
        k->magic = SIM_KERN;
        k->def = def;
        k->lib = library;
        k->func.magic = SIM_FUNC;
        k->func.def = def;
        k->func.mod = &library->mod;
        k->next = library->kerns;
        library->kerns = k;
    }
    pthread_mutex_unlock(&g_sim.lock);
    if (!k)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pKernel = k;
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library) {
    SIM_CHECK_INIT();
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    if (!library || library->magic != SIM_LIB)
        return CUDA_ERROR_INVALID_HANDLE;
    *pMod = &library->mod;
    return CUDA_SUCCESS;
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    SIM_CHECK_INIT();
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!kernel || kernel->magic != SIM_KERN)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!sim_ctx_valid(sim_current_ctx()))
        return CUDA_ERROR_INVALID_CONTEXT;
    *pFunc = &kernel->func;
    return CUDA_SUCCESS;
}

CUresult cuKernelGetName(const char **name, CUkernel hfunc) {
    SIM_CHECK_INIT();
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hfunc || hfunc->magic != SIM_KERN)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = hfunc->def->name;
    return CUDA_SUCCESS;
}

static CUresult func_attr(const struct CUfunc_st *f, CUfunction_attribute attrib, int *pi) {
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; break;
    default:
        if ((int)attrib < 0 || (int)attrib >= 16)
            return CUDA_ERROR_INVALID_VALUE;
        *pi = f->attrs[attrib];
    }
    return CUDA_SUCCESS;
}

CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!kernel || kernel->magic != SIM_KERN)
        return CUDA_ERROR_INVALID_HANDLE;
    return func_attr(&kernel->func, attrib, pi);
}

CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev) {
    CUresult r = sim_check_device(dev);
    if (r)
        return r;
    if (!kernel || kernel->magic != SIM_KERN)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((int)attrib < 0 || (int)attrib >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    kernel->func.attrs[attrib] = val;
    return CUDA_SUCCESS;
}

static bool func_ok(CUfunction f) { return f && f->magic == SIM_FUNC; }

CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    SIM_CHECK_INIT();
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!func_ok(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    *name = hfunc->def->name;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc) {
    SIM_CHECK_INIT();
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    if (!func_ok(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    *hmod = hfunc->mod;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    SIM_CHECK_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!func_ok(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    return func_attr(hfunc, attrib, pi);
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    SIM_CHECK_INIT();
    if (!func_ok(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    if ((int)attrib < 0 || (int)attrib >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    hfunc->attrs[attrib] = value;
    return CUDA_SUCCESS;
}

CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    SIM_CHECK_INIT();
    if (!func_ok(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    return (unsigned)config <= CU_FUNC_CACHE_PREFER_EQUAL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize) {
    SIM_CHECK_INIT();
    if (!numBlocks || blockSize <= 0 || blockSize > 1024 || dynamicSMemSize > 232448)
        return CUDA_ERROR_INVALID_VALUE;
    if (!func_ok(func))
        return CUDA_ERROR_INVALID_HANDLE;
    *numBlocks = 1; /* in the model a block occupies a whole SM */
    return CUDA_SUCCESS;
}
