/* Opt kernels that try to get out of the host sandbox, with kp_matmul's ABI, for
   tests/test_sandbox.py. Each exported kp_<attack> first tries its escape; if any attempt
   succeeds it writes zeros (a wrong answer the judge sees), else it computes C = A B as the
   naive ref does (bit-identical), so "the run passes" means "every attempt failed".

   Build-time defines: KP_PID (the judge's pid, as a test sees it), KP_DIR (a directory the
   test owns and watches), KP_FILE (a file in it), KP_CTOR (1: a constructor attacks at load
   time and poisons every kernel of the library if any of its attempts succeeded). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <link.h>
#include <linux/perf_event.h>
#include <mqueue.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/msg.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef KP_PID
#define KP_PID 1
#endif
#ifndef KP_DIR
#define KP_DIR "/tmp"
#endif
#ifndef KP_FILE
#define KP_FILE KP_DIR "/watched"
#endif
#ifndef KP_CTOR
#define KP_CTOR 0
#endif

static volatile int escaped;
void kp_matmul(const float *a, const float *b, float *c, int32_t n);

/* A call the sandbox must refuse: it returned >= 0, or failed for another reason than
   EPERM (it reached the kernel). */
static void refused(long ret) {
    if (ret >= 0 || errno != EPERM) escaped = 1;
}

static void matmul(const float *a, const float *b, float *c, int32_t n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = escaped ? 0.0f : s;
        }
}

#define KERNEL(name)                                                              \
    void kp_##name(const float *a, const float *b, float *c, int32_t n) {        \
        attack_##name();                                                          \
        matmul(a, b, c, n);                                                       \
    }

static void read_parent_file(const char *what) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/%s", KP_PID, what);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        if (strcmp(what, "mem") == 0) {  /* any readable byte of the judge is an escape */
            for (unsigned long at = 0x400000; at < (1ul << 47); at += 1ul << 30)
                if (pread(fd, buf, sizeof buf, (off_t)at) > 0) escaped = 1;
        } else if (read(fd, buf, sizeof buf) > 0) {
            escaped = 1;
        }
        close(fd);
    }
}

static void attack_parent_mem(void) {
    read_parent_file("mem");
    read_parent_file("environ");
    read_parent_file("maps");
}
KERNEL(parent_mem)

static void attack_ptrace(void) {
    char buf[64];
    struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    refused(ptrace(PTRACE_ATTACH, KP_PID, 0, 0));
    refused(ptrace(PTRACE_SEIZE, KP_PID, 0, 0));
    refused(process_vm_readv(KP_PID, &local, 1, &remote, 1, 0));
    refused(process_vm_writev(KP_PID, &local, 1, &remote, 1, 0));
}
KERNEL(ptrace)

static void attack_prlimit(void) {
    struct rlimit old, one = {1, 1};
    refused(prlimit(KP_PID, RLIMIT_CORE, NULL, &old));
    refused(prlimit(KP_PID, RLIMIT_NOFILE, &one, NULL));
    refused(prlimit(0, RLIMIT_NOFILE, NULL, &old)); /* even its own: not on the list */
}
KERNEL(prlimit)

static void attack_kill(void) {
    refused(kill(KP_PID, 0));
    refused(kill(0, 0));            /* its process group */
    refused(kill(-1, 0));           /* everything it may signal */
    refused(syscall(SYS_tgkill, KP_PID, KP_PID, 0));
    refused(syscall(SYS_tkill, KP_PID, 0));
#if KP_CTOR == 2
    kill(0, SIGKILL);               /* the real thing, for kpair run: its process group */
#endif
}
KERNEL(kill)

static void attack_processes(void) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    refused(pid);
#ifdef SYS_fork
    refused(syscall(SYS_fork));
#endif
    refused(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0));  /* a process, not a thread */
    refused(syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0));
    char *argv[] = {"/bin/true", NULL};
    refused(execve("/bin/true", argv, NULL));
}
KERNEL(processes)

static void attack_mount(void) {
    refused(syscall(SYS_fsopen, "tmpfs", 0));
    refused(syscall(SYS_fsmount, 3, 0, 0));
    refused(syscall(SYS_move_mount, 3, "", AT_FDCWD, KP_DIR, 4));
    refused(mount("none", KP_DIR, "tmpfs", 0, NULL));
    refused(mount("none", ".", "tmpfs", 0, NULL));
    refused(umount2(KP_DIR, MNT_DETACH));
}
KERNEL(mount)

static void attack_xattr(void) {
    refused(setxattr(KP_FILE, "user.kpair", "x", 1, 0));
    refused(lsetxattr(KP_FILE, "user.kpair", "x", 1, 0));
    refused(setxattr(KP_FILE, "trusted.kpair", "x", 1, 0));
    refused(fsetxattr(1, "user.kpair", "x", 1, 0));
}
KERNEL(xattr)

static void attack_ipc(void) {
    refused(shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600));
    refused(shmget(0x6b706169, 4096, IPC_CREAT | 0600));
    refused(msgget(0x6b706169, IPC_CREAT | 0600));
    refused(semget(0x6b706169, 1, IPC_CREAT | 0600));
    refused(mq_open("/kpair-attack", O_CREAT | O_RDWR, 0600, NULL));
    refused(shm_open("/kpair-attack", O_CREAT | O_RDWR, 0600));
    refused(syscall(SYS_memfd_create, "kpair-attack", 0));
}
KERNEL(ipc)

