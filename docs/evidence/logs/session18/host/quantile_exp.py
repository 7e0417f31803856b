import ctypes, time, os, sys, threading, numpy as np, subprocess, json
n = int(sys.argv[1]); rounds = int(sys.argv[2]); hogs = int(sys.argv[3])
libs = [ctypes.CDLL(f"./m{v}.so") for v in (0, 1)]
a = np.random.rand(n*n).astype(np.float32); b = np.random.rand(n*n).astype(np.float32); c = np.zeros(n*n, np.float32)
args = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)] + [ctypes.c_int32(n)]
tid = threading.get_native_id()
def sched():
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        x = f.read().split(); return int(x[2])
procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
out = []
try:
    for r in range(rounds):
        rec = {0: [], 1: []}
        for blk in range(40):
            for v in ((0, 1, 1, 0) if blk % 2 == 0 else (1, 0, 0, 1)):
                p0 = sched(); t0 = time.thread_time_ns(); libs[v].kp_matmul(*args); t1 = time.thread_time_ns(); p1 = sched()
                rec[v].append((t1 - t0, p1 - p0))
        out.append(rec)
        time.sleep(float(sys.argv[4]))
finally:
    for p in procs: p.kill()
for r, rec in enumerate(out):
    t = {v: np.array([x[0] for x in rec[v]]) for v in rec}; s = {v: np.array([x[1] for x in rec[v]]) for v in rec}
    med = np.median(t[0]) / np.median(t[1]); mn = np.min(t[0]) / np.min(t[1])
    clean = {v: t[v][s[v] == 0] for v in rec}
    cl = np.median(clean[0]) / np.median(clean[1]) if len(clean[0]) and len(clean[1]) else float('nan')
    q = np.percentile(t[0], 10) / np.percentile(t[1], 10)
    print(f"round {r}: median {med:.4f} min {mn:.4f} p10 {q:.4f} unpreempted {cl:.4f} (n {len(clean[0])},{len(clean[1])}) preempted frac {np.mean(s[0]>0):.2f},{np.mean(s[1]>0):.2f}")
