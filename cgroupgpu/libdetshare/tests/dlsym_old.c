/*
 * dlsym_old.c — a program bound to the old glibc symbol version dlsym@GLIBC_2.2.5 (what binaries built against
 * glibc < 2.34 reference), and one bound to dlsym@GLIBC_2.34. Both must reach libdetshare's dlsym: prints, for
 * each, the object that answered a lookup of cuMemAlloc_v2 in libcuda.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
__asm__(".symver dlsym_old, dlsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver dlsym_old, dlsym@GLIBC_2.17");
#endif
void *dlsym_old(void *, const char *);

static const char *obj(void *p) {
    Dl_info i;
    if (!p || !dladdr(p, &i) || !i.dli_fname)
        return "?";
    const char *b = strrchr(i.dli_fname, '/');
    return b ? b + 1 : i.dli_fname;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("dlopen failed: %s\n", dlerror());
        return 3;
    }
    printf("old obj=%s\n", obj(dlsym_old(h, "cuMemAlloc_v2")));
    printf("new obj=%s\n", obj(dlsym(h, "cuMemAlloc_v2")));
    printf("export obj=%s\n", obj(dlsym(h, "cuGetExportTable")));
    /* RTLD_NEXT from the program itself still works through both entries */
    printf("next obj=%s\n", obj(dlsym(RTLD_NEXT, "getppid")));
    printf("getpid ok=%d\n", getpid() > 0);
    return 0;
}
