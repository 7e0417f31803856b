"""A scripted kernel-editing agent (no language model) that drives ``kpair mcp`` end to end
through the MCP SDK's own client over stdio — the loop a real agent runs.

    python benchmarks/mcp_agent.py --backend host [--work DIR] [--json out.json]
    python benchmarks/mcp_agent.py --backend cuda [--work DIR] [--program PY ARGS...]

host: three host operators recorded here (a matmul, an in-place axpy, a copy), and C variants
of each (loop orders, unrolling; some wrong on purpose). cuda: the ``capture`` tool runs a
torch.compile'd program (default benchmarks/programs/tiny_compiled.py) and captures its most
expensive Triton kernels; each is described and gets PTX rewrites (cache hints on loads and
stores: ``ld.global`` -> ``.nc``/``.cs``/``.lu``/``.cg``, ``st.global.cs``; ptxas options:
default load cache, register caps) and Triton source variants (num_warps, block sizes).
Every candidate is submitted with ``submit_candidate`` (the quick, exploratory measurement);
the best quick pass of each operator is submitted again with ``full`` (the replicated,
controlled measurement) and the best confirmed one is published with ``publish``. Prints a
JSON summary: each candidate's verdict and seconds (client side), the median seconds per
candidate after setup (and its build, judge and per-stage parts), the full runs' seconds.
"""

# ruff: noqa: E501  (the C variants below are data: one loop a line reads best)
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- host operators

MATMUL = """#include <stdint.h>
void kp_matmul(const float *a, const float *b, float *c, int32_t n) {
%s
}
"""
MATMUL_BODIES = {
    "ijk (ref)": """    for (int i = 0; i < n; i++) for (int j = 0; j < n; j++) { float s = 0.0f;
        for (int k = 0; k < n; k++) s += a[i*n+k] * b[k*n+j]; c[i*n+j] = s; }""",
    "ikj": """    for (int i = 0; i < n; i++) { for (int j = 0; j < n; j++) c[i*n+j] = 0.0f;
        for (int k = 0; k < n; k++) { float x = a[i*n+k];
            for (int j = 0; j < n; j++) c[i*n+j] += x * b[k*n+j]; } }""",
    "ikj unroll4": """    for (int i = 0; i < n; i++) { for (int j = 0; j < n; j++) c[i*n+j] = 0.0f;
        for (int k = 0; k < n; k++) { float x = a[i*n+k]; int j = 0;
            for (; j + 4 <= n; j += 4) { c[i*n+j] += x*b[k*n+j]; c[i*n+j+1] += x*b[k*n+j+1];
                c[i*n+j+2] += x*b[k*n+j+2]; c[i*n+j+3] += x*b[k*n+j+3]; }
            for (; j < n; j++) c[i*n+j] += x * b[k*n+j]; } }""",
    "k split in two sums (reorders additions)": """    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) { float s0 = 0.0f, s1 = 0.0f; int k = 0;
            for (; k + 2 <= n; k += 2) { s0 += a[i*n+k]*b[k*n+j]; s1 += a[i*n+k+1]*b[(k+1)*n+j]; }
            for (; k < n; k++) s0 += a[i*n+k]*b[k*n+j]; c[i*n+j] = s0 + s1; }""",
    "ikj last column skipped (bug)": """    for (int i = 0; i < n; i++) { for (int j = 0; j < n - 1; j++) c[i*n+j] = 0.0f;
        for (int k = 0; k < n; k++) { float x = a[i*n+k];
            for (int j = 0; j < n - 1; j++) c[i*n+j] += x * b[k*n+j]; } }""",
    "writes nothing (cheat)": "    (void)a; (void)b; (void)c; (void)n;",
    "ikj restrict copy of row": """    for (int i = 0; i < n; i++) { float row[1024]; for (int j = 0; j < n; j++) row[j] = 0.0f;
        for (int k = 0; k < n; k++) { float x = a[i*n+k]; const float *bk = b + k*n;
            for (int j = 0; j < n; j++) row[j] += x * bk[j]; }
        for (int j = 0; j < n; j++) c[i*n+j] = row[j]; }""",
}
AXPY = """#include <stdint.h>
void kp_axpy(const float *x, float *y, float a, int32_t n) {
%s
}
"""
AXPY_BODIES = {
    "plain (ref)": "    for (int i = 0; i < n; i++) y[i] = a * x[i] + y[i];",
    "unroll2": """    int i = 0; for (; i + 2 <= n; i += 2) { y[i] = a*x[i] + y[i]; y[i+1] = a*x[i+1] + y[i+1]; }
    for (; i < n; i++) y[i] = a * x[i] + y[i];""",
    "unroll4": """    int i = 0; for (; i + 4 <= n; i += 4) { for (int k = 0; k < 4; k++) y[i+k] = a*x[i+k] + y[i+k]; }
    for (; i < n; i++) y[i] = a * x[i] + y[i];""",
    "unroll8": """    int i = 0; for (; i + 8 <= n; i += 8) { for (int k = 0; k < 8; k++) y[i+k] = a*x[i+k] + y[i+k]; }
    for (; i < n; i++) y[i] = a * x[i] + y[i];""",
    "reverse order": "    for (int i = n - 1; i >= 0; i--) y[i] = a * x[i] + y[i];",
    "fused multiply-add (other rounding)": """#pragma STDC FP_CONTRACT ON
    for (int i = 0; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]);""",
    "half the elements (bug)": "    for (int i = 0; i < n / 2; i++) y[i] = a * x[i] + y[i];",
    "two passes (scale, then add)": """    for (int i = 0; i < n; i++) { float t = a * x[i]; y[i] = t + y[i]; }""",
}
COPY = """#include <stdint.h>
#include <string.h>
void kp_copy(const float *src, float *dst, int32_t n) {
%s
}
"""
COPY_BODIES = {
    "loop (ref)": "    for (int i = 0; i < n; i++) dst[i] = src[i];",
    "memcpy": "    memcpy(dst, src, (size_t)n * sizeof(float));",
    "unroll4": """    int i = 0; for (; i + 4 <= n; i += 4) { dst[i] = src[i]; dst[i+1] = src[i+1];
        dst[i+2] = src[i+2]; dst[i+3] = src[i+3]; }
    for (; i < n; i++) dst[i] = src[i];""",
    "64-bit words": """    int i = 0; const uint64_t *s = (const uint64_t *)src;
    uint64_t *d = (uint64_t *)dst;
    for (; 2 * i + 1 < n; i++) d[i] = s[i];
    for (i *= 2; i < n; i++) dst[i] = src[i];""",
    "reverse": "    for (int i = n - 1; i >= 0; i--) dst[i] = src[i];",
    "first element repeated (bug)": "    for (int i = 0; i < n; i++) dst[i] = src[0];",
    "two halves": """    int h = n / 2; memcpy(dst, src, (size_t)h * 4);
    memcpy(dst + h, src + h, (size_t)(n - h) * 4);""",
    "blocks of 4096": """    for (int b = 0; b < n; b += 4096) {
        int e = b + 4096 < n ? b + 4096 : n; for (int i = b; i < e; i++) dst[i] = src[i]; }""",
}


