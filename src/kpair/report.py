"""Release reports: one self-contained HTML page and a markdown summary, from ``index.json``.

Both render a typed ``kpair.release.Index`` (read by its strict reader).
``render_markdown(index)`` is pure text. ``render_html(index)`` draws two charts with
matplotlib (the ``report`` extra, imported only here and only when called): Harness speedup
per operator as a point and its reported interval on a log axis around 1.0, with the last
re-verified interval beside it once ``kpair verify`` ran (``speedup_rows`` is what it draws),
the geomean line and Director speedups as hollow markers (reference only); and slot_bias per
operator with its CI against the [0.99, 1.01] band. Charts are inlined as SVG, so the page
needs no other file and no network.
Only passing operators are drawn: the others have no measured speed, and appear in the
exclusions table with their reason. An operator whose last ``kpair verify`` re-run failed
(``failed_verification``: a tampered input, a wrong answer, a crash) is failed everywhere:
the headline names it, its status cell says so with the reason, and it is left out of the
geometric means and the charts, whatever was published. The summary is computed again from
the rows (``current``), so an index written by an older kpair renders the same way.
A "Reproduction" section lists, per operator, the published interval and every
``kpair verify`` re-run since (its point and interval, inside / compatible, the outcome),
and each verify run's release-level reproduction rate.

A release made by the tournament (``kpair.release.tournament``: rows with ``entrants``) gets
a "Producers side by side" section: per operator, every producer's judged candidate against
eager (the ref) with its interval, and the geometric means over the published operators of
the winner against eager, Inductor's best choice against eager, and the winner against
Inductor's best, with the run's wall time. ``producer_summary`` (pure) computes it, and
``write_report`` writes it, with the summary, into ``report.json`` beside the report.
"""

from __future__ import annotations

import html
import io
import os
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from ._util import make_dirs, write_text_atomic
from .errors import BackendUnavailable, InputError
from .measure import geomean
from .release import SLOT_BIAS_BAND, Index, Row, load_index, summarize
from .release.index import (
    EXCLUSION_REASONS,
    PRODUCERS,
    EntrantRow,
    failed_verification,
    verification_reason,
)
from .release.tournament import RunLog, inductor_best

HTML_NAME, MD_NAME, JSON_NAME = "report.html", "report.md", "report.json"
REPORT_SCHEMA = "kpair.release_report"
_BAR, _GEO, _DIRECTOR, _BAND, _OUT = "#3b6ea5", "#c0392b", "#333333", "#d8ecd5", "#e67e22"
_VERIFIED = "#2e8b57"
#: The interval bands: the point colours lightened (opaque, so overlaps do not mix).
_BAR_BAND, _VERIFIED_BAND = "#a7bed7", "#a3cdb4"


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise BackendUnavailable("the HTML report needs matplotlib: pip install "
                                 "'kpair[report]'") from None
    matplotlib.use("Agg", force=True)  # no display: render to files only
    import matplotlib.pyplot as plt

    return plt


def _x(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}x"


def _f(v: float | None, digits: int = 4) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _label(row: Row) -> str:
    return f"L{row.level} {row.name}"


def operator_label(row: Row) -> str:
    """The operator's name, with what was paired when it is not one dispatch against a
    same-layout opt: the range (its name and operation count) and the plan's launches."""
    parts = []
    if row.range is not None:
        parts.append(f"range {row.range.name}: {row.range.ops} op"
                     + ("s" if row.range.ops != 1 else ""))
    if row.plan_launches is not None:
        parts.append(f"plan of {row.plan_launches} launch"
                     + ("es" if row.plan_launches != 1 else ""))
    return row.name + (f" ({'; '.join(parts)})" if parts else "")


def _director(row: Row) -> float | None:
    return row.director.speedup if row.director else None


def _measured(row: Row) -> str:
    parts = []
    for t in row.correctness.tolerances or []:
        v = t.measured
        if v is None:
            continue
        if t.metric == "cosine":  # 0.99999999999989 would print as 1: show the gap
            parts.append(f"cosine 1 - {1 - v:.2g}" if v < 1 else "cosine 1 (exact)")
        else:
            parts.append(f"{t.metric} {v:.3g}")
    return ", ".join(parts)


def _sol(row: Row) -> str:
    """How near opt comes to the device's floor for this dispatch (``kpair.sol``): "48% of
    copy bandwidth", ref's figure beside it; "—" where no speed of light was had."""
    sol = row.sol
    if sol is None or (sol.opt_fraction is None and sol.ref_fraction is None):
        return "—"
    what = "copy bandwidth" if sol.bound == "memory" else "GEMM rate"
    if sol.opt_fraction is None:
        return f"ref {sol.ref_fraction:.0%} of {what}"
    ref = f" (ref {sol.ref_fraction:.0%})" if sol.ref_fraction is not None else ""
    return f"{sol.opt_fraction:.0%} of {what}{ref}"


