/*
 * nextlib.c — another interposer, preloaded after libdetshare, that wraps getpid() the usual way: the real one
 * through dlsym(RTLD_NEXT, "getpid"). If libdetshare's dlsym made RTLD_NEXT relative to itself, this lookup
 * would find this very wrapper and recurse forever; with the caller kept, it finds glibc's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

__attribute__((visibility("default"))) pid_t getpid(void) {
    static pid_t (*real)(void);
    static int depth;
    if (!real)
        real = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    if (!real || depth > 0) {
        fprintf(stderr, "nextlib: dlsym(RTLD_NEXT, getpid) came back to the wrapper\n");
        _exit(86);
    }
    depth++;
    pid_t p = real();
    depth--;
    return p;
}
