/* level1 "23_Softmax": row-wise softmax of a rows x cols float32 matrix.
   KP_OPT 0 (ref): three passes per row (max; sum of exp; exp again divided by the sum), so
                   expf runs twice per element, and one serial sum.
   KP_OPT 1 (opt): stores exp(x - max) in the output during the sum pass and scales it by the
                   reciprocal of the sum: expf once per element. The sum is split over 8
                   accumulators (reassociated) and x/s becomes x*(1/s), so the last bits differ
                   from ref: not byte-exact, judged by cosine similarity >= 0.9999. */
#include <math.h>
#include <stdint.h>

#ifndef KP_OPT
#define KP_OPT 0
#endif

void kp_softmax(const float *x, float *y, int32_t rows, int32_t cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * cols;
        float *yr = y + (int64_t)r * cols;
        float m = xr[0];
        for (int j = 1; j < cols; j++) m = xr[j] > m ? xr[j] : m;
#if KP_OPT == 0
        float s = 0.0f;
        for (int j = 0; j < cols; j++) s += expf(xr[j] - m);
        for (int j = 0; j < cols; j++) yr[j] = expf(xr[j] - m) / s;
#else
        float acc[8] = {0};
        int j = 0;
        for (; j + 8 <= cols; j += 8)
            for (int l = 0; l < 8; l++) {
                const float e = expf(xr[j + l] - m);
                yr[j + l] = e;
                acc[l] += e;
            }
        for (; j < cols; j++) {
            yr[j] = expf(xr[j] - m);
            acc[0] += yr[j];
        }
        const float inv = 1.0f / (((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                                  ((acc[4] + acc[5]) + (acc[6] + acc[7])));
        for (j = 0; j < cols; j++) yr[j] *= inv;
#endif
    }
}