def _ci(row: Row) -> str:
    """The reported interval: the ABBA CI widened by the identical-binary control where one
    was measured (``combined_ci95``), as release add judged it."""
    if not row.harness:
        return "—"
    lo, hi = row.harness.reported_ci95
    return f"[{lo:.3f}, {hi:.3f}]"


def current(index: Index) -> Index:
    """``index`` with its summary computed from its rows as this kpair does (pure): exclusions
    of failed verifications included, whichever kpair wrote the file."""
    return index.replace(summary=summarize(index.operators, index.refused))


def _status(row: Row) -> tuple[str, str]:
    """(text, class) of a row's status cell: a failed last verification overrides a pass."""
    v = failed_verification(row)
    if v is None:
        return row.status, row.status
    return f"failed {verification_reason(v)}", v.verdict


def _speed(row: Row) -> str:
    """The Harness speedup cell: the published figure, marked as withdrawn when the last
    verification failed."""
    h = row.harness
    if not h:
        return "—"
    text = f"{_x(h.speedup)} {_ci(row)}"
    return text if failed_verification(row) is None else f"— (published {text}, withdrawn)"


def _failed_line(index: Index) -> str | None:
    failed = [(r, v) for r in index.operators if (v := failed_verification(r)) is not None]
    if not failed:
        return None
    return "; ".join(f"level{r.level}/{r.name} ({verification_reason(v)})" for r, v in failed)


def _summary_lines(index: Index) -> list[tuple[str, str]]:
    s, c = index.summary, index.summary.counts
    rng = s.slot_bias_range
    failed = _failed_line(index)
    return [
        *((("FAILED VERIFICATION (excluded from the geometric means)", failed),)
          if failed else ()),
        ("Harness geomean speedup (recommended)",
         f"{_x(s.harness_geomean_speedup, 4)} over {s.harness_geomean_over} passing "
         "operators"),
        ("Director geomean speedup (reference only)",
         f"{_x(s.director_geomean_speedup, 4)} over {s.director_geomean_over} operators"
         " — the optimizer's own baseline and workload; not comparable with Harness"),
        ("slot_bias range", (f"{rng[0]:.4f} – {rng[1]:.4f} (band {SLOT_BIAS_BAND[0]} – "
                             f"{SLOT_BIAS_BAND[1]})") if rng else "—"),
        ("Operators", f"{c.passed} pass ({c.byte_exact} byte-exact, {c.tolerance} "
                      f"tolerance), {c.excluded} excluded ({_excluded_counts(s.excluded)}; "
                      f"{c.refused} refused when added"
                      + (f"; {n} published then failed kpair verify" if (n := sum(
                          failed_verification(r) is not None for r in index.operators))
                         else "") + ")"),
        ("Reproduced (last verification)",
         _rate(index.verifications[-1]) if index.verifications
         else "not verified since publication"),
        *((f"Against Inductor's {b.mode} config", _baseline_line(b))
          for b in s.baselines),
    ]


def _baseline_line(b) -> str:
    return (f"kpair's choice over it {_x(b.geomean_over_baseline, 4)} (geomean over "
            f"{b.operators} operators); at least as fast on {b.at_least}, not slower beyond "
            f"the intervals on {b.not_slower}")


_BASELINE_NOTE = ("Each operator's kernel as Inductor's own tuning configures it (the program "
                  "captured again with that tuning on, the kernel found by its source), "
                  "measured against ref on the same captured dispatch. kpair: the published "
                  "speedup, or 1.00x (ref kept) where nothing was published.")


def _baselines(index: Index) -> tuple[list[str], list[list[str]]]:
    """The baseline modes, and one line per operator that has a baseline: operator, kpair's
    choice, then each mode's speedup against ref (or why there is none)."""
    modes = [b.mode for b in index.summary.baselines]
    table = []
    for rows, published in ((index.operators, True), (index.refused, False)):
        for r in rows:
            if not r.baselines:
                continue
            ours = _speed(r) if published and r.harness else "1.00x (ref kept)"
            got = {b.mode: b for b in r.baselines}
            cells = []
            for mode in modes:
                b = got.get(mode)
                cells.append("—" if b is None else
                             f"{_x(b.speedup)}" + (" (= ref)" if b.same_as_ref else "")
                             if b.speedup else f"— ({b.reason})")
            table.append([r.rel, ours, *cells])
    return modes, table


# --------------------------------------------------------------------------- reproduction


def _yes(v: bool | None) -> str:
    return "—" if v is None else "yes" if v else "no"


def _rate(run) -> str:
    rate = f" ({run.rate:.0%})" if run.rate is not None else ""
    extra = [f"{n} {what}" for n, what in (
        (run.different_operator, "different operator"),
        (run.no_published_figure, "without a published figure")) if n]
    return (f"{run.reproduced} of {run.compared}{rate}"
            + (f"; {', '.join(extra)}" if extra else ""))


