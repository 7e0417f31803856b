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
from kpair.errors import BackendUnavailable, InputError
from kpair.report import render_markdown, write_report

#: The published-interval band colour of the speedup chart (report._BAR_BAND), 8-bit RGB.
BAND_RGB = (0xA7, 0xBE, 0xD7)


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


def test_the_report_sets_kpairs_choice_beside_inductors_own_tuning(tmp_path):
    from kpair.release.index import Baseline
    from kpair.report import render_html

    cd = "coordinate-descent"
    rows = [fake_row(2, "1_a", 1.30).replace(baselines=[
                Baseline(mode=cd, speedup=1.2, ci95=(1.19, 1.21)),
                Baseline(mode="max-autotune", speedup=1.0, ci95=(1.0, 1.0), same_as_ref=True)]),
            fake_row(2, "2_b", 1.10)]     # no baseline measured: not in that table
    refused = [fake_row(2, "3_c", status="fail").replace(
        refused_by="optimizer", baselines=[Baseline(mode=cd, reason="not built: ptxas")])]
    release.build_index(rows, refused).write(tmp_path / "index.json")
    index = release.load_index(tmp_path)
    md = render_markdown(index)
    assert "**Against Inductor's coordinate-descent config**: kpair's choice over it 1.0833x" \
        " (geomean over 1 operators); at least as fast on 1" in md
    table = md.split("## Against Inductor's own tuning")[1].split("## Reproduction")[0]
    assert "| operator | kpair | Inductor coordinate-descent | Inductor max-autotune |" in table
    assert "| level2/1_a | 1.300x [1.274, 1.326] | 1.200x | 1.000x (= ref) |" in table
    assert "| level2/3_c | 1.00x (ref kept) | — (not built: ptxas) | — |" in table
    assert "2_b" not in table
    page = render_html(index)
    assert "<h2>Against Inductor's own tuning</h2>" in page and "1.000x (= ref)" in page


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
    with pytest.raises(InputError, match="not a release") as e:   # as the CLI: exit 3
        write_report(tmp_path)
    assert e.value.exit_code == 3


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
    # The published intervals are drawn: pixels in the band colour ...
    band = np.all(np.abs(rgb - np.array(BAND_RGB)) <= 6, axis=-1)
    assert band.sum() > 300, f"only {band.sum()} band-coloured pixels"
    # ... as several separate horizontal bands (rows of band pixels split by gaps).
    rows_with_band = np.flatnonzero(band.sum(axis=1) > 5)
    assert len(np.split(rows_with_band, np.flatnonzero(np.diff(rows_with_band) > 1) + 1)) >= 5


def _verified_root(tmp_path):
    """A release verified twice: one operator reproduced then not, one re-captured with
    another ref (a different operator)."""
    from kpair.release.index import RefIdentity, latest, verified_row, verify_run

    ident = RefIdentity(sha256="ab" * 32, kernel="k", grid=(8, 1, 1), block=(128, 1, 1),
                        dynamic_shared_bytes=0)

    def rerun(speedup, **changes):
        row = fake_row(1, "x", speedup).replace(ref_identity=ident.replace(**changes),
                                                verified="2027-01-02T00:00:00+00:00")
        return row.replace(device="other gpu")

    a = fake_row(1, "1_Square_matrix_multiplication_", 2.0).replace(ref_identity=ident)
    b = fake_row(1, "23_Softmax", 1.5).replace(ref_identity=ident)
    a = verified_row(a, rerun(2.01), run=1)
    b = verified_row(b, rerun(1.5, grid=(16, 1, 1)), run=1)
    first = verify_run(1, "2027-01-02T00:00:00+00:00", [latest(a), latest(b)])
    a = verified_row(a, rerun(3.0), run=2)
    second = verify_run(2, "2027-01-03T00:00:00+00:00", [latest(a)])
    release.build_index([a, b], [], [first, second]).write(tmp_path / "index.json")
    return tmp_path


