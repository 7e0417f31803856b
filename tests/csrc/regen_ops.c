/* Setup and forward "kernels" for regenerable regions (tests/test_regen.py).
   kp_fill_seeded: a counter-based generator (splitmix64 of seed + index, like Philox a pure
   function of (seed, offset, index)): a[i] in [-1, 1). kp_fill: every element v.
   kp_axpby: out = alpha * x + y (an elementwise kernel over two inputs).
   kp_scale: a *= s in place. kp_rowdot: out[r] = sum over c of a[r, c] * b[r, c], the range
   under test. */
#include <stdint.h>

static uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kp_fill_seeded(float *a, int64_t n, uint64_t seed, int64_t offset) {
    for (int64_t i = 0; i < n; i++)
        a[i] = (float)(splitmix64(seed + (uint64_t)(offset + i)) >> 40) * (2.0f / 16777216.0f)
               - 1.0f;
}

void kp_fill(float *a, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) a[i] = v;
}

void kp_axpby(float *out, const float *x, const float *y, int64_t n, float alpha) {
    for (int64_t i = 0; i < n; i++) out[i] = alpha * x[i] + y[i];
}

void kp_scale(float *a, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) a[i] *= s;
}

void kp_rowdot(const float *a, const float *b, float *out, int32_t rows, int32_t cols) {
    for (int32_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int32_t c = 0; c < cols; c++)
            s += a[(int64_t)r * cols + c] * b[(int64_t)r * cols + c];
        out[r] = s;
    }
}
