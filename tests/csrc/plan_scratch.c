/* Fused candidates of the range matmul + bias + ReLU (tests/csrc/range_ops.c) that use a
   scratch row of their own, named "acc" (not the "row" of range_ops.c's kp_fused), to test
   how a judging session places and poisons a candidate plan's scratch
   (tests/test_pipeline_plan_scratch.py). Each computes the range's result bit for bit:
   every element summed over k ascending from 0.0f, then + bias, then max with 0. */
#include <stdint.h>

static void fused_row(const float *a, const float *b, const float *bias, float *out,
                      float *acc, int n, int i) {
    for (int j = 0; j < n; j++) acc[j] = 0.0f;
    for (int k = 0; k < n; k++) {
        float aik = a[i * n + k];
        for (int j = 0; j < n; j++) acc[j] += aik * b[k * n + j];
    }
    for (int j = 0; j < n; j++) {
        float v = acc[j] + bias[j];
        out[i * n + j] = v > 0.0f ? v : 0.0f;
    }
}

/* Honest: its scratch row is written before it is read. */
void kp_acc(int32_t n, const float *bias, const float *a, const float *b, float *out,
            float *acc) {
    for (int i = 0; i < n; i++) fused_row(a, b, bias, out, acc, n, i);
}

/* Leans on its scratch holding zeros when it starts (it leaves zeros behind): right on
   fresh, unpoisoned memory, wrong where the scratch is poisoned before each launch. */
void kp_acc_dirty(int32_t n, const float *bias, const float *a, const float *b, float *out,
                  float *acc) {
    float was = acc[0];
    for (int i = 0; i < n; i++) fused_row(a, b, bias, out, acc, n, i);
    for (int j = 0; j < n; j++) acc[j] = 0.0f;
    if (was != 0.0f) out[0] += 1.0f;
}

/* Right answer, but writes one float just before its scratch row: into the guard band. */
void kp_acc_under(int32_t n, const float *bias, const float *a, const float *b, float *out,
                  float *acc) {
    for (int i = 0; i < n; i++) fused_row(a, b, bias, out, acc, n, i);
    acc[-1] = 1.0f;
}

/* No scratch of its own: every element summed straight into out, in the same order. */
void kp_direct(int32_t n, const float *bias, const float *a, const float *b, float *out) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) out[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++) {
            float aik = a[i * n + k];
            for (int j = 0; j < n; j++) out[i * n + j] += aik * b[k * n + j];
        }
        for (int j = 0; j < n; j++) {
            float v = out[i * n + j] + bias[j];
            out[i * n + j] = v > 0.0f ? v : 0.0f;
        }
    }
}

/* Right answer, declares no scratch, and writes into the first scratch buffer a judging
   session placed for another candidate: hostile, it read kpair's source (kpair.replay
   places plan scratch after the captured span, 4096 bytes apart, aligned to 256 by default)
   and the range's layout (its four regions, all of which it is passed), so it knows where. */
void kp_direct_stray(int32_t n, const float *bias, const float *a, const float *b,
                     float *out) {
    kp_direct(n, bias, a, b, out);
    uintptr_t hi = (uintptr_t)(bias + n);
    const float *ends[3] = {a + n * n, b + n * n, out + n * n};
    for (int i = 0; i < 3; i++)
        if ((uintptr_t)ends[i] > hi) hi = (uintptr_t)ends[i];
    float *acc = (float *)((hi + 4096 + 255) & ~(uintptr_t)255);
    acc[1] = 1.0f;
}
