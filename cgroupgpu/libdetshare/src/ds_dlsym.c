/*
 * ds_dlsym.c — the ways into the driver that are not a direct call: dlsym (both glibc symbol versions) and
 * cuGetProcAddress{,_v2}.
 *
 * dlsym: glibc resolves RTLD_NEXT relative to the *caller* of dlsym (its return address). A C wrapper that calls
 * the real dlsym would make every RTLD_NEXT lookup relative to libdetshare and send other interposers (malloc
 * wrappers, profilers) into themselves. So the exported dlsym is a few instructions of assembly: RTLD_NEXT jumps
 * straight to glibc's dlsym with the caller's return address intact; everything else jumps to ds_dlsym_c, which
 * still sees the original caller as its return address.
 *
 * Only names we hook, defined by libcuda / libnvidia-ml, looked up by someone other than that library itself, are
 * redirected to our wrappers; everything else (cuGetExportTable included) is the real answer.
 */
#include "ds_dlsym.h"

#include "ds_driver.h"
#include "ds_nvml.h"
#include "ds_process.h"
#include "ds_streams.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* dlsym@@GLIBC_2.34 and dlsym@GLIBC_2.2.5 (aarch64: @GLIBC_2.17), both the same entry. ds_real_dlsym is glibc's
 * own dlsym (ds_driver.c). */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl ds_dlsym_entry\n"
        ".type ds_dlsym_entry,@function\n"
        "ds_dlsym_entry:\n"
        ".globl ds_dlsym_entry_old\n"
        "ds_dlsym_entry_old:\n"
        "    cmpq $-1, %rdi\n"
        "    jne 1f\n"
        "    movq ds_real_dlsym(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    jmp *%rax\n"
        "1:  jmp ds_dlsym_c\n"
        ".size ds_dlsym_entry, .-ds_dlsym_entry\n"
        ".symver ds_dlsym_entry, dlsym@@GLIBC_2.34\n"
        ".symver ds_dlsym_entry_old, dlsym@GLIBC_2.2.5\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl ds_dlsym_entry\n"
        ".type ds_dlsym_entry,%function\n"
        "ds_dlsym_entry:\n"
        ".globl ds_dlsym_entry_old\n"
        "ds_dlsym_entry_old:\n"
        "    cmn x0, #1\n"
        "    b.ne 1f\n"
        "    adrp x16, ds_real_dlsym\n"
        "    ldr x16, [x16, #:lo12:ds_real_dlsym]\n"
        "    cbz x16, 1f\n"
        "    br x16\n"
        "1:  b ds_dlsym_c\n"
        ".size ds_dlsym_entry, .-ds_dlsym_entry\n"
        ".symver ds_dlsym_entry, dlsym@@GLIBC_2.34\n"
        ".symver ds_dlsym_entry_old, dlsym@GLIBC_2.17\n");
#else
#error "libdetshare: dlsym entry written for x86_64 and aarch64 only"
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * The hook table.
 * ------------------------------------------------------------------------------------------------------------- */
struct hook {
    const char *name;
    const char *base;
    int version;
    int per_thread;
    void *wrapper;
    size_t real_off; /* offset of the real pointer in struct ds_real */
};

