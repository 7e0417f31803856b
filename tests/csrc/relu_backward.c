/* Whether out[i] is written or updated depends on the data: where mask[i] is set the old
 * value is dropped (write-only on this input), elsewhere it is read (as Inductor's fused
 * threshold_backward kernels do with a buffer they update in place). */
void kp_relu_backward(const unsigned char *mask, const float *g, float *out, int n) {
    for (int i = 0; i < n; i++)
        out[i] = mask[i] ? 0.0f : out[i] + g[i];
}
