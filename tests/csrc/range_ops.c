/* A range of three host "kernels" (matmul, bias, ReLU) and candidates that fuse them into
   one function with a signature of its own (tests/test_range.py).
   out = relu(a @ b + bias), float32, n x n row-major, bias of n (one per column).
   kp_fused computes every element with the same additions in the same order as the range
   (k ascending from 0.0f, then + bias, then max with 0), so its result is bit-identical;
   it walks b row by row (i-k-j) through a scratch row, where kp_matmul walks b's columns. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

void kp_bias(float *c, const float *bias, int32_t n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) c[i * n + j] += bias[j];
}

void kp_relu(float *c, int32_t n) {
    for (int i = 0; i < n * n; i++) c[i] = c[i] > 0.0f ? c[i] : 0.0f;
}

static void fused_row(const float *a, const float *b, const float *bias, float *out,
                      float *row, int n, int i) {
    for (int j = 0; j < n; j++) row[j] = 0.0f;
    for (int k = 0; k < n; k++) {
        float aik = a[i * n + k];
        for (int j = 0; j < n; j++) row[j] += aik * b[k * n + j];
    }
    for (int j = 0; j < n; j++) {
        float v = row[j] + bias[j];
        out[i * n + j] = v > 0.0f ? v : 0.0f;
    }
}

/* The honest candidate: its own parameter order, a scratch row of n floats. */
void kp_fused(int32_t n, const float *bias, const float *a, const float *b, float *out,
              float *row) {
    for (int i = 0; i < n; i++) fused_row(a, b, bias, out, row, n, i);
}

/* Honest, with a library-style workspace: ws must hold zeros (a semaphore per row, set and
   cleared again), as cuBLAS keeps its split-K workspace between calls. */
void kp_fused_ws(int32_t n, const float *bias, const float *a, const float *b, float *out,
                 float *row, int32_t *ws) {
    for (int i = 0; i < n; i++) {
        if (ws[i % 64] != 0) continue;   /* a dirty workspace: the row is not computed */
        ws[i % 64] = 1;
        fused_row(a, b, bias, out, row, n, i);
        ws[i % 64] = 0;
    }
}

/* A library-style workspace written on every call: the row sums of a (the same bytes for
   the same a, so a second call over the same arrays leaves it as it was), then the work. */
static void row_sums(const float *a, float *ws, int32_t n) {
    for (int i = 0; i < n; i++) {
        float s = 0.0f;
        for (int k = 0; k < n; k++) s += a[i * n + k];
        ws[i] = s;
    }
}

void kp_matmul_ws(const float *a, const float *b, float *c, float *ws, int32_t n) {
    row_sums(a, ws, n);
    kp_matmul(a, b, c, n);
}

void kp_fused_wsp(int32_t n, const float *bias, const float *a, const float *b, float *out,
                  float *row, float *ws) {
    row_sums(a, ws, n);
    kp_fused(n, bias, a, b, out, row);
}

/* The same, leaving its own bytes in the workspace: not what ref leaves there. */
void kp_fused_wsx(int32_t n, const float *bias, const float *a, const float *b, float *out,
                  float *row, float *ws) {
    row_sums(a, ws, n);
    ws[0] += 1.0f;
    kp_fused(n, bias, a, b, out, row);
}

/* Cheat: skips the work (the output is left as it was). */
void kp_fused_skip(int32_t n, const float *bias, const float *a, const float *b, float *out,
                   float *row) {
    (void)n; (void)bias; (void)a; (void)b; (void)out; (void)row;
}

/* Cheat: computes the first answer once, then replays it from a static copy. */
static float memo[256 * 256];
static int memo_ready;
void kp_fused_memo(int32_t n, const float *bias, const float *a, const float *b, float *out,
                   float *row) {
    size_t bytes = (size_t)n * n * sizeof(float);
    if (n > 256) return;
    if (!memo_ready) {
        for (int i = 0; i < n; i++) fused_row(a, b, bias, out, row, n, i);
        memcpy(memo, out, bytes);
        memo_ready = 1;
        return;
    }
    memcpy(out, memo, bytes);
}

/* Cheat: right answer, but uses the live-in matrix a as its scratch (clobbers an input). */
void kp_fused_clobber(int32_t n, const float *bias, float *a, const float *b, float *out,
                      float *row) {
    for (int i = 0; i < n; i++) fused_row(a, b, bias, out, row, n, i);
    a[0] = 0.0f;
}

/* Cheat: right answer, but reaches outside its arrays for a file first (the sandbox refuses). */
void kp_fused_open(int32_t n, const float *bias, const float *a, const float *b, float *out,
                   float *row) {
    FILE *f = fopen("/etc/hostname", "r");
    if (f) fclose(f);
    for (int i = 0; i < n; i++) fused_row(a, b, bias, out, row, n, i);
}