def host_workdir(work: Path) -> None:
    """Three host snapshots of short kernels (tens of microseconds, the class the per-candidate
    time is about): kp_matmul (n=32), kp_axpy (16 Ki floats, in place), kp_copy (16 Ki
    floats)."""
    import numpy as np

    from kpair.record import record_call
    from kpair.toolchain import compile_shared

    rng = np.random.default_rng(0)
    build = work / "build"
    for name, template, body, args, names, fn in (
        ("matmul", MATMUL, MATMUL_BODIES["ijk (ref)"],
         [rng.standard_normal((32, 32), dtype=np.float32),
          rng.standard_normal((32, 32), dtype=np.float32),
          np.full((32, 32), np.nan, np.float32), np.int32(32)], ["a", "b", "c", "n"],
         "kp_matmul"),
        ("axpy", AXPY, AXPY_BODIES["plain (ref)"],
         [rng.standard_normal(1 << 14, dtype=np.float32),
          rng.standard_normal(1 << 14, dtype=np.float32), np.float32(1.5), np.int32(1 << 14)],
         ["x", "y", "a", "n"], "kp_axpy"),
        ("copy", COPY, COPY_BODIES["loop (ref)"],
         [rng.standard_normal(1 << 14, dtype=np.float32), np.zeros(1 << 14, np.float32),
          np.int32(1 << 14)], ["src", "dst", "n"], "kp_copy"),
    ):
        src = build / f"{name}.c"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(template % body)
        lib = compile_shared(src, build / f"{name}.so")
        (work / "host").mkdir(parents=True, exist_ok=True)
        record_call(lib, fn, args, work / "host" / name, names=names)


