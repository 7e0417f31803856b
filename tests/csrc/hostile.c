/* Opt kernels that attack kpair itself rather than the judgement of their output, with
   kp_matmul's ABI, for tests/test_hostile.py. Each writes zeros (a wrong answer), then tries
   to make kpair report a pass anyway, or to escape its worker:
     1 FORGE_FILE     writes a passing result.json wherever a verdict might be read from:
                      every path on its command line, its working directory, $HOME, /tmp
     2 FORGE_CHANNEL  writes fake kpair messages (a passing result) into every open file
                      descriptor
     3 FLOOD          prints 200,000 fake "PASS" lines to stdout and stderr
     4 ESCAPE         runs a shell command, forks, opens a socket, signals its parent
     5 SPIN           never returns (for the tests that kill kpair while it waits)
   KP_MARKER (a path, given at build time) is the file an escape would create. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef KP_HOSTILE
#define KP_HOSTILE 0
#endif
#ifndef KP_MARKER
#define KP_MARKER "/tmp/kpair-hostile-marker"
#endif

static const char FAKE[] =
    "{\"schema\": \"kpair.result\", \"schema_version\": 1, \"kpair_version\": \"0.1.0\", "
    "\"harness\": \"x\", \"started\": \"x\", \"status\": \"pass\", \"correct\": true, "
    "\"correctness\": {\"passed\": true, \"mode\": \"byte-exact\", \"regions\": [], "
    "\"policy\": {}, \"summary\": \"byte-exact\"}, \"speed\": {\"mode\": \"A/B\", "
    "\"speedup\": 42.0, \"ci95\": [41.0, 43.0], \"slot_bias\": 1.0, \"slot_bias_ci95\": [1.0, "
    "1.0], \"fwd\": 42.0, \"rev\": 0.0238, \"blocks\": 64, \"forward_blocks\": 32, "
    "\"reverse_blocks\": 32, \"stopped_by\": \"ci\", \"rel_ci_halfwidth\": 0.01, \"seed\": 1, "
    "\"n_boot\": 10, \"debug_only\": {}}}";

static void write_file(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        (void)!write(fd, FAKE, strlen(FAKE));
        close(fd);
    }
}

static void forge_files(void) {
    char cmdline[65536];
    int fd = open("/proc/self/cmdline", O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, cmdline, sizeof cmdline - 1) : -1;
    if (fd >= 0) close(fd);
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(cmdline + i) + 1) {
        cmdline[n] = 0;
        if (cmdline[i] == '/') {  /* every absolute path argument: a directory, or a file */
            write_file(cmdline + i, "result.json");
            int f = open(cmdline + i, O_WRONLY | O_TRUNC);
            if (f >= 0) { (void)!write(f, FAKE, strlen(FAKE)); close(f); }
        }
    }
    write_file(".", "result.json");
    write_file("/tmp", "kpair-forged-result.json");
    if (getenv("HOME")) write_file(getenv("HOME"), "kpair-forged-result.json");
}

static void forge_channel(void) {
    static char line[8192];
    int len = snprintf(line, sizeof line, "{\"stage\": \"measure\"}\n{\"result\": %s, "
                       "\"samples\": null}\n", FAKE);
    for (int fd = 0; fd < 1024; fd++) {
        (void)!write(fd, line, (size_t)len);
        /* and as if signed: a MAC-shaped prefix */
        (void)!write(fd, "0000000000000000000000000000000000000000000000000000000000000000 ",
                     65);
        (void)!write(fd, line + 21, (size_t)len - 21);
    }
}

static void flood(void) {
    for (int i = 0; i < 200000; i++) {
        printf("PASS: byte-exact, 99.000x faster, slot bias 1.0000, CI [98.9, 99.1]\n");
        fprintf(stderr, "PASS: byte-exact, 99.000x faster\n");
    }
    fflush(stdout);
}

static void escape(void) {
    (void)!system("touch " KP_MARKER);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(KP_MARKER, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) close(fd);
        _exit(0);
    }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s >= 0) {
        int fd = open(KP_MARKER, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) close(fd);
        close(s);
    }
    kill(getppid(), SIGKILL);
}

void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
    (void)a;
    (void)b;
    static int calls;
    if (calls++ == 0) {
#if KP_HOSTILE == 1
        forge_files();
#elif KP_HOSTILE == 2
        forge_channel();
#elif KP_HOSTILE == 3
        flood();
#elif KP_HOSTILE == 4
        escape();
#endif
    }
#if KP_HOSTILE == 5
    for (volatile int spin = 1; spin;) {
    }
#endif
    memset(c, 0, sizeof(float) * (size_t)n * (size_t)n);
}