def test_report_shows_every_verification_against_the_published_interval(tmp_path):
    root = _verified_root(tmp_path)
    md = render_markdown(release.load_index(root))
    section = md.split("## Reproduction")[1].split("## Excluded")[0]
    assert "| 1 | 2027-01-02T00:00:00+00:00 | other gpu, host/x86_64 | 1 of 1 (100%); " \
           "1 different operator |" in section
    assert "| 2 | 2027-01-03T00:00:00+00:00 | other gpu, host/x86_64 | 0 of 1 (0%) |" in section
    op = "level1/1_Square_matrix_multiplication_ | 2.000x [1.960, 2.040]"
    assert f"| {op} | 1 | 2027-01-02T00:00:00+00:00 | other gpu, host/x86_64 | " \
           "2.010x [1.970, 2.050] | yes | yes | reproduced |" in section
    assert f"| {op} | 2 |" in section and "| 3.000x [2.940, 3.060] | no | no | " \
        "not reproduced |" in section
    assert "| different operator (grid: 8x1x1 -> 16x1x1) |" in section
    assert "Reproduced (last verification)**: 0 of 1 (0%)" in md
    # An unverified release says so.
    assert "Not verified since publication" in render_markdown(
        release.build_index([fake_row(1, "a", 1.2)], []))


def test_html_report_has_the_reproduction_section(tmp_path):
    pytest.importorskip("matplotlib")
    page = write_report(_verified_root(tmp_path))["html"].read_text()
    section = page.split("<h2>Reproduction</h2>")[1].split("<h2>Excluded")[0]
    assert "1 of 1 (100%)" in section and "0 of 1 (0%)" in section
    assert '<td class="pass">reproduced</td>' in section
    assert '<td class="fail">not reproduced</td>' in section
    assert "different operator (grid: 8x1x1 -&gt; 16x1x1)" in section


def _segments(ax, colour: str) -> list:
    """The interval segments the chart drew in ``colour`` (one LineCollection per series)."""
    from matplotlib.colors import to_rgba

    return [seg for c in ax.collections if hasattr(c, "get_segments")
            and len(c.get_colors()) and tuple(c.get_colors()[0]) == to_rgba(colour)
            for seg in c.get_segments()]


def test_the_speedup_chart_is_intervals_around_one_on_a_log_axis(root):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kpair import report

    index = release.load_index(root)
    rows = report.speedup_rows(index)
    assert [r.label for r in rows] == [report._label(r) for r in index.passing]
    assert all(r.verified is None for r in rows)         # never verified
    fig = report.speedup_figure(index)
    try:
        (ax,) = fig.axes
        assert ax.get_xscale() == "log"
        lo, hi = ax.get_xlim()
        assert lo < 0.93 * 0.98 and hi > 4.09 * 1.02 and lo > 0.5  # no bar from 0
        published = _segments(ax, report._BAR_BAND)
        assert len(published) == len(index.passing) == 5
        assert _segments(ax, report._VERIFIED_BAND) == []
        # Each segment spans its operator's reported interval.
        spans = sorted((round(s[0][0], 6), round(s[1][0], 6)) for s in published)
        assert spans == sorted((round(r.published[1], 6), round(r.published[2], 6))
                               for r in rows)
    finally:
        plt.close(fig)


def test_a_verified_release_draws_both_intervals_side_by_side(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kpair import report

    index = release.load_index(_verified_root(tmp_path))
    rows = report.speedup_rows(index)
    assert [(r.published, r.verified, r.verified_outcome) for r in rows] == [
        ((2.0, 1.96, 2.04), (3.0, 2.94, 3.06), "not reproduced"),
        ((1.5, 1.47, 1.53), (1.5, 1.47, 1.53), "different operator")]
    fig = report.speedup_figure(index)
    try:
        (ax,) = fig.axes
        assert ax.get_xscale() == "log"
        published = _segments(ax, report._BAR_BAND)
        verified = _segments(ax, report._VERIFIED_BAND)
        assert len(published) == len(verified) == 2      # N operators x 2 intervals
        assert sorted(s[0][0] for s in verified) == pytest.approx([1.47, 2.94])
        # Side by side: each re-run just below its publication, not on top of it.
        for p, v in zip(sorted(published, key=lambda s: s[0][1]),
                        sorted(verified, key=lambda s: s[0][1]), strict=True):
            assert 0 < p[0][1] - v[0][1] < 0.5
        assert "re-verified" in ax.get_title()
    finally:
        plt.close(fig)
    page = write_report(tmp_path)["html"].read_text()
    assert page.count("<svg") == 2 and "last <code>kpair verify</code>" in page
