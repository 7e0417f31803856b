/* level1 "1_Square_matrix_multiplication_": C = A * B, float32, n x n, row-major.
   KP_OPT 0 (ref): the textbook i-j-k loop; its inner loop walks B down a column, one cache
                   line per element, one scalar product at a time.
   KP_OPT 1 (opt): register blocking: a 4 x 8 block of C is held in four 8-float vectors
                   (GCC/Clang vector extensions) while k runs, so each row segment of B loaded
                   serves four rows of A. Each C[i][j] still sums its products for k = 0..n-1
                   in the same order, one multiply and one add each, so the result is
                   bit-identical: judged byte-exact. The gain (about 4-6x at n = 256 on x86-64)
                   is large enough to stay clear of 1.0 on a busy machine. */
#include <stdint.h>
#include <string.h>

#ifndef KP_OPT
#define KP_OPT 0
#endif

#if KP_OPT == 0
void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}
#else
typedef float v8f __attribute__((vector_size(32)));

static float dot(const float *a, const float *b, int i, int j, int n) {
    float s = 0.0f;
    for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
    return s;
}

void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
            for (int k = 0; k < n; k++) {
                v8f bk;
                memcpy(&bk, b + k * n + j, sizeof bk);   /* unaligned load */
                s0 += a[(i + 0) * n + k] * bk;
                s1 += a[(i + 1) * n + k] * bk;
                s2 += a[(i + 2) * n + k] * bk;
                s3 += a[(i + 3) * n + k] * bk;
            }
            memcpy(c + (i + 0) * n + j, &s0, sizeof s0);
            memcpy(c + (i + 1) * n + j, &s1, sizeof s1);
            memcpy(c + (i + 2) * n + j, &s2, sizeof s2);
            memcpy(c + (i + 3) * n + j, &s3, sizeof s3);
        }
        for (; j < n; j++)                                /* columns left over */
            for (int r = i; r < i + 4; r++) c[r * n + j] = dot(a, b, r, j, n);
    }
    for (; i < n; i++)                                    /* rows left over */
        for (int j = 0; j < n; j++) c[i * n + j] = dot(a, b, i, j, n);
}
#endif
