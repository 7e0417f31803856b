/* Opt kernels that cheat, with kp_matmul's ABI (C[n x n] = A * B, float32, row-major), for
   the adversarial suite (tests/test_trust.py). One build per KP_CHEAT; each must be rejected
   by the harness, with the right reason:
     1 NOWRITE   returns at once: the output keeps whatever the buffer held
     2 CONST     writes 0.0f everywhere
     3 STALE     computes once, caches the answer in a static buffer, returns it ever after
     4 OOB       correct, and writes one float past the end of C
     5 INPUT     correct, and scribbles on A
     6 HARDCODE  copies the captured answer (KP_ANSWER: a generated header) whatever the input
     7 NONDET    correct on odd calls; flips the last bit of C[0] on even calls
     8 LOWPREC   multiplies bf16-truncated inputs (round toward zero: a one-sided error)
     9 DEFERRED  hands the work to a detached thread and returns (the timer sees nothing)
    10 LAZY      correct for its first 10 calls, then does nothing (cheats once it is timed)
    12 COUNT     counts its calls; correct on its first 16 and on the call numbers a fixed
                 schedule would check (powers of two, every 64th), computes only a quarter of
                 the rows otherwise (the attack that beat kpair's old fixed check schedule)
    13 MEMO      keeps its last answer keyed on 64 sampled input elements and returns it
                 (a memcpy) whenever the key matches
    14 HASHMEMO  ref's loop behind up to 8 answers keyed on a hash of every input byte:
                 always right, and a memcpy on any input it has seen before (it must gain
                 nothing: no timed input repeats)
    15 DELTAMEMO ref's loop for the outputs that the elements changed since its last call
                 can reach, its last answer for the others: always right, and nearly free
                 on an input that differs from the last one in a few elements (it must gain
                 nothing: a fresh input changes every row)
    16 WINDOWS   counts its calls; computes a quarter of the rows on calls KP_FROM to
                 KP_FROM + 4 only (set to opt's timing-window launches, 4 + D to 8 + D with D
                 differential runs: launches kpair once left unjudged)
    17 SNOOP     at load (its constructor, where read-only opens are allowed) reads the
                 command line and environment of every process above its own, looking for
                 KP_SECRET (the run's --seed, a build-time define); ikj (bit-identical) if
                 it is nowhere, zeros if it found it (a candidate that knows the seed knows
                 the fresh inputs, poison and canaries). It says what it read on stdout.
    18 TIMEDSCALE ikj on its first KP_FROM - 1 calls and on the captured input (its first
                 call's); from call KP_FROM on (opt's first timing-window launch), the exact
                 result times (1 + 2^-10) on any other input: exact on every check run,
                 scaled on fresh timed inputs, where cosine cannot see it
    19 MEMOB     takes B for a constant weight (the region the declared mutations leave
                 out, in that test): rounds it to bf16 (to nearest: no one-sided error, and
                 cosine >= 0.9999 holds) at its first call and multiplies by that copy ever
                 after, whatever B holds
   and two honest ones, which must pass:
     0 HONEST_SPLIT  sums k in two halves: differs from the naive order in the last bits
                     (a tolerance pair)
    11 SCALE         (cheat) the exact result times 1.0001: a systematic error cosine misses
   kp_nothing is a kernel that changes nothing (no-op dispatch). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef KP_CHEAT
#define KP_CHEAT 0
#endif

static void ikj(const float *a, const float *b, float *c, int n) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++) {
            float aik = a[i * n + k];
            for (int j = 0; j < n; j++) c[i * n + j] += aik * b[k * n + j];
        }
    }
}

static float bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

#if KP_CHEAT == 6
#include KP_ANSWER /* static const uint32_t kp_answer[] = {...}; */
#endif

#if KP_CHEAT == 17
#include <stdio.h>

static int kp_found = -1;

/* Whether KP_SECRET is in /proc/PID/<what> (1), not in it (0), or it cannot be read (-1). */
static int holds_secret(long pid, const char *what) {
    char path[64], buf[1 << 16];
    snprintf(path, sizeof path, "/proc/%ld/%s", pid, what);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (!buf[i]) buf[i] = ' ';
    buf[n] = 0;
    return strstr(buf, KP_SECRET) != NULL;
}

static long parent_in(const char *path) {
    char buf[512];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    long ppid = 0;
    if (!p || sscanf(p + 1, " %*c %ld", &ppid) != 1) return 0;
    return ppid;
}

static long parent_of(long pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    return parent_in(path);
}

