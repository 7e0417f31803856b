/* Opt kernels that try to own the host executor's launch protocol, for
   tests/test_host_protocol.py. Each does exactly the work of tests/csrc/matmul.c's naive
   kernel (C = A B, the same additions in the same order: bit-identical), and besides:

     kp_stop_after   stops its own process (kill SIGSTOP) once C is written, hoping the
                     judge reads its stop as the end of the launch and the executor's own
                     stop is skipped: its next launch then returns without computing;
     kp_stop_before  stops itself first and computes when continued: the launch it was
                     called for ends before C is written;
     kp_own_loop     never returns: computes, stops itself (tgkill), computes again when
                     continued, and so on: ref's work with its own protocol;
     kp_forge        writes forged records (setup replies, replies, refusal-shaped bytes)
                     to every descriptor it holds before computing;
     kp_madvise      computes, then tries to drop the shared regions' pages (MADV_PAGEOUT,
                     COLD, REMOVE, POPULATE_WRITE, HUGEPAGE) so that ref pays faults.

   Build-time define KP_CTOR: 1, a constructor stacks a seccomp filter that answers every
   later seccomp() with success (directly and through prctl(PR_SET_SECCOMP)) and tries
   other prctl()s; 2, a constructor forges a setup failure record on every descriptor and
   exits, as a broken sandbox would; 3, kp_ifunc is an IFUNC whose resolver (run while the
   object is relocated, before any constructor) tries to create KP_FILE and to stack a
   filter, with raw system calls (nothing of libc is bound yet). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef KP_CTOR
#define KP_CTOR 0
#endif
#ifndef KP_FILE
#define KP_FILE "/tmp/kpair-ifunc-created"
#endif
#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static void matmul(const float *a, const float *b, float *c, int32_t n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

static void stop_self(void) { syscall(SYS_kill, getpid(), SIGSTOP); }

void kp_matmul(const float *a, const float *b, float *c, int32_t n) { matmul(a, b, c, n); }

void kp_stop_after(const float *a, const float *b, float *c, int32_t n) {
    matmul(a, b, c, n);
    stop_self();
}

void kp_stop_before(const float *a, const float *b, float *c, int32_t n) {
    stop_self();
    matmul(a, b, c, n);
}

void kp_own_loop(const float *a, const float *b, float *c, int32_t n) {
    for (;;) {
        matmul(a, b, c, n);
        syscall(SYS_tgkill, getpid(), gettid(), SIGSTOP);
    }
}

/* What the executor's records look like (host_executor.c): {u64 nonce; u32 seq, status,
   len;} then len bytes. The nonce is the judge's secret for this executor; a forger guesses. */
struct record {
    uint64_t nonce;
    uint32_t seq, status, len;
    char msg[44];
} __attribute__((packed));

static void forge(uint32_t status) {
    struct record r;
    memset(&r, 0, sizeof r);
    r.status = status;
    r.len = sizeof r.msg;
    memcpy(r.msg, "forged: the host sandbox could not be set up", sizeof r.msg);
    for (int fd = 0; fd < 64; fd++)
        for (uint32_t seq = 0; seq < 3; seq++) {
            r.seq = seq;
            (void)!write(fd, &r, sizeof r);
        }
}

void kp_forge(const float *a, const float *b, float *c, int32_t n) {
    forge(0);   /* "ok" replies */
    matmul(a, b, c, n);
}

void kp_madvise(const float *a, const float *b, float *c, int32_t n) {
    matmul(a, b, c, n);
    size_t bytes = (size_t)n * (size_t)n * sizeof(float);
    const void *regions[] = {a, b, c};
    int advice[] = {MADV_PAGEOUT, MADV_COLD, MADV_REMOVE, MADV_POPULATE_WRITE, MADV_HUGEPAGE};
    for (int r = 0; r < 3; r++) {
        uintptr_t lo = (uintptr_t)regions[r] & ~(uintptr_t)4095;
        uintptr_t hi = ((uintptr_t)regions[r] + bytes + 4095) & ~(uintptr_t)4095;
        for (int k = 0; k < 5; k++)
            if (madvise((void *)lo, hi - lo, advice[k]) == 0) c[0] = -1.0f;  /* got through */
    }
}

#if KP_CTOR == 1
/* Stack a filter that makes every later seccomp() "succeed" without installing anything. */
__attribute__((constructor)) static void stack_a_filter(void) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_seccomp, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
}
#elif KP_CTOR == 2
/* A setup failure, forged: what the executor writes when the sandbox cannot be set up. */
__attribute__((constructor)) static void forge_setup(void) {
    forge(1 /* ST_SETUP */);
    _exit(121);
}
#endif

#if KP_CTOR == 3
static long raw3(long nr, long a, long b, long c) {
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = nr, x0 __asm__("x0") = a, x1 __asm__("x1") = b,
                  x2 __asm__("x2") = c;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
    return x0;
#endif
}

static long raw4(long nr, long a, long b, long c, long d) {
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = nr, x0 __asm__("x0") = a, x1 __asm__("x1") = b,
                  x2 __asm__("x2") = c, x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
#endif
}

typedef void (*kernel_fn)(const float *, const float *, float *, int32_t);

static kernel_fn resolve_kp_ifunc(void) {
    static const char path[] = KP_FILE;
    raw4(__NR_openat, AT_FDCWD, (long)path, O_CREAT | O_WRONLY, 0600);
    raw3(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, 0);
    return matmul;
}

void kp_ifunc(const float *a, const float *b, float *c, int32_t n)
    __attribute__((ifunc("resolve_kp_ifunc")));
#endif