static const struct hook g_hooks[] = {
#define DS_HOOK_ENTRY_(name, base, ver, pt) {#name, #base, ver, pt, (void *)name, offsetof(struct ds_real, name)},
    DS_HOOKS(DS_HOOK_ENTRY_)
#undef DS_HOOK_ENTRY_
#define DS_SOP_ENTRY_(name, base, ver, pt, kind, idx)                                                                \
    {#name, #base, ver, pt, (void *)ds_w_##name, offsetof(struct ds_real, name)},
    DS_STREAM_HOOKS(DS_SOP_ENTRY_)
#undef DS_SOP_ENTRY_
};
#define N_HOOKS (sizeof g_hooks / sizeof g_hooks[0])

static void *hook_real(const struct hook *h) { return *(void **)((char *)&ds_real + h->real_off); }

static const struct hook *hook_by_name(const char *name) {
    for (size_t i = 0; i < N_HOOKS; i++)
        if (!strcmp(g_hooks[i].name, name))
            return &g_hooks[i];
    return NULL;
}

static bool same_object(const void *a, const void *b) {
    Dl_info ia, ib;
    if (!dladdr(a, &ia) || !dladdr(b, &ib))
        return false;
    return ia.dli_fbase == ib.dli_fbase;
}

static bool object_named(const void *addr, const char *prefix) {
    Dl_info i;
    if (!dladdr(addr, &i) || !i.dli_fname)
        return false;
    const char *base = strrchr(i.dli_fname, '/');
    base = base ? base + 1 : i.dli_fname;
    return strncmp(base, prefix, strlen(prefix)) == 0;
}

DS_HIDDEN void *ds_dlsym_c(void *handle, const char *name) {
    void *caller = __builtin_return_address(0);
    ds_dlsym_init();
    if (!ds_real_dlsym)
        return NULL;
    void *real = ds_real_dlsym(handle, name);
    if (!real || !name || !(ds_process.tenant || ds_process.refused) || ds_depth)
        return real;
    if (name[0] == 'c' && name[1] == 'u') {
        const struct hook *h = hook_by_name(name);
        if (!h)
            return real;
        /* libcuda looking itself up keeps its own functions */
        if (!object_named(real, "libcuda.so") || same_object(real, caller))
            return real;
        return h->wrapper;
    }
    if (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l') {
        void *w = ds_nvml_wrapper_for(name);
        if (!w || !object_named(real, "libnvidia-ml.so") || same_object(real, caller))
            return real;
        return w;
    }
    return real;
}

/* What cuGetProcAddress hands back for (symbol, version, flags) when the driver answered `real`. The driver has
 * already chosen the variant (ABI version, _ptsz/_ptds); when its answer is one of its exported functions we hook,
 * we return the wrapper of exactly that export. Otherwise we choose the variant by name like the driver does. */
void *ds_map_proc(const char *symbol, void *real, int version, cuuint64_t flags) {
    ds_driver();
    for (size_t i = 0; i < N_HOOKS; i++) {
        if (real == hook_real(&g_hooks[i]) || real == g_hooks[i].wrapper)
            return g_hooks[i].wrapper;
    }
    int pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    const struct hook *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++) {
        int want_pt = pass == 0 ? pt : 0;
        if (pass == 1 && !pt)
            break;
        for (size_t i = 0; i < N_HOOKS; i++) {
            const struct hook *h = &g_hooks[i];
            if (h->per_thread != want_pt || h->version > version || strcmp(h->base, symbol))
                continue;
            if (!best || h->version > best->version)
                best = h;
        }
    }
    if (!best || !hook_real(best))
        return real;
    /* The answer is not an export we hook. If it is another export (a variant newer than this library knows, with
     * perhaps another signature), wrapping it with an older variant's wrapper would break the ABI: pass it through.
     * Only an internal function (no exported name) is taken to be the variant the name and version select. */
    Dl_info i;
    if (dladdr(real, &i) && i.dli_sname && strcmp(i.dli_sname, best->name) != 0) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            DS_LOG(DS_LOG_WARN, "cuGetProcAddress(%s, %d) answered with %s, unknown to this library: not intercepted",
                   symbol, version, i.dli_sname);
        /* an operation on streams the library cannot see: lazy edges could miss it, so give every kernel its own */
        if (!strncmp(best->name, "cuStream", 8) || !strncmp(best->name, "cuLaunch", 8) ||
            !strncmp(best->name, "cuMemcpy", 8) || !strncmp(best->name, "cuMemset", 8) ||
            !strncmp(best->name, "cuEvent", 7) || !strncmp(best->name, "cuGraph", 7) ||
            !strncmp(best->name, "cuCtx", 5))
            ds_streams_force_strict("an unknown variant of a stream operation was looked up");
        return real;
    }
    return best->wrapper;
}

/* ---------------------------------------------------------------------------------------------------------------
 * cuGetProcAddress / cuGetProcAddress_v2
 * ------------------------------------------------------------------------------------------------------------- */
DS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    DS_REAL_OR_FAIL(cuGetProcAddress_v2);
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && (ds_process.tenant || ds_process.refused) && !ds_depth && symbol && pfn && *pfn)
        *pfn = ds_map_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

DS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    DS_REAL_OR_FAIL(cuGetProcAddress);
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && (ds_process.tenant || ds_process.refused) && !ds_depth && symbol && pfn && *pfn)
        *pfn = ds_map_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}
