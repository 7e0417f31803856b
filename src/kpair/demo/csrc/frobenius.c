/* level1 "37_FrobeniusNorm_": out[0] = sqrt(sum of x[i]^2), one float32 scalar (as in the
   seed's release, whose Frobenius norm output was a single scalar judged with rtol 1e-6).
   KP_OPT 0 (ref): one serial double-precision sum: every add waits for the previous one.
   KP_OPT 1 (opt): pairwise in float32: halves are summed recursively down to blocks of 256
                   elements, which 16 independent (vectorizable) lanes sum. Reassociated and in
                   float32, so the scalar differs from ref in its last bits (error grows like
                   log2(n), not n): judged with a relative error bound rtol = 1e-6. */
#include <math.h>
#include <stdint.h>

#ifndef KP_OPT
#define KP_OPT 0
#endif

#define LANES 16
#define BLOCK 256

#if KP_OPT == 1
static float sum_squares(const float *x, int64_t n) {
    if (n > BLOCK) {
        int64_t half = (n / 2 + BLOCK - 1) / BLOCK * BLOCK; /* keep blocks whole */
        return sum_squares(x, half) + sum_squares(x + half, n - half);
    }
    float lane[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += x[i + l] * x[i + l];
    for (; i < n; i++) lane[0] += x[i] * x[i];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}
#endif

void kp_frobenius(const float *x, float *out, int64_t n) {
#if KP_OPT == 0
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    out[0] = (float)sqrt(s);
#else
    out[0] = (float)sqrt((double)sum_squares(x, n));
#endif
}
