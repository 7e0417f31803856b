#include "common.h"

// 96 independent accumulators, fully unrolled: many VGPRs live at once.
#define N 96
__kernel void many_vgprs(__global const float *x, __global float *out, int n) {
  int i = GID();
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = x[(i + k) % n];
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = acc[k] * acc[(k + 1) % N] + 0.5f;
  }
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) s += acc[k];
  if (i < n) out[i] = s;
}
