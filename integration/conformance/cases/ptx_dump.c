/* ptx_dump — prints the suite's embedded PTX (cases/conf.h), so it can be checked offline with ptxas:
 *   build/tests/conformance/ptx_dump > k.ptx && ptxas -arch=sm_90 -v -o k.cubin k.ptx
 * Touches no driver. */
#include "conf.h"

int main(void) {
    fputs(conf_ptx, stdout);
    return 0;
}
