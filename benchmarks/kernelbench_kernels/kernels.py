"""Hand-written Triton kernels that replace KernelBench Level 1 library kernels (cuBLAS gemm,
ATen elementwise, softmax and reduction kernels) through a launch plan
(``benchmarks/kernelbench_plans.py``). Each has its own signature: pointers, sizes and strides
as plain parameters, tile sizes as constexprs; fp32 accumulation, masks on every edge.

Loaded by file path on the GPU machine (Triton reads a function's source back from its file);
the CPU tests only parse this file (no Triton needed there).
"""

import triton
import triton.language as tl


@triton.jit
def kb_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] = A[M, K] @ B[K, N] for any strides (a transposed operand is a stride swap);
    fp32 products and sums (input_precision ieee: no TF32)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def kb_gemv(a_ptr, x_ptr, y_ptr, M, K, stride_am, stride_ak, stride_x, stride_y,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[M] = A[M, K] @ x[K]: BLOCK_M rows a program, fp32 partial sums over K."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + cols
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        x = tl.load(x_ptr + ks * stride_x, mask=ks < K, other=0.0)
        acc += a * x[None, :]
    tl.store(y_ptr + rows * stride_y, tl.sum(acc, axis=1), mask=rows < M)


@triton.jit
def kb_relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


@triton.jit
def kb_leaky_relu(x_ptr, y_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.where(x >= 0.0, x, x * slope), mask=mask)


@triton.jit
def kb_scale(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, x * s, mask=mask)


@triton.jit
def kb_sigmoid(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, 1.0 / (1.0 + tl.exp(-x)), mask=mask)


@triton.jit
def kb_swish(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, x / (1.0 + tl.exp(-x)), mask=mask)


@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exp overflows to inf for large x (-> 1), 0 for very
    # negative x (-> -1); no libdevice needed.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def kb_tanh(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, _tanh(x), mask=mask)


@triton.jit
def kb_gelu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """Exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (torch's default, approximate='none')."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476)), mask=mask)


@triton.jit
def kb_new_gelu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """minGPT's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in one pass (eager
    runs it as eight ATen kernels)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + _tanh(inner)), mask=mask)


@triton.jit
def kb_softmax_partial(x_ptr, part_ptr, D, stride_x, CHUNK, BLOCK: tl.constexpr):
    """Softmax, first launch: program (row, chunk) writes its chunk's maximum and the sum
    of exp(x - that maximum) to part[row, chunk, 0:2]."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    x_row = x_ptr + row * stride_x
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for c0 in range(0, CHUNK, BLOCK):
        idx = start + c0 + cols
        x = tl.load(x_row + idx, mask=(c0 + cols < CHUNK) & (idx < D), other=float("-inf"))
        m = tl.maximum(m, x)
    chunk_max = tl.max(m, axis=0)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, CHUNK, BLOCK):
        idx = start + c0 + cols
        mask = (c0 + cols < CHUNK) & (idx < D)
        x = tl.load(x_row + idx, mask=mask, other=0.0)
        s += tl.where(mask, tl.exp(x - chunk_max), 0.0)
    out = part_ptr + (row * tl.num_programs(1) + chunk) * 2
    tl.store(out, chunk_max)
    tl.store(out + 1, tl.sum(s, axis=0))


@triton.jit
def kb_softmax_finish(x_ptr, part_ptr, y_ptr, D, stride_x, stride_y, CHUNK, NCHUNKS,
                      BLOCK: tl.constexpr, CBLOCK: tl.constexpr, LOG: tl.constexpr):
    """Softmax (LOG=0) or log-softmax (LOG=1), second launch: program (row, chunk) combines
    the row's NCHUNKS partials (the row's maximum, the sum of exp(x - maximum)) and writes its
    chunk of the output."""
    row = tl.program_id(0)
    start = tl.program_id(1) * CHUNK
    c = tl.arange(0, CBLOCK)
    parts = part_ptr + (row * NCHUNKS + c) * 2
    maxima = tl.load(parts, mask=c < NCHUNKS, other=float("-inf"))
    sums = tl.load(parts + 1, mask=c < NCHUNKS, other=0.0)
    row_max = tl.max(maxima, axis=0)
    total = tl.sum(tl.where(c < NCHUNKS, sums * tl.exp(maxima - row_max), 0.0), axis=0)
    log_total = tl.log(total)
    cols = tl.arange(0, BLOCK)
    for c0 in range(0, CHUNK, BLOCK):
        idx = start + c0 + cols
        mask = (c0 + cols < CHUNK) & (idx < D)
        x = tl.load(x_ptr + row * stride_x + idx, mask=mask, other=0.0)
        if LOG:  # noqa: SIM108 - a static branch on a constexpr, kept as Triton reads it
            y = x - row_max - log_total
        else:
            y = tl.exp(x - row_max) / total
        tl.store(y_ptr + row * stride_y + idx, y, mask=mask)


@triton.jit
def kb_reduce_mid_partial(x_ptr, part_ptr, R, N, stride_xb, stride_xr, stride_xn, RCHUNK,
                          BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, OP: tl.constexpr):
    """A reduction over dimension 1 of x[b, r, n], first launch: program (b, column block,
    row chunk) reduces its RCHUNK rows into part[b, chunk, n]; OP 0 sum, 1 mean (summed here),
    2 max, 3 min. Loads along n coalesce."""
    b = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    chunk = tl.program_id(2)
    first = chunk * RCHUNK
    offs_r = tl.arange(0, BLOCK_R)
    n_mask = offs_n < N
    base = x_ptr + b * stride_xb + offs_n[None, :] * stride_xn
    if OP == 2:
        acc = tl.full([BLOCK_N], float("-inf"), tl.float32)
    elif OP == 3:
        acc = tl.full([BLOCK_N], float("inf"), tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for r0 in range(0, RCHUNK, BLOCK_R):
        rs = first + r0 + offs_r
        mask = ((r0 + offs_r < RCHUNK) & (rs < R))[:, None] & n_mask[None, :]
        if OP == 2:
            x = tl.load(base + rs[:, None] * stride_xr, mask=mask, other=float("-inf"))
            acc = tl.maximum(acc, tl.max(x, axis=0))
        elif OP == 3:
            x = tl.load(base + rs[:, None] * stride_xr, mask=mask, other=float("inf"))
            acc = tl.minimum(acc, tl.min(x, axis=0))
        else:
            x = tl.load(base + rs[:, None] * stride_xr, mask=mask, other=0.0)
            acc += tl.sum(x, axis=0)
    tl.store(part_ptr + (b * tl.num_programs(2) + chunk) * N + offs_n, acc, mask=n_mask)


@triton.jit
def kb_reduce_mid_finish(part_ptr, y_ptr, R, N, NCHUNKS, stride_yb, stride_yn,
                         BLOCK_N: tl.constexpr, OP: tl.constexpr):
    """Second launch: y[b, n] = the NCHUNKS partials of part[b, :, n] combined (a mean
    divided by R)."""
    b = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.load(part_ptr + b * NCHUNKS * N + offs_n, mask=n_mask, other=0.0)
    for c in range(1, NCHUNKS):
        x = tl.load(part_ptr + (b * NCHUNKS + c) * N + offs_n, mask=n_mask, other=0.0)
        if OP == 2:
            acc = tl.maximum(acc, x)
        elif OP == 3:
            acc = tl.minimum(acc, x)
        else:
            acc += x
    if OP == 1:
        acc = acc / R
    tl.store(y_ptr + b * stride_yb + offs_n * stride_yn, acc, mask=n_mask)
