/* shim.c — a tracing stand-in for libcuda.so.1 (capture_trace.sh): libdetshare loads it through
 * DETSHARE_REAL_LIBCUDA, every entry point it resolves jumps through trace_pre (tramp.S, generated) to the real
 * driver. While an application's stream capture runs, trace_pre logs each driver call with its thread and the
 * capture's status before the call, so the first line whose status reads "invalidated" follows the call that broke
 * the capture. Diagnostic only (x86-64 Linux). Output: $CAPTURE_TRACE_DIR/trace-<pid>.txt (default /tmp). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "names.h" /* TRACE_NAMES: generated, the entry points and their count TRACE_N */

void *trace_real[TRACE_N];
static const char *names[TRACE_N] = {TRACE_NAMES};
static int (*is_capturing)(void *stream, int *status);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void *cap_stream; /* the application stream whose capture is followed */
static int last_status = -1;
static unsigned long calls;
static FILE *out;

__attribute__((constructor)) static void trace_init(void) {
    const char *real = getenv("CAPTURE_TRACE_REAL");
    void *h = dlopen(real && *real ? real : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "capture_trace: %s\n", dlerror());
        abort();
    }
    for (int i = 0; i < TRACE_N; i++)
        trace_real[i] = dlsym(h, names[i]);
    is_capturing = (int (*)(void *, int *))dlsym(h, "cuStreamIsCapturing");
    char path[512];
    const char *dir = getenv("CAPTURE_TRACE_DIR");
    snprintf(path, sizeof path, "%s/trace-%d.txt", dir && *dir ? dir : "/tmp", (int)getpid());
    out = fopen(path, "w");
    if (out)
        setvbuf(out, NULL, _IOLBF, 0);
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* Called before entry point i with its first argument. Unresolved entry points abort with their name: the real
 * driver lacks them, and the jump would go to 0. */
void trace_pre(int i, uintptr_t a0) {
    if (!trace_real[i]) {
        fprintf(stderr, "capture_trace: %s is not in the real driver\n", names[i]);
        abort();
    }
    pthread_mutex_lock(&mu);
    calls++;
    const char *n = names[i];
    if (cap_stream && is_capturing && out) {
        int st = -1;
        int rc = is_capturing(cap_stream, &st);
        fprintf(out, "#%lu tid=%ld %s(a0=%#lx) capture_status_before=%d%s%s\n", calls, (long)syscall(SYS_gettid), n,
                (unsigned long)a0, rc == 0 ? st : -rc, st != last_status && last_status >= 0 ? "  <-- CHANGED" : "",
                st == 2 ? " (invalidated)" : "");
        last_status = st;
        if (starts_with(n, "cuStreamEndCapture")) {
            fprintf(out, "-- capture ends\n");
            cap_stream = NULL;
            last_status = -1;
        }
    }
    if (starts_with(n, "cuStreamBeginCapture")) {
        cap_stream = (void *)a0;
        last_status = -1;
        if (out)
            fprintf(out, "-- #%lu tid=%ld %s(stream %#lx): following this capture\n", calls,
                    (long)syscall(SYS_gettid), n, (unsigned long)a0);
    }
    pthread_mutex_unlock(&mu);
}