static long parent_of_self(void) { return parent_in("/proc/self/stat"); }

__attribute__((constructor)) static void snoop(void) {
    int read = 0;
    kp_found = 0;
    /* from /proc/self/stat: the sandbox refuses getppid() */
    for (long pid = parent_of_self(); pid > 1; pid = parent_of(pid)) {
        for (int w = 0; w < 2; w++) {
            int r = holds_secret(pid, w ? "environ" : "cmdline");
            read += r >= 0;
            if (r > 0) kp_found = 1;
        }
    }
    printf("kp-snoop: %d files read, secret %s\n", read, kp_found ? "FOUND" : "absent");
    fflush(stdout);
}
#endif

#if KP_CHEAT == 9
struct job { const float *a, *b; float *c; int n; };

static void *work(void *p) {
    struct job *j = p;
    int n = j->n;
    /* the naive order (bit-identical to the ref), 16 times over: plenty of hidden work */
    for (int rep = 0; rep < 16; rep++)
        for (int i = 0; i < n; i++)
            for (int jj = 0; jj < n; jj++) {
                volatile float s = 0.0f;
                for (int k = 0; k < n; k++) s += j->a[i * n + k] * j->b[k * n + jj];
                j->c[i * n + jj] = s;
            }
    free(j);
    return NULL;
}
#endif

void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
    size_t bytes = (size_t)n * n * sizeof(float);
#if KP_CHEAT == 0
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float lo = 0.0f, hi = 0.0f;
            for (int k = 0; k < n / 2; k++) lo += a[i * n + k] * b[k * n + j];
            for (int k = n / 2; k < n; k++) hi += a[i * n + k] * b[k * n + j];
            c[i * n + j] = lo + hi;
        }
#elif KP_CHEAT == 1
    (void)a, (void)b, (void)c, (void)bytes;
#elif KP_CHEAT == 2
    (void)a, (void)b;
    memset(c, 0, bytes);
#elif KP_CHEAT == 3
    static float *cache;
    if (!cache) {
        ikj(a, b, c, n);
        cache = malloc(bytes);
        memcpy(cache, c, bytes);
    } else {
        memcpy(c, cache, bytes);
    }
#elif KP_CHEAT == 4
    (void)bytes;
    ikj(a, b, c, n);
    c[n * n] = 1.0f;
#elif KP_CHEAT == 5
    (void)bytes;
    ikj(a, b, c, n);
    ((float *)a)[7] += 1.0f;
#elif KP_CHEAT == 6
    (void)a, (void)b;
    memcpy(c, kp_answer, bytes);
#elif KP_CHEAT == 7
    static unsigned calls;
    (void)bytes;
    ikj(a, b, c, n);
    if (++calls % 2 == 0) {
        uint32_t u;
        memcpy(&u, &c[0], 4);
        u ^= 1u;
        memcpy(&c[0], &u, 4);
    }
#elif KP_CHEAT == 8
    (void)bytes;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++) {
            float aik = bf16(a[i * n + k]);
            for (int j = 0; j < n; j++) c[i * n + j] += aik * bf16(b[k * n + j]);
        }
    }
#elif KP_CHEAT == 9
    (void)bytes;
    struct job *j = malloc(sizeof *j);
    j->a = a, j->b = b, j->c = c, j->n = n;
    pthread_t t;
    pthread_create(&t, NULL, work, j);
    pthread_detach(t);
#elif KP_CHEAT == 10
    static unsigned calls;
    (void)bytes;
    if (++calls <= 10) ikj(a, b, c, n);
#elif KP_CHEAT == 12
    static unsigned calls;
    (void)bytes;
    unsigned m = ++calls;
    int rows = (m <= 16 || (m & (m - 1)) == 0 || m % 64 == 0) ? n : n / 4;
    for (int i = 0; i < rows; i++) {  /* ikj over the first rows only */
        for (int j = 0; j < n; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++)
            for (int j = 0; j < n; j++) c[i * n + j] += a[i * n + k] * b[k * n + j];
    }
#elif KP_CHEAT == 16
    static unsigned calls;
    (void)bytes;
    unsigned m = ++calls;
    int rows = (m >= KP_FROM && m < KP_FROM + 5) ? n / 4 : n;
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < n; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++)
            for (int j = 0; j < n; j++) c[i * n + j] += a[i * n + k] * b[k * n + j];
    }
