/* Kernels that update their only buffer in place (as PyTorch's relu_ and Inductor's
   in_out_ptr kernels do): the captured pre-state is their input, and no region is read-only.
     kp_inplace      x[i] = f(x[i]), f a few dozen float steps (ref)
     kp_inplace2     the same, two elements per iteration (honest, bit-identical)
     kp_inplace_memo keeps its last answer keyed on 16 sampled elements and copies it back
                     whenever the key matches (a cheat: stale on an input that differs
                     elsewhere)
     kp_relu         x[i] = max(x[i], 0): a negative element is dropped, a positive one kept */
#include <stdint.h>
#include <string.h>

static float f(float v) {
    for (int k = 0; k < 64; k++) v = v * 0.999f + 0.001f * (v * v - 0.5f);
    return v;
}

void kp_inplace(float *x, int32_t n) {
    for (int i = 0; i < n; i++) x[i] = f(x[i]);
}

void kp_inplace2(float *x, int32_t n) {
    int i = 0;
    for (; i + 1 < n; i += 2) {
        x[i] = f(x[i]);
        x[i + 1] = f(x[i + 1]);
    }
    for (; i < n; i++) x[i] = f(x[i]);
}

#define MEMO_MAX (1 << 16)
static float key[16], answer[MEMO_MAX];
static int have;

void kp_inplace_memo(float *x, int32_t n) {
    float k[16];
    for (int j = 0; j < 16; j++) k[j] = x[(int64_t)j * n / 16];
    if (have && n <= MEMO_MAX && memcmp(k, key, sizeof k) == 0) {
        memcpy(x, answer, (size_t)n * 4);
        return;
    }
    kp_inplace(x, n);
    if (n <= MEMO_MAX) {
        memcpy(key, k, sizeof k);
        memcpy(answer, x, (size_t)n * 4);
        have = 1;
    }
}

void kp_relu(float *x, int32_t n) {
    for (int i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
