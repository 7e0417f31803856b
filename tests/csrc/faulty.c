/* Opt kernels that break the process rather than the result, with kp_matmul's ABI.
   KP_FAULT 1: writes through a null pointer (SIGSEGV); KP_FAULT 2: never returns. */
#include <stdint.h>

void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
#if KP_FAULT == 1
    volatile float *nowhere = (volatile float *)0;
    nowhere[n] = a[0] + b[0];
    c[0] = 0.0f;
#else
    volatile int forever = 1;
    while (forever) {
    }
    c[0] = a[0] + b[0] + (float)n;
#endif
}
