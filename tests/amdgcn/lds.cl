#include "common.h"

// Static LDS: reverse each block of 256 elements through shared memory.
__kernel void lds_reverse(__global float *x, int n) {
  __local float tile[256];
  int l = LID(), i = GID();
  tile[l] = i < n ? x[i] : 0.0f;
  BARRIER();
  if (i < n) x[i] = tile[255 - l];
}

// Dynamic LDS: the group segment size comes from the launch (a __local pointer argument).
__kernel void block_sum(__global const float *x, __global float *out, __local float *part,
                        int n) {
  int l = LID(), i = GID();
  part[l] = i < n ? x[i] : 0.0f;
  BARRIER();
  for (int s = 128; s > 0; s >>= 1) {
    if (l < s) part[l] += part[l + s];
    BARRIER();
  }
  if (l == 0) out[__builtin_amdgcn_workgroup_id_x()] = part[0];
}
