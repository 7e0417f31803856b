#include <stdint.h>
void kp_axpbyz(const float* x, const float* y, const float* w, float* z, float* v, int n) {
  for (int i = 0; i < n; i++) { z[i] = 1.5f * x[i] + y[i]; v[i] = x[i] * w[i]; }
}
