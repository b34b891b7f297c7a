/* Prints every driver entry point libdetshare resolves from the real libcuda (ds_driver.h), one per line: the list
 * capture_trace.sh builds its tracing driver shim from. */
#include "cgroupgpu/libdetshare/src/ds_driver.h"
#include <stdio.h>

int main(void) {
#define P4_(name, base, ver, pt) puts(#name);
    DS_HOOKS(P4_)
#define P6_(name, base, ver, pt, kind, idx) puts(#name);
    DS_STREAM_HOOKS(P6_)
#define P1_(name) puts(#name);
    DS_NEEDED(P1_)
    return 0;
}
