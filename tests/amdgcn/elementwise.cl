#include "common.h"

__kernel void axpy(__global float *x, __global const float *y, float a, int n) {
  int i = GID();
  if (i < n) x[i] = a * x[i] + y[i];
}

__kernel void scale_i64(__global long *x, long factor, short shift, int n) {
  int i = GID();
  if (i < n) x[i] = (x[i] * factor) >> shift;
}
