"""Reports: markdown and self-contained HTML from an index; the page rendered in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from fake_release import fake_row
from kpair import release
from kpair.cli import main as kpair
from kpair.errors import BackendUnavailable, UsageError
from kpair.report import render_markdown, write_report

#: The bar colour of the speedup chart (report._BAR), as 8-bit RGB.
BAR_RGB = (0x3B, 0x6E, 0xA5)


@pytest.fixture
def root(tmp_path):
    """A release index with 5 passing operators, one failing and one refused."""
    rows = [fake_row(1, "1_Square_matrix_multiplication_", 2.56, slot_bias=0.996, director=2.7),
            fake_row(1, "23_Softmax", 1.75, slot_bias=1.003, director=1.95, mode="tolerance"),
            fake_row(1, "37_FrobeniusNorm_", 4.09, slot_bias=0.9938, director=2.69,
                     mode="tolerance"),
            fake_row(2, "76_Gemm_Add_ReLU", 2.49, slot_bias=1.012, director=2.65),
            fake_row(2, "99_Slower", 0.93, slot_bias=1.0),
            fake_row(2, "40_Broken", status="fail")]
    refused = [fake_row(1, "21_Sigmoid", status="fail")]
    release.build_index(rows, refused).write(tmp_path / "index.json")
    return tmp_path


def test_markdown_has_summary_table_and_exclusions(root):
    md = render_markdown(release.load_index(root))
    assert "Harness geomean speedup (recommended)" in md
    assert "Director geomean speedup (reference only)" in md
    assert "| 1 | 23_Softmax | host/x86_64 | tolerance: cosine >= 0.9999" in md
    excluded = md.split("## Excluded")[1]
    assert "21_Sigmoid" in excluded and "40_Broken" in excluded and "99_Slower" not in excluded
    assert "refused by release add" in excluded


def test_the_table_shows_the_interval_widened_by_the_control(tmp_path):
    # A row measured with the identical-binary control: its reported interval is the
    # combined one, the one release add judged; the raw ABBA CI alone would claim more.
    row = fake_row(2, "k", 1.03)
    row = row.replace(harness=row.harness.replace(ci95=(1.025, 1.035),
                                                  combined_ci95=(1.012, 1.048)))
    release.build_index([row], []).write(tmp_path / "index.json")
    md = render_markdown(release.load_index(tmp_path))
    assert "| 1.030x [1.012, 1.048] |" in md and "[1.025, 1.035]" not in md


def test_html_is_self_contained(root):
    pytest.importorskip("matplotlib")
    written = write_report(root)
    page = written["html"].read_text()
    assert written["markdown"].is_file()
    assert page.count("<svg") == 2
    # Nothing fetched from elsewhere: no external scripts, stylesheets, images or fonts.
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:|//|file:)""", page)
    assert "<script" not in page and "@import" not in page
    assert "76_Gemm_Add_ReLU" in page and "reference only" in page


def test_missing_matplotlib_names_the_extra(root, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'kpair\[report\]'"):
        write_report(root)
    assert (root / "report.md").is_file()  # the markdown came first
    assert kpair(["report", str(root)]) == 4
    assert "kpair[report]" in capsys.readouterr().err
    assert kpair(["report", str(root), "--markdown-only"]) == 0


def test_report_needs_an_index(tmp_path):
    with pytest.raises(UsageError, match="kpair verify"):
        write_report(tmp_path)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_report_renders_in_headless_chromium(root, tmp_path):
    plt_image = pytest.importorskip("matplotlib.image")
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (CI: apt-get install -y chromium)")
    page = write_report(root, tmp_path / "out")["html"]
    shot = tmp_path / "shot.png"
    width, height = 1200, 1600
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", f"--window-size={width},{height}", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.is_file(), f"no screenshot; chromium said:\n{proc.stderr[-2000:]}"
    img = plt_image.imread(shot)
    assert img.shape[:2] == (height, width)
    rgb = (img[..., :3] * 255).round().astype(np.int16)
    assert rgb.std() > 10, "the page rendered blank"
    # The speedup bars are drawn: a good number of pixels in the bar colour.
    bar = np.all(np.abs(rgb - np.array(BAR_RGB)) <= 6, axis=-1)
    assert bar.sum() > 5000, f"only {bar.sum()} bar-coloured pixels"
    # ... as several separate horizontal bars (rows of bar pixels split by gaps).
    rows_with_bar = np.flatnonzero(bar.sum(axis=1) > 50)
    assert len(np.split(rows_with_bar, np.flatnonzero(np.diff(rows_with_bar) > 1) + 1)) >= 5
