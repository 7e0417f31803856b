"""Inductor's own tuning as the baseline a retune must beat.

A user of ``torch.compile`` can already ask Inductor to tune harder: coordinate-descent tuning
(``TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1``) and max-autotune
(``TORCHINDUCTOR_MAX_AUTOTUNE=1``, ``TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE=1``). So the program
is captured again under each mode (``capture_tuned``: a fresh Inductor cache, so nothing tuned
earlier is reused), and every Triton kernel in that capture is indexed by its source
(``kpair.optimize.strategies.triton.source_key``: the recorded source with the kernel's own
name left out, and its signature) with the config Inductor launched it with
(``tuned_configs``). An operator whose kernel is found there gets that config built by the
``triton`` strategy (``TritonRetune.baselines``) and measured by the search on the operator's
own captured dispatch, in the same way as the winner (``kpair.optimize.search``, stage
``baseline``). A tuned config equal to the captured one is ref itself: 1.0 by definition, not
measured.

``provenance/baseline.json`` (``kpair.release.index.BaselineRecord``) holds what was found and
measured; ``release add`` reads its speedups into the row, and the index summarizes the winner
against them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from .. import progress
from ..capture.workflow import capture_program
from ..errors import KpairError
from ..release.index import BASELINE_FILE as FILE
from ..release.index import BaselineEntry, BaselineRecord
from ..snapshot import Snapshot
from .strategies.triton import config_of, info_key, kernel_info, resolve
from .workbench import captured_dispatches, finished_capture

#: Inductor's tuning modes and the environment that turns each on.
MODES: dict[str, dict[str, str]] = {
    "coordinate-descent": {"TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "1"},
    "max-autotune": {"TORCHINDUCTOR_MAX_AUTOTUNE": "1",
                     "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE": "1"},
}


def tuned_configs(capture: str | os.PathLike) -> dict[str, dict]:
    """``{source_key: {"config", "kernel", "snapshot"}}`` for every Triton dispatch of a
    ``kpair capture`` directory whose config is known; the first dispatch of a kernel wins."""

    capture = Path(capture)
    out: dict[str, dict] = {}
    for d in captured_dispatches(capture):
        try:
            snap = Snapshot.open(capture / d["snapshot"])
        except (KpairError, OSError):
            continue
        m = snap.manifest
        info = kernel_info(m.provenance or {})
        if info is None:
            continue
        info = resolve(info, m, snap.kernarg())
        if isinstance(info, str):
            continue
        out.setdefault(info_key(info), {"config": config_of(info), "kernel": info.function,
                                        "snapshot": str(capture / d["snapshot"])})
    return out


def capture_tuned(command: Sequence[str], work: Path, mode: str, *, kernel: str | None,
                  log) -> Path:
    """``kpair capture`` of the program with Inductor's ``mode`` on, in a fresh Inductor
    cache (``WORK/capture-<mode>``; reused when it finished): the first launch of every
    kernel (matching ``kernel``), its metadata only — no region is kept (they are not
    replayed), so the capture costs one run of the program."""
    out = work / f"capture-{mode}"
    summary = out / "capture.json"
    if finished_capture(out):
        log(f"kpair optimize: reusing the {mode} capture in {out}")
        return out
    cache = work / "inductor-cache" / mode
    for path in (out, cache):
        if path.exists():
            shutil.rmtree(path)
    cache.mkdir(parents=True)
    env = {**os.environ, **MODES[mode], "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    progress.stage(f"capturing the program with Inductor's {mode} tuning")
    log(f"kpair optimize: capturing the program again with Inductor's {mode} tuning "
        f"({' '.join(f'{k}={v}' for k, v in MODES[mode].items())})")
    outcome = capture_program(command, out, kernel=kernel, max=None, distinct=True,
                              max_region_bytes=1, env=env, log=log)
    if outcome.summary is None and not summary.is_file():
        raise KpairError(f"the {mode} capture wrote no capture.json (exit status "
                         f"{outcome.exit_status})")
    return out


__all__ = ["BaselineEntry", "BaselineRecord", "FILE", "MODES", "capture_tuned", "tuned_configs"]