def _reproduction(index: Index) -> tuple[list[tuple[str, str, str, str]], list[list[str]]]:
    """The release rate of each verify run (run, when, devices, rate), and one table line per
    verification: operator, published interval, run, when, re-run, inside, compatible,
    outcome."""
    runs = [(str(v.run), v.when, ", ".join(v.devices) or "—", _rate(v))
            for v in index.verifications]
    table = []
    for r in index.operators:
        published = _ci(r) if r.harness else "—"
        point = f"{_x(r.harness.speedup)} {published}" if r.harness else r.status
        for v in r.verifications:
            rerun = (f"{_x(v.speedup)} [{v.ci95[0]:.3f}, {v.ci95[1]:.3f}]"
                     if v.speedup is not None and v.ci95 else v.verdict)
            outcome = v.outcome + (f" ({'; '.join(v.differs)})" if v.differs else "")
            table.append([f"level{r.level}/{r.name}", point, str(v.run), v.when or "—",
                          v.environment or "—", rerun, _yes(v.inside), _yes(v.compatible),
                          outcome])
    return runs, table


_REPRO_NOTE = ("The published figures are those `release add` published; `kpair verify` never "
               "changes them and appends each re-run. Reproduced: the re-run passes and its "
               "speedup lies inside the published interval (the one the verdict used). "
               "Compatible: the two intervals overlap. A re-run whose ref (code sha256, kernel, "
               "grid, block, dynamic shared memory) differs from the published one is a "
               "different operator and is not compared.")
_REPRO_HEAD = ("operator", "published [95% CI]", "verification", "when", "device",
               "re-run [95% CI]", "inside", "compatible", "outcome")


# --------------------------------------------------------------------------- producers


def _gm(values: list[float]) -> float | None:
    return geomean(values) if values else None


def _figure(points: list[tuple[float, float, float]]) -> dict:
    """The geometric mean of (point, lo, hi) triples, and the geometric means of their lows
    and highs as its interval (each operator's bound taken at once: conservative)."""
    return {"geomean": _gm([p for p, _, _ in points]),
            "interval": [_gm([lo for _, lo, _ in points]), _gm([hi for _, _, hi in points])]
            if points else None,
            "operators": len(points)}


def _by_producer(entrants: list[EntrantRow]) -> dict[str, EntrantRow]:
    """One entrant per producer: the first, or a later one of that producer that passed with
    a larger estimate."""
    out: dict[str, EntrantRow] = {}
    for e in entrants:
        had = out.get(e.producer)
        if had is None or (e.status == "pass" and (had.status != "pass"
                                                    or (e.speedup or 0) > (had.speedup or 0))):
            out[e.producer] = e
    return out


def _entrant_json(e: EntrantRow) -> dict:
    return {"status": e.status, "speedup": e.speedup,
            "ci95": list(e.ci95) if e.ci95 else None, "faster": e.faster,
            "winner": e.winner, "reason": e.reason}


def producer_summary(index: Index, run: RunLog | None = None) -> dict | None:
    """The producers side by side (pure; None when no row was made by the tournament).

    ``operators``: per operator with entrants, each producer's judged candidate against eager
    (status, speedup, interval), the winner or the exclusion. ``summary``, over the published
    operators that pass (``Index.passing``): the winner against eager; Inductor's best choice
    (the best correct of its default, max-autotune and coordinate-descent candidates) against
    eager, over those where one passed; the winner against Inductor's best, per operator the
    ratio of estimates with the interval [winner lo / Inductor hi, winner hi / Inductor lo]
    (1.0 exactly where Inductor's best is the winner), and how many operators have the
    winner at least as fast within that interval (its upper end >= 1.0); the count of
    exclusions by reason, wins by producer, and the run's wall time (``RunLog``)."""
    index = current(index)
    tournament = [r for r in (*index.operators, *index.refused) if r.entrants]
    if not tournament:
        return None
    passing = {r.key for r in index.passing}
    operators = []
    for r in sorted(tournament, key=lambda r: (r.level, r.name)):
        operators.append({
            "operator": r.rel, "published": r.key in passing, "winner": r.producer,
            "exclusion": r.exclusion,
            "producers": {p: _entrant_json(e) for p, e in _by_producer(r.entrants).items()}})
    published = [r for r in index.passing if r.entrants]
    winner, inductor, ratio = [], [], []
    at_least = 0
    for r in published:
        w = (r.harness.speedup, *r.harness.reported_ci95)
        winner.append(w)
        best = inductor_best(r.entrants)
        if best is None or best.ci95 is None:
            continue
        i = (best.speedup, *best.ci95)
        inductor.append(i)
        same = best.winner   # Inductor's best is the published candidate itself
        q = (1.0, 1.0, 1.0) if same else (w[0] / i[0], w[1] / i[2], w[2] / i[1])
        ratio.append(q)
        at_least += q[2] >= 1.0
    excluded = {reason: sum(r.exclusion == reason for r in index.refused)
                for reason in EXCLUSION_REASONS}
    wins = {p: sum(r.producer == p for r in published) for p in PRODUCERS}
    summary = {
        "published": len(published), "excluded": {k: v for k, v in excluded.items() if v},
        "wins": {k: v for k, v in wins.items() if v},
        "winner_vs_eager": _figure(winner),
        "inductor_best_vs_eager": {**_figure(inductor),
                                   "missing": len(published) - len(inductor)},
        "winner_vs_inductor_best": {**_figure(ratio), "at_least_within_interval": at_least},
        "wall_s": run.wall_s if run and run.calls else None,
        "calls": len(run.calls) if run else 0}
    return {"summary": summary, "operators": operators}


