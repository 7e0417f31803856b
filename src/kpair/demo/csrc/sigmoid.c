/* level1 "21_Sigmoid", the demo's deliberately WRONG optimization: y = 1 / (1 + exp(-x)).
   KP_OPT 0 (ref): one element at a time.
   KP_OPT 1 (opt): unrolled by 8 and forgets the remainder loop, so when n is not a multiple
                   of 8 the last n % 8 outputs are never written. Byte-exact judging catches it;
                   `kpair release add` refuses it and records the exclusion, as the seed's
                   release kept its 4 failing operators out. */
#include <math.h>
#include <stdint.h>

#ifndef KP_OPT
#define KP_OPT 0
#endif

void kp_sigmoid(const float *x, float *y, int64_t n) {
#if KP_OPT == 0
    for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
#else
    for (int64_t i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) y[i + l] = 1.0f / (1.0f + expf(-x[i + l]));
#endif
}
