#include "common.h"

// A device function that is not inlined: the code object holds a non-kernel function too.
__attribute__((noinline)) static float poly(float v, int degree) {
  float r = 1.0f;
  for (int d = 0; d < degree; ++d) r = r * v + (float)d;
  return r;
}

__kernel void apply_poly(__global float *x, int degree, int n) {
  int i = GID();
  if (i < n) x[i] = poly(x[i], degree);
}