def host_candidates(op: str) -> list[dict]:
    template, bodies = {"host_matmul": (MATMUL, MATMUL_BODIES), "host_axpy": (AXPY, AXPY_BODIES),
                        "host_copy": (COPY, COPY_BODIES)}[op]
    return [{"form": "c", "code": template % body, "label": label}
            for label, body in bodies.items() if "(ref)" not in label]


# --------------------------------------------------------------------------- cuda candidates

_LOAD = re.compile(r"\bld\.global\.(?!nc\b|ca\b|cg\b|cs\b|lu\b|cv\b)")
_STORE = re.compile(r"\bst\.global\.(?!wb\b|cg\b|cs\b|wt\b)")


def ptx_candidates(ptx: str, limit: int) -> list[dict]:
    out = []
    for hint in ("nc", "cs", "lu", "cg"):
        edited, n = _LOAD.subn(f"ld.global.{hint}.", ptx)
        if n:
            out.append({"form": "ptx", "code": edited, "label": f"ptx: ld.global.{hint} x{n}"})
    edited, n = _STORE.subn("st.global.cs.", ptx)
    if n:
        out.append({"form": "ptx", "code": edited, "label": f"ptx: st.global.cs x{n}"})
    nc, _ = _LOAD.subn("ld.global.nc.", ptx)
    both, n = _STORE.subn("st.global.cs.", nc)
    if n:
        out.append({"form": "ptx", "code": both, "label": "ptx: ld.global.nc + st.global.cs"})
    for opts in (["-O3"], ["--def-load-cache=cg"], ["--maxrregcount=32"],
                 ["--allow-expensive-optimizations=true"]):
        out.append({"form": "ptx", "code": ptx, "ptxas_options": opts,
                    "label": f"ptx: ptxas {' '.join(opts)}"})
    return out[:limit]