static void attack_files(void) {
    refused(open(KP_DIR "/created", O_CREAT | O_WRONLY, 0644));
    refused(open("created-in-cwd", O_CREAT | O_WRONLY, 0644));
    refused(open(KP_FILE, O_WRONLY | O_TRUNC));
    refused(open(KP_FILE, O_RDONLY)); /* no open at all once loaded */
    refused(creat(KP_DIR "/creat", 0644));
    refused(mkdir(KP_DIR "/dir", 0755));
    refused(symlink("/", KP_DIR "/link"));
    refused(rename(KP_FILE, KP_DIR "/renamed"));
    refused(unlink(KP_FILE));
    refused(truncate(KP_FILE, 0));
    refused(chmod(KP_FILE, 0777));
    /* its log (fd 1) is a pipe: writing there is allowed and creates nothing */
}
KERNEL(files)

static void attack_socket(void) {
    int sv[2];
    refused(socket(AF_INET, SOCK_STREAM, 0));
    refused(socket(AF_UNIX, SOCK_DGRAM, 0));
    refused(socket(AF_NETLINK, SOCK_RAW, 0));
    refused(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
}
KERNEL(socket)

static void attack_kernel_state(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    refused(syscall(SYS_reboot, 0, 0, 0, 0));                 /* bad magic */
    refused(unshare(CLONE_NEWUSER));
    refused(unshare(CLONE_NEWNS));
    refused(setns(0, 0));
    refused(clock_settime(CLOCK_REALTIME, &now));
    refused(syscall(SYS_bpf, 5 /* BPF_PROG_LOAD */, NULL, 0));
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.type = PERF_TYPE_SOFTWARE;
    attr.size = sizeof attr;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    refused(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
    refused(chroot(KP_DIR));
    refused(syscall(SYS_personality, 0x0040000 /* ADDR_NO_RANDOMIZE */));
    refused(syscall(SYS_ioctl, 1, 0x5412 /* TIOCSTI */, "x"));
    refused(syscall(SYS_prctl, PR_SET_DUMPABLE, 1, 0, 0, 0));
}
KERNEL(kernel_state)

static void attack_setuid(void) {
    refused(setuid(0));
    refused(setresuid(0, 0, 0));
    refused(setgid(0));
    refused(setgroups(0, NULL));
    refused(syscall(SYS_capset, NULL, NULL));
}
KERNEL(setuid)

/* "ref" shared the process before: find another loaded object exporting kp_matmul and
   patch its first instruction into a return. Now only its own process is there. */
static int patch_other(struct dl_phdr_info *info, size_t size, void *self) {
    (void)size;
    if (!info->dlpi_name || !info->dlpi_name[0]) return 0;
    void *h = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;
    void *fn = dlsym(h, "kp_matmul");
    if (fn && fn != self) {
        uintptr_t page = (uintptr_t)fn & ~(uintptr_t)4095;
        if (mprotect((void *)page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC) == 0) {
#if defined(__x86_64__)
            *(volatile unsigned char *)fn = 0xC3;            /* ret */
#elif defined(__aarch64__)
            *(volatile uint32_t *)fn = 0xD65F03C0u;          /* ret */
#endif
            escaped = 1;
        }
    }
    return 0;
}

static void attack_patch_ref(void) {
    dl_iterate_phdr(patch_other, (void *)kp_matmul);
    /* and its own code, which it may: that changes only this executor */
    uintptr_t page = (uintptr_t)&matmul & ~(uintptr_t)4095;
    mprotect((void *)page, 4096, PROT_READ | PROT_EXEC);
}
KERNEL(patch_ref)

/* Refused calls are reported by the executor's SIGSYS handler: replace it, ignore SIGSYS,
   then write a file, hoping the refusal goes unreported. */
static void quiet(int sig) { (void)sig; }

static void attack_hide_refusals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = quiet;
    refused(sigaction(SIGSYS, &sa, NULL));
    refused(signal(SIGSYS, SIG_IGN) == SIG_ERR ? -1 : 0);
    refused(open(KP_DIR "/hidden", O_CREAT | O_WRONLY, 0644));
}
KERNEL(hide_refusals)

/* system() blocks every signal, SIGSYS included, before it asks for a process: the refused
   call cannot be answered with EPERM, so the executor dies of SIGSYS (a crash, reported). */
static void attack_spawn(void) { (void)!system("touch " KP_DIR "/spawned"); }
KERNEL(spawn)

/* A thread left spinning after the call returns (a bounded spin, once per executor). */
static void *spin(void *arg) {
    (void)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
    return NULL;
}

static void attack_spin_thread(void) {
    static int started;
    if (!started) {
        pthread_t th;
        if (pthread_create(&th, NULL, spin, NULL) != 0) escaped = 1; /* threads must work */
        else pthread_detach(th);
        started = 1;
    }
}
KERNEL(spin_thread)

#if KP_CTOR == 1
/* At load time, under filter 1 (read-only opens allowed): the judge's memory, files, a
   process, a socket, a signal. */
__attribute__((constructor)) static void at_load(void) {
    attack_parent_mem();
    refused(open(KP_DIR "/from-constructor", O_CREAT | O_WRONLY, 0644));
    refused(open(KP_FILE, O_RDWR));
    attack_processes();
    attack_socket();
    attack_kill();
    attack_ipc();
    attack_mount();
}
#endif

/* The honest kernel of this library (constructor tests pair it). */
void kp_matmul(const float *a, const float *b, float *c, int32_t n) { matmul(a, b, c, n); }
