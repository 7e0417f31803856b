/* Where mask[i] is set, out[i] becomes 0 whatever number it held, but a NaN it keeps (as
 * float arithmetic such as out * 0 would): for every finite value those elements look
 * write-only, and they are not. Elsewhere out[i] is read and updated. */
void kp_nan_keep(const unsigned char *mask, const float *g, float *out, int n) {
    for (int i = 0; i < n; i++)
        out[i] = mask[i] ? (out[i] != out[i] ? out[i] : 0.0f) : out[i] + g[i];
}