def _gx(fig: dict) -> str:
    if fig["geomean"] is None:
        return "— (no operator)"
    lo, hi = fig["interval"]
    return f"{fig['geomean']:.4f}x [{lo:.4f}, {hi:.4f}] over {fig['operators']}"


def _producer_lines(p: dict) -> list[tuple[str, str]]:
    s = p["summary"]
    vs = s["winner_vs_inductor_best"]
    ex = ", ".join(f"{n} {k}" for k, n in s["excluded"].items()) or "none"
    wins = ", ".join(f"{k} {n}" for k, n in s["wins"].items()) or "none"
    wall = f"{s['wall_s']:.0f} s in {s['calls']} call(s)" if s["wall_s"] is not None else "—"
    return [("Winner against eager (geomean)", _gx(s["winner_vs_eager"])),
            ("Inductor's best choice against eager", _gx(s["inductor_best_vs_eager"])
             + (f"; {s['inductor_best_vs_eager']['missing']} published operator(s) where no "
                "Inductor candidate passed" if s["inductor_best_vs_eager"]["missing"] else "")),
            ("Winner against Inductor's best", _gx(vs) + f"; at least as fast within the "
             f"interval on {vs['at_least_within_interval']} of {vs['operators']}"),
            ("Published / wins by producer", f"{s['published']} published; {wins}"),
            ("Excluded by reason", ex), ("Wall time of the run", wall)]


def _producer_table(p: dict) -> tuple[list[str], list[list[str]]]:
    seen = {k for o in p["operators"] for k in o["producers"]}
    cols = [k for k in PRODUCERS if k in seen]
    table = []
    for o in p["operators"]:
        cells = []
        for k in cols:
            e = o["producers"].get(k)
            if e is None:
                cells.append("—")
            elif e["speedup"] is not None and e["ci95"]:
                lo, hi = e["ci95"]
                cells.append(f"{e['speedup']:.3f}x [{lo:.3f}, {hi:.3f}]"
                             + (" (winner)" if e["winner"] else ""))
            else:
                cells.append(e["status"])
        outcome = f"published: {o['winner']}" if o["published"] else \
            f"excluded: {o['exclusion']}" if o["exclusion"] else "not passing"
        table.append([o["operator"], outcome, *cells])
    return cols, table


_PRODUCERS_NOTE = ("Every producer's candidate for an operator judged by the same pair and "
                   "run against eager (the ref): speedup t_eager / t_candidate with its "
                   "reported interval, or its verdict (fail, error, refused: the pair itself "
                   "was refused). Geometric means are over the published operators; an "
                   "interval of a geometric mean is the geometric means of the operators' "
                   "interval ends, and the ratio's interval combines both intervals "
                   "conservatively (winner lo / Inductor hi, winner hi / Inductor lo).")


# --------------------------------------------------------------------------- markdown


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _per_device(index: Index) -> tuple[list[int], list[tuple[str, list[str]]]]:
    """The devices of a release verified with ``--each`` and, per operator, each device's
    verdict with its speedup and interval (empty when no row has per-device runs)."""
    devices = sorted({d.device_index for r in index.operators for d in r.per_device or []})
    table = []
    for r in index.operators:
        if not r.per_device:
            continue
        by = {d.device_index: d for d in r.per_device}
        cells = []
        for i in devices:
            d = by.get(i)
            if d is None:
                cells.append("—")
            elif d.speedup is not None:
                lo, hi = d.combined_ci95 or d.ci95
                cells.append(f"{d.speedup:.3f}x [{lo:.3f}, {hi:.3f}]")
            else:
                cells.append(d.status)
        table.append((f"level{r.level}/{r.name}", cells))
    return devices, table


