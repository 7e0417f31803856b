/* Where mask[i] is set, out[i] becomes 0 unless it held a huge number (|x| > 1e6, as an
 * overflow guard would keep it); elsewhere out[i] is read and updated. No value of the
 * captured input, no quiet NaN and no fill of 0.9 is huge, so to two discovery fills the
 * masked elements look write-only; about four arbitrary 32-bit poison words in ten are huge,
 * and under them ref itself changes its answer. */
void kp_huge_keep(const unsigned char *mask, const float *g, float *out, int n) {
    for (int i = 0; i < n; i++) {
        float x = out[i];
        out[i] = mask[i] ? (x > 1e6f || x < -1e6f ? x : 0.0f) : x + g[i];
    }
}