def triton_candidates(code: dict, limit: int) -> list[dict]:
    source = code.get("triton_source")
    if not source:
        return []
    warps = int((code.get("triton_config") or {}).get("num_warps") or 4)
    out = [{"form": "triton", "code": source, "config": {"num_warps": w},
            "label": f"triton: num_warps={w}"} for w in (1, 2, 4, 8, 16) if w != warps]
    constants = code.get("triton_constants") or {}
    for key, value in constants.items():
        name = str(key)
        if re.fullmatch(r"[XYR]0?_?BLOCK|BLOCK_SIZE|XBLOCK", name) and isinstance(value, int):
            for v in (value * 2, value // 2):
                if v >= 1:
                    out.append({"form": "triton", "code": source,
                                "config": {"constants": {name: v}},
                                "label": f"triton: {name}={v}"})
    return out[:limit]


# --------------------------------------------------------------------------- the agent


def _data(result):
    if result.is_error:
        raise RuntimeError(result.content[0].text)
    data = result.structured_content
    if data is None:
        return json.loads(result.content[0].text)
    return data.get("result", data) if isinstance(data, dict) and set(data) == {"result"} \
        else data


async def agent(args, work: Path, summary: dict) -> None:
    """The agent's loop; ``summary`` is filled as it goes (so a run cut short still says
    what it did) and finished by ``finish``."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    server = StdioServerParameters(command=sys.executable, args=[
        "-m", "kpair", "mcp", str(work), *args.run_options], env=env)
    t0 = summary["t0"] = time.monotonic()
    # With a budget, exploring stops early enough to leave ``reserve`` for confirming and
    # publishing.
    deadline = t0 + args.budget_s if args.budget_s else float("inf")
    reserve = min(args.reserve_s, (args.budget_s or 0) / 3) if args.budget_s else 0.0
    async with Client(server, read_timeout_seconds=900) as client:
        tools = sorted(t.name for t in (await client.list_tools()).tools)
        summary["tools"] = tools
        if args.backend == "cuda":
            started = time.monotonic()
            cap = _data(await client.call_tool("capture", {
                "command": [sys.executable, *args.program], "out": "capture",
                "top": args.top, "kernel": args.kernel}))
            summary["capture"] = {"seconds": round(time.monotonic() - started, 2),
                                  "captured": cap["captured"]}
        ops = _data(await client.call_tool("list_operators", {}))
        ops = [o for o in ops if o.get("backend") == args.backend and o.get("complete", True)]
        summary["operators"] = [o["operator"] for o in ops]
        plans = {}
        for o in ops[:args.max_operators]:
            started = time.monotonic()
            desc = _data(await client.call_tool("describe_operator", {
                "operator": o["operator"], "max_chars": 400_000}))
            code = desc.get("code", {})
            if args.backend == "host":
                cands = host_candidates(o["operator"])
            else:
                cands = ptx_candidates(code["ptx"], args.per_operator) if code.get("ptx") \
                    else []
                cands += triton_candidates(code, args.per_operator)
            plans[o["operator"]] = cands
            summary.setdefault("describe", {})[o["operator"]] = {
                "seconds": round(time.monotonic() - started, 2), "kernel": desc["kernel"],
                "ref_time_us": desc.get("ref_time_us"), "sol": desc.get("sol_text"),
                "must_move_bytes": desc["must_move_bytes"], "ptx_from": code.get("ptx_from"),
                "sass_from": code.get("sass_from"), "has_triton_source":
                bool(code.get("triton_source")), "candidates_planned": len(cands)}
        summary["setup_s"] = round(time.monotonic() - t0, 2)
        # Round robin over the operators: a budget cut leaves every operator tried.
        queue = [(op, c) for i in range(max(map(len, plans.values()), default=0))
                 for op, cands in plans.items() if i < len(cands) for c in (cands[i],)]
        for op, c in queue:
            if time.monotonic() > deadline - reserve:
                summary["stopped"] = "budget: exploring stopped to confirm and publish"
                break
            started = time.monotonic()
            res = await client.call_tool("submit_candidate", {"operator": op, **c})
            seconds = round(time.monotonic() - started, 3)
            row = {"operator": op, "form": c["form"], "label": c["label"],
                   "seconds": seconds}
            if res.is_error:
                row.update(status="tool error", reason=res.content[0].text[:300])
            else:
                v = _data(res)
                row.update(_verdict_row(v))
            summary["candidates"].append(row)
            print(f"[{len(summary['candidates'])}] {op} {c['label']}: {row['status']} "
                  f"{row.get('speedup') or ''} ({seconds} s)", file=sys.stderr, flush=True)
        summary["explore_s"] = round(time.monotonic() - t0 - summary["setup_s"], 2)
        # Confirm: the best quick pass of each operator judged again with the full
        # measurement (the publishable verdict); the best confirmed one is published.
        confirmed = summary["confirmed"]
        for op in plans:
            if time.monotonic() > deadline - reserve / 2:
                break
            passed = [r for r in summary["candidates"]
                      if r["operator"] == op and r["status"] == "pass"]
            passed.sort(key=lambda r: -(r.get("speedup") or 0))
            for r in passed[:args.confirm]:
                c = next(c for c in plans[op] if c["label"] == r["label"])
                started = time.monotonic()
                res = await client.call_tool("submit_candidate",
                                             {"operator": op, **c, "full": True})
                row = {"operator": op, "form": c["form"], "label": c["label"],
                       "seconds": round(time.monotonic() - started, 3)}
                row.update({"status": "tool error", "reason": res.content[0].text[:300]}
                           if res.is_error else _verdict_row(_data(res)))
                confirmed.append(row)
                print(f"[confirm] {op} {c['label']}: {row['status']} "
                      f"{row.get('speedup') or ''} ({row['seconds']} s)", file=sys.stderr,
                      flush=True)
        ranked = sorted((r for r in confirmed if r["status"] == "pass"),
                        key=lambda r: -((r.get("combined_ci95") or [0])[0]))
        release = str(work / "release")
        for allow_slower in (False, True):
            for r in ranked[:3]:
                if time.monotonic() > deadline and summary["published"]:
                    break
                started = time.monotonic()
                res = await client.call_tool("publish", {
                    "operator": r["operator"], "attempt": r["attempt"], "release": release,
                    "allow_slower": allow_slower, "replace": True})
                pub = {"operator": r["operator"], "attempt": r["attempt"],
                       "label": r["label"], "allow_slower": allow_slower,
                       "seconds": round(time.monotonic() - started, 2)}
                pub.update({"error": res.content[0].text[:300]} if res.is_error else
                           {k: _data(res)[k] for k in ("published", "summary", "reason")})
                summary["published"].append(pub)
                if pub.get("published"):
                    break
            if any(p.get("published") for p in summary["published"]):
                break


def finish(summary: dict) -> dict:
    """The summary's totals and medians, from what the agent did (all of it or part)."""
    confirmed = summary["confirmed"]
    judged = [r for r in summary["candidates"] if r["status"] in ("pass", "fail")]

    def median(key: str, rows=judged) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    summary.update(
        candidates_submitted=len(summary["candidates"]),
        operators_with_candidates=len({r["operator"] for r in summary["candidates"]}),
        verdicts={s: sum(r["status"] == s for r in summary["candidates"])
                  for s in ("pass", "fail", "error", "tool error")},
        # Seconds per candidate after setup, at the client: build + judge + MCP round trip.
        median_s_per_candidate=median("seconds"),
        median_build_s=median("build_s"), median_judge_s=median("judge_s"),
        median_stage_s=_median_stages(judged),
        median_stage_s_note="seconds per stage in each verdict's result.json; 'load' and "
        "'ref' include the session setup's share (counted once, in every result)",
        median_s_per_full_candidate=median("seconds", confirmed),
        judged_by={m: sum(r.get("judged") == m for r in summary["candidates"] + confirmed)
                   for m in ("quick", "full")},
        ptx_candidates=sum(r["form"] == "ptx" for r in summary["candidates"]),
        total_s=round(time.monotonic() - summary.pop("t0", time.monotonic()), 2))
    return summary


def _verdict_row(v: dict) -> dict:
    return {"attempt": v["attempt"], "status": v["status"], "judged": v.get("judged"),
            "speedup": v["speedup"], "combined_ci95": v["combined_ci95"],
            "ci95": v["ci95"], "failed_check": v["failed_check"], "judge_s": v["judge_s"],
            "build_s": v["build_s"], "sol": v["sol"], "result": v["result"],
            "reason": (v["reason"] or "")[:300] or None}


def _median_stages(rows: list[dict]) -> dict[str, float]:
    """Median seconds of each candidate stage (from each verdict's result.json, which the
    server wrote on this machine), setup stages left out: where per-candidate time goes."""
    setup = {"verify", "place", "trust:poison", "trust:mutate"}
    per: dict[str, list[float]] = {}
    for r in rows:
        try:
            result = json.loads(Path(r["result"]).read_text())
        except (OSError, ValueError, KeyError):
            continue
        for name, s in (result.get("stage_s") or {}).items():
            per.setdefault(name, []).append(s)
        per.setdefault("wall", []).append(result.get("wall_s") or 0.0)
    return {k: round(statistics.median(v), 4) for k, v in per.items() if k not in setup}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("host", "cuda"), default="host")
    p.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    p.add_argument("--json", type=Path, help="also write the summary here")
    p.add_argument("--top", type=int, default=3, help="cuda: kernels to capture (default 3)")
    p.add_argument("--kernel", default="^triton_", help="cuda: capture filter")
    p.add_argument("--max-operators", type=int, default=4)
    p.add_argument("--confirm", type=int, default=1, metavar="N",
                   help="best quick passes per operator judged again in full (default 1)")
    p.add_argument("--per-operator", type=int, default=10,
                   help="cuda: at most this many PTX and this many Triton candidates each")
    p.add_argument("--program", nargs="+",
                   default=[str(ROOT / "benchmarks" / "programs" / "tiny_compiled.py")],
                   help="cuda: the program to capture (a Python file and its arguments)")
    p.add_argument("--budget-s", type=float, metavar="S",
                   help="seconds for the whole loop: exploring stops in time to confirm and "
                   "publish (default: no limit)")
    p.add_argument("--reserve-s", type=float, default=120.0, metavar="S",
                   help="of the budget, kept for confirming and publishing (at most a third; "
                   "default 120)")
    p.add_argument("--run-options", nargs=argparse.REMAINDER, default=[],
                   help="options passed to kpair mcp (e.g. --time-cap 0.2 --replicates 2)")
    args = p.parse_args(argv)
    import anyio

    with tempfile.TemporaryDirectory(prefix="kpair-mcp-agent-") as tmp:
        work = (args.work or Path(tmp) / "work").resolve()
        work.mkdir(parents=True, exist_ok=True)
        if args.backend == "host" and not (work / "host").exists():
            host_workdir(work)
        summary: dict = {"backend": args.backend, "work": str(work), "candidates": [],
                         "confirmed": [], "published": []}
        try:
            anyio.run(agent, args, work, summary)
        except BaseException as e:  # noqa: BLE001 - the JSON says what happened, then re-raise
            summary["error"] = f"{type(e).__name__}: {e}"[:2000]
            if not isinstance(e, Exception):
                raise
        finally:
            finish(summary)
            if args.json:
                args.json.write_text(json.dumps(summary, indent=1) + "\n")
    text = json.dumps(summary, indent=1)
    print(text)
    ok = "error" not in summary and summary["candidates_submitted"] >= 20 and summary["operators_with_candidates"] >= 3 \
        and any(p.get("published") for p in summary["published"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(main())
