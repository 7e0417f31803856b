/* kp_matmul (C = A * B, float32, n x n) in variants an optimizer searches over with -D:
   KP_VARIANT 0: naive i-j-k (ref); 1: i-k-j, the same additions per element in the same
   order (bit-identical, faster); 2: i-k-j missing the last column (wrong);
   3: writes through a null pointer (crashes); 4: never returns (hangs). */
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
#elif KP_VARIANT == 1 || KP_VARIANT == 2
    int cols = KP_VARIANT == 2 ? n - 1 : n;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < cols; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++) {
            float aik = a[i * n + k];
            for (int j = 0; j < cols; j++) c[i * n + j] += aik * b[k * n + j];
        }
    }
#elif KP_VARIANT == 3
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
