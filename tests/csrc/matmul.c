/* C[n x n] = A[n x n] * B[n x n], float32, row-major. Three builds of one function:
   KP_VARIANT 0: naive i-j-k loop (strided walk down B's columns: cache-unfriendly);
   KP_VARIANT 1: i-k-j loop (streams rows of B), the same additions in the same order per
                 element, so the result is bit-identical;
   KP_VARIANT 2: i-k-j with an off-by-one bug (the last column is never written). */
#include <stdint.h>

#ifndef KP_VARIANT
#define KP_VARIANT 0
#endif

void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
#if KP_VARIANT == 0
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
#else
    int cols = KP_VARIANT == 2 ? n - 1 : n;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < cols; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++) {
            float aik = a[i * n + k];
            for (int j = 0; j < cols; j++) c[i * n + j] += aik * b[k * n + j];
        }
    }
#endif
}
