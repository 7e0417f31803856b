/* An in-place masked fill (as torch's masked_fill_ or Inductor's in_out_ptr kernels): where
 * mask[i] is set out[i] becomes g[i] (write-only there), elsewhere it keeps what it held. On a
 * mutated mask some write-only elements are kept instead, poison and all, by ref as by opt. */
void kp_masked_fill(const unsigned char *mask, const float *g, float *out, int n) {
    for (int i = 0; i < n; i++)
        out[i] = mask[i] ? g[i] : out[i];
}
