// kpair's check kernels: byte compare, fill check and keyed digest in one pass; batched
// fills; batched copies. Each takes a table of rows (grid y: one row of blocks per row).
// A held copy is kept masked: byte j xor byte j % 16 of Philox4x32-10 (Random123) of the
// counter (j / 16, 0) under the copy's own 64-bit key; a row's key 0 means a plain copy.
typedef unsigned long long u64;

__device__ __forceinline__ u64 kp_mix(u64 x) {  // splitmix64's finalizer
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27; x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The 16 mask bytes of chunk c under key, as four little-endian 32-bit words.
__device__ __forceinline__ void kp_philox(u64 c, u64 key, unsigned r[4]) {
  unsigned c0 = (unsigned)c, c1 = (unsigned)(c >> 32), c2 = 0, c3 = 0;
  unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);
#pragma unroll
  for (int i = 0; i < 10; i++) {
    unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  r[0] = c0; r[1] = c1; r[2] = c2; r[3] = c3;
}

// 16 bytes from p + base (zero past n), as four little-endian 32-bit words.
__device__ __forceinline__ void kp_load16(const unsigned char* p, u64 base, u64 n, unsigned w[4]) {
  if (base + 16 <= n && ((u64)(p + base) & 15) == 0) {
    uint4 v = *(const uint4*)(p + base);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    return;
  }
  for (int k = 0; k < 4; k++) {
    unsigned x = 0;
    for (int j = 0; j < 4; j++) {
      u64 i = base + 4 * k + j;
      if (i < n) x |= (unsigned)p[i] << (8 * j);
    }
    w[k] = x;
  }
}

// Row i = blockIdx.y of rows (a, b, word, n, key, mask) and out[3i .. 3i + 2]: over n bytes,
// in 16-byte chunks, out[3i] += bytes where a differs from b unmasked under mask (b null:
// from the 32-bit word repeated from a's first byte), out[3i + 1] = min(out[3i + 1], first
// such offset), out[3i + 2] += digest of b as stored (of a when b is null) keyed by key. out
// is zeroed / ~0 by the caller. One launch checks every row.
extern "C" __global__ void kp_diff(const u64* rows, u64* out) {
  const u64* row = rows + 6 * blockIdx.y;
  const unsigned char* a = (const unsigned char*)row[0];
  const unsigned char* b = (const unsigned char*)row[1];
  unsigned word = (unsigned)row[2];
  u64 n = row[3], key = row[4], mask = row[5];
  out += 3 * blockIdx.y;
  u64 count = 0, first = ~0ull, h = 0;
  u64 chunks = (n + 15) / 16;
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    u64 base = c * 16;
    unsigned x[4], y[4], m[4] = {0, 0, 0, 0};
    kp_load16(a, base, n, x);
    if (b) kp_load16(b, base, n, y);
    else y[0] = y[1] = y[2] = y[3] = word;
    if (mask) kp_philox(c, mask, m);
    for (int k = 0; k < 4; k++) {
      unsigned d = x[k] ^ y[k] ^ m[k];
      u64 at = base + 4 * k;
      if (at >= n) d = 0;
      else if (at + 4 > n) d &= (1u << (8 * (unsigned)(n - at))) - 1u;
      if (d) {
        count += ((d & 0xffu) != 0) + ((d & 0xff00u) != 0) + ((d & 0xff0000u) != 0) +
                 ((d >> 24) != 0);
        if (first == ~0ull) first = at + (__ffs(d) - 1) / 8;
      }
    }
    const unsigned* s = b ? y : x;
    h += kp_mix(((u64)s[1] << 32 | s[0]) ^ (key + 2 * c * 0x9e3779b97f4a7c15ull));
    h += kp_mix(((u64)s[3] << 32 | s[2]) ^ (key + (2 * c + 1) * 0x9e3779b97f4a7c15ull));
  }
  for (int off = 16; off; off >>= 1) {
    count += __shfl_down_sync(0xffffffffu, count, off);
    h += __shfl_down_sync(0xffffffffu, h, off);
  }
  if ((threadIdx.x & 31) == 0) {
    if (count) atomicAdd(&out[0], count);
    atomicAdd(&out[2], h);
  }
  if (first != ~0ull) atomicMin(&out[1], first);
}

// Row i = blockIdx.y of rows (dst, n): byte j of dst gets byte j % 4 of word (the 32-bit
// word repeated from dst, as cuMemsetD32 writes it from an aligned dst). One launch fills
// every row.
extern "C" __global__ void kp_fill(const u64* rows, unsigned word) {
  unsigned char* dst = (unsigned char*)rows[2 * blockIdx.y];
  u64 n = rows[2 * blockIdx.y + 1];
  u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
  u64 body = ((u64)dst & 15) == 0 ? n / 16 : 0;
  uint4 v = make_uint4(word, word, word, word);
  for (u64 i = tid; i < body; i += stride) ((uint4*)dst)[i] = v;
  for (u64 i = body * 16 + tid; i < n; i += stride)
    dst[i] = (unsigned char)(word >> (8 * (i & 3)));
}

// Row i = blockIdx.y of table (dst, src, n, mask): n bytes from src to dst, each xor its
// mask byte under mask (see above; the same call masks and unmasks, in place too). One
// launch copies every row.
extern "C" __global__ void kp_copy(const u64* table) {
  const u64* row = table + 4 * blockIdx.y;
  unsigned char* dst = (unsigned char*)row[0];
  const unsigned char* src = (const unsigned char*)row[1];
  u64 n = row[2], mask = row[3];
  u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
  bool aligned = (((u64)dst | (u64)src) & 15) == 0;
  if (mask) {
    for (u64 c = tid; c < (n + 15) / 16; c += stride) {
      unsigned m[4];
      kp_philox(c, mask, m);
      if (aligned && 16 * c + 16 <= n) {
        uint4 v = ((const uint4*)src)[c];
        ((uint4*)dst)[c] = make_uint4(v.x ^ m[0], v.y ^ m[1], v.z ^ m[2], v.w ^ m[3]);
      } else {
        for (u64 j = 16 * c; j < n && j < 16 * c + 16; j++)
          dst[j] = src[j] ^ (unsigned char)(m[(j >> 2) & 3] >> (8 * (j & 3)));
      }
    }
  } else if (aligned) {
    u64 body = n / 16;
    for (u64 i = tid; i < body; i += stride) ((uint4*)dst)[i] = ((const uint4*)src)[i];
    for (u64 i = body * 16 + tid; i < n; i += stride) dst[i] = src[i];
  } else {
    for (u64 i = tid; i < n; i += stride) dst[i] = src[i];
  }
}
