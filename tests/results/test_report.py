"""`dsa-bench report`: the plots' series, and the HTML page as headless Chromium renders it."""

from __future__ import annotations

import base64
import io
import math
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import cli, run_cli
from matplotlib.container import BarContainer
from PIL import Image
from synthetic_results import write_results

from dsa_bench.definitions.status import Status
from dsa_bench.results.records import load_results
from dsa_bench.results.report import build_figures

LATENCIES = {
    "b1_p10": {"reference": 0.6, "triton": 0.05, "other": 0.3},
    "b4_p36": {"reference": 0.9, "triton": 0.09, "other": 0.45},
    "b31_p91": {"reference": 8.0, "triton": 0.4, "other": 2.0},
}
FAILED = {("b4_p36", "other"): Status.INCORRECT_INDICES}


@pytest.fixture
def timed_results(tmp_path) -> Path:
    return write_results(tmp_path / "indexer_h64.json", "indexer_h64", LATENCIES, failures=FAILED)


def _bars(ax) -> dict[str, list[float]]:
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers if isinstance(c, BarContainer)}


def test_plots_hold_the_expected_series(timed_results, tmp_path):
    results = load_results(timed_results)
    figures = {f.name: f.figure for f in build_figures([results])}
    assert list(figures) == ["indexer_h64-latency", "indexer_h64-speedup", "indexer_h64-speedup-distribution"]

    (ax,) = figures["indexer_h64-latency"].axes
    bars = _bars(ax)
    assert list(bars) == ["reference", "triton", "other"]  # the solutions side by side, reference first
    assert bars["reference"] == pytest.approx([600.0, 900.0, 8000.0])  # µs
    assert bars["triton"] == pytest.approx([50.0, 90.0, 400.0])
    assert bars["other"][0] == pytest.approx(300.0) and math.isnan(bars["other"][1])  # failed: no bar
    assert [t.get_text() for t in ax.get_xticklabels()] == list(LATENCIES)
    assert ax.get_yscale() == "log"

    (ax,) = figures["indexer_h64-speedup"].axes
    bars = _bars(ax)
    assert list(bars) == ["triton", "other"]  # the reference is the 1x line, not a series
    assert bars["triton"] == pytest.approx([12.0, 10.0, 20.0])
    assert bars["other"][0] == pytest.approx(2.0) and math.isnan(bars["other"][1]) and bars["other"][2] == pytest.approx(4.0)

    (ax,) = figures["indexer_h64-speedup-distribution"].axes
    curves = {line.get_label().split(" ")[0]: line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert sorted(curves) == ["other", "triton"]
    assert "geomean 13.39x, 3 cases" in curves["triton"].get_label()  # (12 · 10 · 20)^(1/3)
    assert sorted(set(curves["triton"].get_xdata()) - {-math.inf, math.inf}) == pytest.approx([10.0, 12.0, 20.0])
    assert "2 cases" in curves["other"].get_label()

    untimed = load_results(write_results(tmp_path / "cpu.json", "indexer_smoke", LATENCIES, timed=False))
    assert build_figures([untimed]) == []


class _Page(HTMLParser):
    """What a rendered page shows: tables (with their header cells), images, and text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = 0
        self.headers: list[str] = []
        self.images: list[dict[str, str]] = []
        self.text: list[str] = []
        self._in_th = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables += 1
        elif tag == "th":
            self._in_th = True
        elif tag == "img":
            self.images.append(dict(attrs))

    def handle_endtag(self, tag):
        if tag == "th":
            self._in_th = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_th:
            self.headers.append(data.strip())


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("DSA_BENCH_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required here (DSA_BENCH_REQUIRE_CHROMIUM is set) but not installed")
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium package)")
    return found


def _headless(chromium: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
        ]  # fmt: skip
        return subprocess.run([chromium, *flags, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_html_report_renders_in_chromium(timed_results, tmp_path):
    chromium = _chromium()
    cpu_results = tmp_path / "smoke.json"  # a real CPU run: correctness only, no timing
    proc = run_cli("run", "-w", "sparse_attention_smoke", "-s", "reference", "--save", str(cpu_results))
    assert proc.returncode == 0, proc.stderr
    page = tmp_path / "out" / "report.html"
    proc = cli("report", str(timed_results), str(cpu_results), "--output", str(page))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 plots" in proc.stdout
    pngs = sorted(p.name for p in page.parent.glob("*.png"))
    assert pngs == ["report-indexer_h64-latency.png", "report-indexer_h64-speedup-distribution.png", "report-indexer_h64-speedup.png"]

    rendered = _headless(chromium, "--dump-dom", page.as_uri())
    assert rendered.returncode == 0, rendered.stderr
    dom = _Page()
    dom.feed(rendered.stdout)
    # overview + per results file: summary, cases, environment; the timed file also its roofline and timer summary
    assert dom.tables == 1 + 4 + 3
    for header in ("results file", "solution", "passed", "geomean speedup", "triton µs", "triton speedup", "reference status",
                   "mean of roofline", "timer"):
        assert header in dom.headers, header
    text = " ".join(dom.text)
    assert "Nothing was timed in this run" in text and "sparse_attention_smoke" in text
    assert "INCORRECT_INDICES" in text and "NVIDIA H200" in text
    assert len(dom.images) == 3
    for image in dom.images:
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        data = base64.b64decode(image["src"][len(prefix) :])
        assert data == (page.parent / f"report-{image['data-figure']}.png").read_bytes()
        png = Image.open(io.BytesIO(data))
        assert png.format == "PNG" and png.width >= 600 and png.height >= 300

    shot = tmp_path / "shot.png"
    proc = _headless(chromium, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr
    pixels = Image.open(shot).convert("RGB")
    colors = pixels.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 100  # text, tables and plots, not a blank page
    white = sum(count for count, color in colors if color == (255, 255, 255))
    assert white < 0.95 * pixels.width * pixels.height


def test_the_environment_table_names_the_launch_mode(tmp_path):
    from dsa_bench.results.report import _environment_rows, render_html

    graph = load_results(write_results(tmp_path / "graph.json", "indexer_h64", LATENCIES, launch="cuda_graph"))
    eager = load_results(write_results(tmp_path / "eager.json", "indexer_h64", LATENCIES))
    untimed = load_results(write_results(tmp_path / "cpu.json", "indexer_h64", LATENCIES, timed=False))
    assert ["launch", "CUDA-graph replay (run --cuda-graph)"] in _environment_rows(graph)
    assert ["launch", "eager calls"] in _environment_rows(eager)
    assert not any(row[0] == "launch" for row in _environment_rows(untimed))
    page = render_html([graph, eager], [], {})
    assert page.count("cupti, clean L2 flush, CUDA-graph replay") == 1 and page.count("cupti, clean L2 flush") == 2