#elif KP_CHEAT == 13
    static float key[128], *memo;
    static int valid;
    float now[128];
    for (int s = 0; s < 64; s++) {
        now[s] = a[(size_t)s * 7919 % ((size_t)n * n)];
        now[64 + s] = b[(size_t)s * 104729 % ((size_t)n * n)];
    }
    if (valid && memcmp(now, key, sizeof now) == 0) {
        memcpy(c, memo, bytes);
        return;
    }
    ikj(a, b, c, n);
    if (!memo) memo = malloc(bytes);
    memcpy(memo, c, bytes);
    memcpy(key, now, sizeof now);
    valid = 1;
#elif KP_CHEAT == 14
    /* ref's own loop (bit-identical), behind a memo keyed on a hash of every input byte
       (O(n^2), against the product's O(n^3)): never wrong, and fast on any input it has seen */
    enum { SLOTS = 8 };
    static uint64_t keys[SLOTS];
    static float *answers[SLOTS];
    static int used, next;
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p[2] = {(const unsigned char *)a, (const unsigned char *)b};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < bytes; i++) h = (h ^ p[t][i]) * 1099511628211ull;
    for (int s = 0; s < used; s++)
        if (keys[s] == h) {
            memcpy(c, answers[s], bytes);
            return;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) acc += a[i * n + k] * b[k * n + j];
            c[i * n + j] = acc;
        }
    int s = used < SLOTS ? used++ : next++ % SLOTS;
    if (!answers[s]) answers[s] = malloc(bytes);
    memcpy(answers[s], c, bytes);
    keys[s] = h;
#elif KP_CHEAT == 15
    /* ref's own loop (bit-identical) for the outputs a change can reach, its last answer for
       the rest: C[i][j] is redone when row i of A or column j of B differs from the last
       call's. O(n^2) to find the changes, against the product's O(n^3): a large gain
       whenever a fresh input changes a few elements only, none when every row changes */
    static float *last_a, *last_b, *last_c;
    static int last_n;
    if (last_n != n) {
        free(last_a), free(last_b), free(last_c);
        last_a = malloc(bytes), last_b = malloc(bytes), last_c = malloc(bytes);
        last_n = n;
        memset(last_a, 0xFF, bytes);  /* NaN bits: nothing matches the first call */
        memset(last_b, 0xFF, bytes);
    }
    char *row = calloc((size_t)n, 1), *col = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) row[i] = memcmp(a + i * n, last_a + i * n, n * sizeof(float)) != 0;
    for (int k = 0; k < n; k++)
        for (int j = 0; j < n; j++) col[j] |= memcmp(b + k * n + j, last_b + k * n + j, 4) != 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (!row[i] && !col[j]) {
                c[i * n + j] = last_c[i * n + j];
                continue;
            }
            float acc = 0.0f;
            for (int k = 0; k < n; k++) acc += a[i * n + k] * b[k * n + j];
            c[i * n + j] = acc;
        }
    memcpy(last_a, a, bytes), memcpy(last_b, b, bytes), memcpy(last_c, c, bytes);
    free(row), free(col);
#elif KP_CHEAT == 17
    (void)bytes;
    if (kp_found) memset(c, 0, bytes);
    else ikj(a, b, c, n);
#elif KP_CHEAT == 18
    static unsigned calls;
    static float *first_a, *first_b;
    if (!first_a) {
        first_a = malloc(bytes), first_b = malloc(bytes);
        memcpy(first_a, a, bytes), memcpy(first_b, b, bytes);
    }
    ikj(a, b, c, n);
    if (++calls >= KP_FROM && (memcmp(a, first_a, bytes) || memcmp(b, first_b, bytes)))
        for (int i = 0; i < n * n; i++) c[i] *= 1.0f + 1.0f / 1024.0f;
#elif KP_CHEAT == 19
    static float *low;
    if (!low) {
        low = malloc(bytes);
        for (int i = 0; i < n * n; i++) {   /* bf16, round to nearest even */
            uint32_t u;
            memcpy(&u, &b[i], 4);
            u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
            memcpy(&low[i], &u, 4);
        }
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) c[i * n + j] = 0.0f;
        for (int k = 0; k < n; k++) {
            float aik = a[i * n + k];
            for (int j = 0; j < n; j++) c[i * n + j] += aik * low[k * n + j];
        }
    }
#elif KP_CHEAT == 11
    (void)bytes;
    ikj(a, b, c, n);
    for (int i = 0; i < n * n; i++) c[i] *= 1.0001f;
#endif
}

void kp_nothing(int32_t *x, int32_t n) {
    (void)x, (void)n;
}
