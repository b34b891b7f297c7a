/*
 * ds_driver.c — the real driver (ds_driver.h): libcuda opened with dlopen at the first hook call, and the table of
 * its entry points (struct ds_real: every DS_HOOKS, DS_STREAM_HOOKS and DS_NEEDED name) resolved once and published,
 * through glibc's own dlsym (ds_real_dlsym), found here too because every real-function lookup needs it.
 */
#include "ds_driver.h"

#include "ds_process.h"

#include <dlfcn.h>
#include <string.h>

struct ds_real ds_real;
atomic_int ds_drv_ready;

ds_dlsym_fn ds_real_dlsym DS_HIDDEN; /* read by the dlsym entry (ds_dlsym.c) */

static void *g_libcuda;
static pthread_once_t g_drv_once = PTHREAD_ONCE_INIT;

/* glibc's own dlsym, found once: the library's lookups of real functions (the driver's, NVML's) go through it, never
 * through the interposed dlsym. */
void ds_dlsym_init(void) {
    if (__atomic_load_n(&ds_real_dlsym, __ATOMIC_ACQUIRE))
        return;
    /* dlvsym is not interposed, so this reaches glibc: the next dlsym after us is glibc's own. */
    void *p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p)
#if defined(__aarch64__)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
#else
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
#endif
    __atomic_store_n(&ds_real_dlsym, (ds_dlsym_fn)p, __ATOMIC_RELEASE);
}

void *ds_early_sym(const char *name) {
    ds_dlsym_init();
    return ds_real_dlsym ? ds_real_dlsym(RTLD_NEXT, name) : NULL;
}

static void *drv_sym(const char *name) {
    if (!g_libcuda || !ds_real_dlsym)
        return NULL;
    return ds_real_dlsym(g_libcuda, name);
}

static void driver_once(void) {
    ds_dlsym_init();
    ds_settings_init(); /* a driver call may come before the constructor (another library's) */
    const char *path = ds_process.settings.real_libcuda;
    ds_depth++;
    g_libcuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ds_depth--;
    if (!g_libcuda) {
        const char *e = dlerror();
        DS_LOG(DS_LOG_INFO, "no CUDA driver (%s): %s", path, e ? e : "dlopen failed");
    }
    struct ds_real r;
    memset(&r, 0, sizeof r);
#define RESOLVE_HOOK_(name, base, ver, pt) r.name = (PFN_##name)drv_sym(#name);
    DS_HOOKS(RESOLVE_HOOK_)
#undef RESOLVE_HOOK_
#define RESOLVE_SOP_(name, base, ver, pt, kind, idx) r.name = drv_sym(#name);
    DS_STREAM_HOOKS(RESOLVE_SOP_)
#undef RESOLVE_SOP_
#define RESOLVE_NEEDED_(name) r.name = (PFN_##name)drv_sym(#name);
    DS_NEEDED(RESOLVE_NEEDED_)
#undef RESOLVE_NEEDED_
    ds_real = r;
    atomic_store_explicit(&ds_drv_ready, 1, memory_order_release);
}

void ds_driver_init(void) { pthread_once(&g_drv_once, driver_once); }