def render_markdown(index: Index, run: RunLog | None = None) -> str:
    index = current(index)
    lines = ["# kpair release report", "",
             f"Index updated {index.updated} (kpair {index.kpair_version}).", ""]
    lines += [f"- **{k}**: {v}" for k, v in _summary_lines(index)]
    lines += ["", "## Operators", "",
              "| level | operator | backend/arch | correctness | Harness speedup [95% CI] "
              "| slot_bias | SOL | Director (ref. only) | status |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in index.operators:
        h = r.harness
        corr = r.correctness.label + (f" ({_measured(r)})" if _measured(r) else "")
        status, _ = _status(r)
        lines.append("| " + " | ".join(_md_cell(v) for v in (
            r.level, operator_label(r), f"{r.backend}/{r.arch}", corr, _speed(r),
            _f(h.slot_bias if h else None), _sol(r), _x(_director(r)),
            status if failed_verification(r) is None else f"**{status}**")) + " |")
    devices, table = _per_device(index)
    if table:
        lines += ["", "## Per device (verified on every device; the verdict must agree)", "",
                  "| operator | " + " | ".join(f"device {d}" for d in devices) + " |",
                  "|---|" + "---|" * len(devices)]
        lines += ["| " + " | ".join(_md_cell(v) for v in (op, *cells)) + " |"
                  for op, cells in table]
    modes, table = _baselines(index)
    if table:
        lines += ["", "## Against Inductor's own tuning", "", _BASELINE_NOTE, "",
                  "| operator | kpair | " + " | ".join(f"Inductor {m}" for m in modes) + " |",
                  "|---|---|" + "---|" * len(modes)]
        lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in table]
    producers = producer_summary(index, run)
    if producers is not None:
        cols, table = _producer_table(producers)
        lines += ["", "## Producers side by side", "", _PRODUCERS_NOTE, ""]
        lines += [f"- **{k}**: {v}" for k, v in _producer_lines(producers)]
        lines += ["", "| operator | outcome | " + " | ".join(cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in table]
    runs, table = _reproduction(index)
    lines += ["", "## Reproduction", "", _REPRO_NOTE, ""]
    if runs:
        lines += ["| verification | when | devices | reproduced |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(_md_cell(v) for v in run) + " |" for run in runs]
        lines += ["", "| " + " | ".join(_REPRO_HEAD) + " |", "|" + "---|" * len(_REPRO_HEAD)]
        lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in table]
    else:
        lines.append("Not verified since publication (`kpair verify` re-runs every harness).")
    excluded = index.summary.excluded
    lines += ["", "## Excluded (kept out of both geometric means)", ""]
    if excluded:
        lines += ["| level | operator | status | where | reason |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_md_cell(v) for v in (
            e.level, e.name, e.status, e.where,
            f"{e.exclusion}: {e.reason}" if e.exclusion else e.reason)) + " |"
            for e in excluded]
    else:
        lines.append("None.")
    lines += ["", "Speedup = t_ref / t_opt from ABBA-interleaved replays of the captured "
              "dispatch; only ratios are reported. The interval is the 95% re-run interval of "
              "the replicates (on a GPU with a run-level timing term), widened in quadrature "
              "by the identical-binary control (ref against a second load of itself) where "
              "it was measured. SOL: opt's speed of light, the least time the bytes the "
              "captured dispatch must move take at the device's copy bandwidth as kpair "
              "measured it, over opt's median time (ref's in parentheses). Director numbers "
              "come from each operator's "
              "provenance (`director_validation.json`) and are for reference only.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- charts


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    # Inline SVG needs no XML prolog or DOCTYPE; keep from the <svg element on.
    return text[text.index("<svg"):]


def _height(n: int) -> float:
    return 1.3 + 0.38 * max(n, 1)


@dataclass(frozen=True)
class ChartRow:
    """One operator of the speedup chart: its published Harness point and interval, the last
    re-verification's (None until ``kpair verify`` measured one), the Director number."""

    label: str
    published: tuple[float, float, float]            # (point, lo, hi)
    verified: tuple[float, float, float] | None
    verified_outcome: str | None
    director: float | None


def speedup_rows(index: Index) -> list[ChartRow]:
    """What the speedup chart draws, first operator first: passing operators only."""
    rows = []
    for r in index.passing:
        lo, hi = r.harness.reported_ci95
        v = next((v for v in reversed(r.verifications)
                  if v.speedup is not None and v.ci95 is not None), None)
        rows.append(ChartRow(_label(r), (r.harness.speedup, lo, hi),
                             (v.speedup, *v.ci95) if v else None, v.outcome if v else None,
                             _director(r)))
    return rows


def _log_ticks(lo: float, hi: float) -> list[float]:
    # Plain numbers a reader can compare (1.02, 1.05, ...) rather than powers of ten.
    from matplotlib.ticker import MaxNLocator

    ticks = [t for t in MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
             if lo <= t <= hi and t > 0]
    return ticks if 1.0 in ticks or not lo <= 1.0 <= hi else sorted({*ticks, 1.0})


def speedup_figure(index: Index):
    """The speedup chart as a matplotlib figure (the caller closes it): per operator, the
    published Harness interval around its point on a log axis centred near 1.0, and, once
    re-verified, the last re-run's interval beside it. A log axis draws 1.05x and 1/1.05x
    the same distance from 1.0, and a bar from 0 would hide the few percent a release is
    about."""
    plt = _matplotlib()
    rows = speedup_rows(index)[::-1]  # first operator at the top
    verified = any(r.verified for r in rows)
    fig, ax = plt.subplots(figsize=(8.5, _height(len(rows)) * (1.25 if verified else 1)),
                           dpi=100)
    ys = list(range(len(rows)))
    shift = 0.17 if verified else 0.0

    def intervals(points, ys_, colour, band, label, marker):
        if not points:
            return
        ax.hlines(ys_, [p[1] for p in points], [p[2] for p in points], colors=band,
                  linewidth=6, label=f"{label}, interval")
        ax.scatter([p[0] for p in points], ys_, color=colour, marker=marker, zorder=3,
                   s=28, label=label)

    intervals([r.published for r in rows], [y + shift for y in ys], _BAR, _BAR_BAND,
              "Harness speedup (published)", "o")
    again = [(y - shift, r.verified) for y, r in zip(ys, rows, strict=True) if r.verified]
    intervals([p for _, p in again], [y for y, _ in again], _VERIFIED,
              _VERIFIED_BAND, "last kpair verify re-run", "s")
    d = [(y + shift, r.director) for y, r in zip(ys, rows, strict=True) if r.director]
    if d:
        ax.scatter([v for _, v in d], [y for y, _ in d], marker="D", facecolors="white",
                   edgecolors=_DIRECTOR, zorder=4, s=24, label="Director (reference only)")
    g = index.summary.harness_geomean_speedup
    if g:
        ax.axvline(g, color=_GEO, linestyle="--", linewidth=1.5,
                   label=f"Harness geomean {g:.3f}x")
    ax.axvline(1.0, color="black", linewidth=0.8)

    values = [1.0] + ([g] if g else []) + [v for _, v in d]
    for r in rows:
        values += [*r.published, *(r.verified or ())]
    lo, hi = min(values), max(values)
    pad = max((hi / lo) ** 0.06, 1.005)
    ax.set_xscale("log")
    ax.set_xlim(lo / pad, hi * pad)
    ax.set_xticks(_log_ticks(lo / pad, hi * pad))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}x")
    ax.xaxis.set_minor_formatter(lambda v, _: "")
    ax.set_yticks(ys, [r.label for r in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("speedup t_ref / t_opt, log scale (>1: opt faster)")
    ax.set_title("Harness speedup per operator" +
                 (": published and last re-verified" if verified else ""))
    ax.grid(axis="x", alpha=0.3)
    _legend_below(ax)
    return fig


def speedup_chart(index: Index) -> str:
    plt = _matplotlib()
    fig = speedup_figure(index)
    try:
        return _svg(fig)
    finally:
        plt.close(fig)


def _legend_below(ax) -> None:
    # Below the axes, so it never hides a bar or a point however many operators there are.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.5 / ax.figure.get_figheight()),
              ncol=3, fontsize=8, frameon=False)


def slot_bias_chart(index: Index) -> str:
    plt = _matplotlib()
    rows = index.passing[::-1]
    fig, ax = plt.subplots(figsize=(8.5, _height(len(rows))), dpi=100)
    try:
        lo, hi = SLOT_BIAS_BAND
        ax.axvspan(lo, hi, color=_BAND, label=f"[{lo}, {hi}]")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ys = list(range(len(rows)))
        b = [r.harness.slot_bias for r in rows]
        ci = [r.harness.slot_bias_ci95 or (v, v) for v, r in zip(b, rows, strict=True)]
        ax.errorbar(b, ys, xerr=[[v - c[0] for v, c in zip(b, ci, strict=True)],
                                 [c[1] - v for v, c in zip(b, ci, strict=True)]],
                    fmt="o", color=_BAR, ecolor="black", capsize=3, label="slot_bias, 95% CI")
        outside = [(v, y) for v, y in zip(b, ys, strict=True) if not lo <= v <= hi]
        if outside:
            ax.scatter(*zip(*outside, strict=True), color=_OUT, zorder=3, label="outside band")
        span = max([abs(v - 1) for c in ci for v in c] + [hi - 1]) * 1.15
        ax.set_xlim(1 - span, 1 + span)
        ax.set_yticks(ys, [_label(r) for r in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel("slot_bias = sqrt(fwd · rev)  (≈1: slot position does not matter)")
        ax.set_title("slot_bias per operator")
        ax.grid(axis="x", alpha=0.3)
        _legend_below(ax)
        return _svg(fig)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1100px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.15em;margin-top:28px}
.meta{color:#666;font-size:.9em}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:10px 14px;min-width:180px}
.card .v{font-size:1.4em;font-weight:600}.card .k{color:#555;font-size:.85em}
.card.ref .v{color:#777}
table{border-collapse:collapse;font-size:.88em;margin-top:8px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#1e7b34;font-weight:600}.fail,.error{color:#b03a2e;font-weight:600}
.chart svg{max-width:100%;height:auto}
.note{color:#555;font-size:.85em}
"""


def _cell(v: object, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<td{c}>{html.escape(str(v))}</td>"


def _operators_table(index: Index) -> str:
    head = ("<tr><th>level</th><th>operator</th><th>backend/arch</th><th>correctness</th>"
            "<th>measured</th><th>Harness speedup</th><th>95% CI</th><th>slot_bias</th>"
            "<th>SOL</th><th>Director (ref. only)</th><th>status</th></tr>")
    body = []
    for r in index.operators:
        h = r.harness
        withdrawn = failed_verification(r) is not None
        speed = f"— (published {_x(h.speedup)}, withdrawn)" if h and withdrawn \
            else _x(h.speedup if h else None)
        body.append("<tr>" + "".join((
            _cell(r.level), _cell(operator_label(r)), _cell(f"{r.backend}/{r.arch}"),
            _cell(r.correctness.label), _cell(_measured(r) or "—"),
            _cell(speed, "num"), _cell(_ci(r), "num"),
            _cell(_f(h.slot_bias if h else None), "num"), _cell(_sol(r), "num"),
            _cell(_x(_director(r)), "num"),
            _cell(*_status(r)))) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _devices_table(index: Index) -> str:
    devices, table = _per_device(index)
    if not table:
        return ""
    head = "<tr><th>operator</th>" + "".join(f"<th>device {d}</th>" for d in devices) + "</tr>"
    body = "".join("<tr>" + _cell(op) + "".join(_cell(c, "num") for c in cells) + "</tr>"
                   for op, cells in table)
    return (f"<h2>Per device</h2><p class=\"note\">Each operator verified on every device: "
            f"Harness speedup [95% CI] per device; a verdict that differs is an error.</p>"
            f"<table>{head}{body}</table>")


def _OUTCOME_CLASS(outcome: str) -> str:  # noqa: N802 - a table, read as one
    return "pass" if outcome == "reproduced" else "" if outcome.startswith(
        ("different operator", "no published")) else "fail"


def _reproduction_section(index: Index) -> str:
    runs, table = _reproduction(index)
    note = f'<p class="note">{html.escape(_REPRO_NOTE.replace("`", ""))}</p>'
    if not runs:
        return (f"<h2>Reproduction</h2>{note}<p>Not verified since publication "
                "(kpair verify re-runs every harness).</p>")
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in
                            ("verification", "when", "devices", "reproduced")) + "</tr>"
    body = "".join("<tr>" + "".join(_cell(c) for c in run) + "</tr>" for run in runs)
    thead = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in _REPRO_HEAD) + "</tr>"
    rows = "".join(
        "<tr>" + "".join(_cell(c, "num" if i in (1, 5) else _OUTCOME_CLASS(c) if i == 8
                               else "") for i, c in enumerate(row)) + "</tr>"
        for row in table)
    return (f"<h2>Reproduction</h2>{note}<table>{head}{body}</table>"
            f"<table>{thead}{rows}</table>")


def _excluded_table(index: Index) -> str:
    excluded = index.summary.excluded
    if not excluded:
        return "<p>None: every operator passed.</p>"
    head = "<tr><th>level</th><th>operator</th><th>status</th><th>where</th><th>reason</th></tr>"
    body = "".join("<tr>" + _cell(e.level) + _cell(e.name) + _cell(e.status, e.status)
                   + _cell(e.where) + _cell(e.reason) + "</tr>" for e in excluded)
    return f"<table>{head}{body}</table>"


def _baselines_section(index: Index) -> str:
    modes, table = _baselines(index)
    if not table:
        return ""
    head = "<tr><th>operator</th><th>kpair</th>" + "".join(
        f"<th>Inductor {html.escape(m)}</th>" for m in modes) + "</tr>"
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in table)
    lines = "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in
                    ((f"Against Inductor's {b.mode} config", _baseline_line(b))
                     for b in index.summary.baselines))
    return (f"<h2>Against Inductor's own tuning</h2><p class=\"note\">"
            f"{html.escape(_BASELINE_NOTE)}</p><ul>{lines}</ul><table>{head}{body}</table>")


def _producers_section(index: Index, run: RunLog | None) -> str:
    producers = producer_summary(index, run)
    if producers is None:
        return ""
    cols, table = _producer_table(producers)
    lines = "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>"
                    for k, v in _producer_lines(producers))
    head = "<tr><th>operator</th><th>outcome</th>" + "".join(
        f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>"
    body = "".join("<tr>" + _cell(row[0]) + _cell(row[1]) + "".join(
        _cell(c, "num") for c in row[2:]) + "</tr>" for row in table)
    return (f"<h2>Producers side by side</h2><p class=\"note\">"
            f"{html.escape(_PRODUCERS_NOTE)}</p><ul>{lines}</ul><table>{head}{body}</table>")


def render_html(index: Index, run: RunLog | None = None) -> str:
    index = current(index)
    s, c = index.summary, index.summary.counts
    failed = _failed_line(index)
    alert = (f'<p class="fail">FAILED VERIFICATION (excluded from the geometric means): '
             f'{html.escape(failed)}</p>') if failed else ""
    cards = [("Harness geomean (recommended)", _x(s.harness_geomean_speedup, 4),
              f"over {s.harness_geomean_over} passing operators", ""),
             ("Director geomean (reference only)", _x(s.director_geomean_speedup, 4),
              f"over {s.director_geomean_over} operators", "ref"),
             ("slot_bias range", "–".join(f"{v:.4f}" for v in s.slot_bias_range)
              if s.slot_bias_range else "—",
              f"band {SLOT_BIAS_BAND[0]}–{SLOT_BIAS_BAND[1]}", ""),
             ("Operators", f"{c.passed} pass / {c.excluded} excluded",
              f"{c.byte_exact} byte-exact, {c.tolerance} tolerance", "")]
    cards_html = "".join(
        f'<div class="card {cls}"><div class="k">{html.escape(k)}</div>'
        f'<div class="v">{html.escape(v)}</div><div class="k">{html.escape(sub)}</div></div>'
        for k, v, sub, cls in cards)
    charts = ""
    if index.passing:
        charts = (f'<h2>Speedup</h2><div class="chart">{speedup_chart(index)}</div>'
                  f'<p class="note">Points: Harness speedup t_ref/t_opt on the captured '
                  f'dispatch (ABBA); bands: its reported 95% interval (the re-run interval, '
                  f'widened by the identical-binary control where it ran), on a log axis so '
                  f'that a few percent either side of 1.0 shows. Green squares and bands, '
                  f'once the release was re-verified: the last <code>kpair verify</code> '
                  f're-run of each operator, beside what was published. Dashed line: the '
                  f'geometric mean over passing operators. Hollow diamonds: Director speedup '
                  f'from provenance, reference only. Excluded operators are not drawn.</p>'
                  f'<h2>Slot bias</h2><div class="chart">{slot_bias_chart(index)}</div>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>kpair release report</title><style>{_CSS}</style></head>
<body>
<h1>kpair release report</h1>
<div class="meta">index updated {html.escape(index.updated)} · kpair
{html.escape(index.kpair_version)} · report by kpair {__version__}</div>
{alert}
<div class="cards">{cards_html}</div>
<p class="note">Harness: ABBA-interleaved replays of the captured dispatch; only ratios are
reported. Director: {html.escape(s.director_note)}.</p>
{charts}
<h2>Operators and correctness modes</h2>{_operators_table(index)}
{_devices_table(index)}
{_baselines_section(index)}
{_producers_section(index, run)}
{_reproduction_section(index)}
<h2>Excluded operators (kept out of both geometric means)</h2>{_excluded_table(index)}
</body></html>
"""


def _excluded_counts(excluded) -> str:
    """The exclusions by what kept them out: every failed one is counted as a fail, whether
    it was refused when added or failed after publication."""
    fail = sum(e.status == "fail" for e in excluded)
    error = sum(e.status == "error" for e in excluded)
    slower = sum(e.status == "pass" for e in excluded)
    return f"{fail} fail, {error} error, {slower} correct but not faster"


def write_report(root: str | os.PathLike, out: str | os.PathLike | None = None, *,
                 html_page: bool = True) -> dict[str, Path]:
    """Write report.md and report.json (always) and report.html (needs matplotlib) for the
    release at ``root``.

    Returns the written paths by kind ("markdown", "json", "html"). The markdown and JSON
    are written first, so a machine without matplotlib still gets them before the error that
    names the install. report.json (schema ``kpair.release_report`` v1) holds the index's
    summary as this kpair computes it and, for a tournament's release, ``producers``
    (``producer_summary``; null otherwise).
    """
    root = Path(root)
    index = load_index(root)
    if index is None:  # as `kpair report` says it: a bad input, exit status 3
        raise InputError("no index.json here: not a release (make one with `kpair release "
                         "add` or `kpair demo`)", path=root)
    out = make_dirs(out if out is not None else root)
    run = RunLog.load(root)
    written = {"markdown": out / MD_NAME, "json": out / JSON_NAME}
    write_text_atomic(written["markdown"], render_markdown(index, run))
    write_text_atomic(written["json"], report_json(index, run))
    if html_page:
        written["html"] = out / HTML_NAME
        write_text_atomic(written["html"], render_html(index, run))
    return written


def report_json(index: Index, run: RunLog | None = None) -> str:
    """report.json: the summary as this kpair computes it from the rows, and the producers
    side by side (null unless the release was made by the tournament)."""
    import json

    index = current(index)
    return json.dumps({"schema": REPORT_SCHEMA, "schema_version": 1,
                       "kpair_version": __version__, "index_updated": index.updated,
                       "summary": index.summary.to_json(),
                       "producers": producer_summary(index, run)}, indent=1) + "\n"

