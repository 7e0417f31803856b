/* level1 "37_FrobeniusNorm_": out[0] = sqrt(sum of x[i]^2), one float32 scalar (as in the
   seed's release, whose Frobenius norm output was a single scalar judged with rtol 1e-6).
   KP_OPT 0 (ref): one serial double-precision sum: every add waits for the previous one.
   KP_OPT 1 (opt): blocked: 16 float32 lanes (vectorizable) sum blocks of 256 elements, each
                   block's lanes are added pairwise and folded into a double. Reassociated and
                   partly float32, so the scalar differs from ref in the last bits: judged
                   with a relative error bound rtol = 1e-6. */
#include <math.h>
#include <stdint.h>

#ifndef KP_OPT
#define KP_OPT 0
#endif

#define LANES 16
#define BLOCK 256

void kp_frobenius(const float *x, float *out, int64_t n) {
#if KP_OPT == 0
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    out[0] = (float)sqrt(s);
#else
    double total = 0.0;
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        float lane[LANES] = {0};
        for (int b = 0; b < BLOCK; b += LANES)
            for (int l = 0; l < LANES; l++) lane[l] += x[i + b + l] * x[i + b + l];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int l = 0; l < w; l++) lane[l] += lane[l + w];
        total += lane[0];
    }
    for (; i < n; i++) total += (double)x[i] * (double)x[i];
    out[0] = (float)sqrt(total);
#endif
}
