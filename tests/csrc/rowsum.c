/* Row sums of a CSR-like layout: out[i] = sum of x[rowptr[i] .. rowptr[i+1]). rowptr must be
   non-decreasing: on any other input the kernel faults (it aborts), as a real kernel that
   walks offsets might. Used to show that a derived mutation ref cannot take is dropped. */
#include <stdint.h>
#include <stdlib.h>

void kp_rowsum(const float *x, const int32_t *rowptr, float *out, int32_t rows) {
    for (int i = 0; i < rows; i++) {
        if (rowptr[i + 1] < rowptr[i]) abort();
        float s = 0.0f;
        for (int j = rowptr[i]; j < rowptr[i + 1]; j++) s += x[j];
        out[i] = s;
    }
}
