/* kp_matmul_repeat: range_ops.c's kp_matmul (the same additions in the same order, so a
   bit-identical C = A * B) computed KP_REPEAT times over, each pass overwriting C: a slow
   operation by construction, KP_REPEAT times the work of one matmul
   (tests/test_optimize_range.py: a capture whose first launch a retune makes fast). */
#include <stdint.h>

#ifndef KP_REPEAT
#define KP_REPEAT 8
#endif

void kp_matmul_repeat(const float *a, const float *b, float *c, int32_t n) {
    for (int r = 0; r < KP_REPEAT; r++)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
                for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
                c[i * n + j] = s;
            }
}
