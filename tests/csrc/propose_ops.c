/* Candidates for the range of tests/csrc/range_ops.c (matmul, bias, ReLU) whose policy
   `kpair pair --propose-policy` proposes (tests/test_policy_propose.py). Same signature as
   kp_fused: (n, bias, a, b, out, row). */
#include <stdint.h>

/* Honest, but reassociated: every dot product summed in four interleaved partial sums
   (k mod 4), as a vectorised or fused kernel would, so it rounds differently from the
   range's k-ascending sum. */
void kp_fused_reassoc(int32_t n, const float *bias, const float *a, const float *b,
                      float *out, float *row) {
    (void)row;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k = 0; k < n; k++) s[k & 3] += a[i * n + k] * b[k * n + j];
            float v = ((s[0] + s[2]) + (s[1] + s[3])) + bias[j];
            out[i * n + j] = v > 0.0f ? v : 0.0f;
        }
}

/* Wrong: 3 % too large everywhere (a tolerance under KernelBench's 1e-2 cannot cover it). */
void kp_fused_scaled(int32_t n, const float *bias, const float *a, const float *b,
                     float *out, float *row) {
    (void)row;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            float v = (s + bias[j]) * 1.03f;
            out[i * n + j] = v > 0.0f ? v : 0.0f;
        }
}

/* kp_matmul's layout (a, b, c, n), reassociated as kp_fused_reassoc: one dispatch's
   same-layout candidate. */
void kp_matmul_reassoc(const float *a, const float *b, float *c, int32_t n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k = 0; k < n; k++) s[k & 3] += a[i * n + k] * b[k * n + j];
            c[i * n + j] = (s[0] + s[2]) + (s[1] + s[3]);
        }
}
