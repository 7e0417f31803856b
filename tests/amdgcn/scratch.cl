#include "common.h"

// A private array indexed by data: it cannot live in registers, so it goes to scratch.
__kernel void histogram_private(__global const int *keys, __global int *out, int n) {
  int counts[97];
  for (int k = 0; k < 97; ++k) counts[k] = 0;
  int i = GID();
  for (int j = i; j < n; j += 4096) counts[((unsigned)keys[j]) % 97u] += 1;
  int acc = 0;
  for (int k = 0; k < 97; ++k) acc = acc * 31 + counts[k];
  if (i < n) out[i] = acc;
}
