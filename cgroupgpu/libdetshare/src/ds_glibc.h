/*
 * ds_glibc.h — keeps libdetshare loadable with glibc 2.17 (the oldest glibc DetShare supports in a container).
 *
 * libdetshare is preloaded into every process of a tenant container, whose glibc is the image's, not the build
 * host's. glibc 2.34 moved libdl and libpthread into libc and gave their functions a new default symbol version
 * (GLIBC_2.34), so a library built on a current host needs GLIBC_2.34 and every program of an older image (Debian
 * 11, Ubuntu 20.04, UBI 8) fails to start. The build forces this header into every source file (-include in
 * build.mk); it binds those functions to their original versions, which every glibc since has kept with the same
 * ABI. The library also names libdl.so.2 and libpthread.so.0 as needed (build.mk), because before 2.34 these
 * functions live there. stat/fstat became real symbols in 2.33 (before, inline calls of __xstat): here they are
 * macros for plain system calls, so every caller (internal/table's client header too) is covered. TestLibdetshareGlibcBaseline fails on any symbol needing more than GLIBC_2.17.
 *
 * Only functions whose old and new versions share one ABI belong here (not pthread_cond_*: their GLIBC_2.2.5
 * versions are the pre-NPTL ABI).
 */
#ifndef DS_GLIBC_H
#define DS_GLIBC_H

#if defined(__x86_64__)
#define DS_GLIBC_OLD "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define DS_GLIBC_OLD "GLIBC_2.17"
#endif

#ifdef DS_GLIBC_OLD
#define DS_OLD_SYMVER(name) __asm__(".symver " #name "," #name "@" DS_GLIBC_OLD)
DS_OLD_SYMVER(dladdr);
DS_OLD_SYMVER(dlclose);
DS_OLD_SYMVER(dlerror);
DS_OLD_SYMVER(dlopen);
DS_OLD_SYMVER(dlvsym);
DS_OLD_SYMVER(pthread_attr_setstacksize);
DS_OLD_SYMVER(pthread_create);
DS_OLD_SYMVER(pthread_detach);
DS_OLD_SYMVER(pthread_getspecific);
DS_OLD_SYMVER(pthread_join);
DS_OLD_SYMVER(pthread_key_create);
DS_OLD_SYMVER(pthread_key_delete);
DS_OLD_SYMVER(pthread_kill);
DS_OLD_SYMVER(pthread_mutex_trylock);
DS_OLD_SYMVER(pthread_mutexattr_init);
DS_OLD_SYMVER(pthread_mutexattr_settype);
DS_OLD_SYMVER(pthread_once);
DS_OLD_SYMVER(pthread_setspecific);
DS_OLD_SYMVER(pthread_sigmask);
DS_OLD_SYMVER(sem_init);
DS_OLD_SYMVER(sem_post);
DS_OLD_SYMVER(sem_timedwait);
DS_OLD_SYMVER(sem_wait);
#undef DS_OLD_SYMVER
#endif

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* struct stat is the kernel's on x86_64 and aarch64, so the system calls fill it as glibc's stat would. Function-like
 * macros leave `struct stat` alone. */
static inline int ds_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }
static inline int ds_stat(const char *path, struct stat *st) {
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}
#define fstat(fd, st) ds_fstat((fd), (st))
#define stat(path, st) ds_stat((path), (st))

#endif
