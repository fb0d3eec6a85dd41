"""A self-contained HTML report of one or more results files, with matplotlib plots.

Per results file (one workload): a summary per solution, and, when the run was timed, three
plots: per-case latency bars and per-case speedup bars with the solutions side by side, and the
distribution (empirical CDF) of each solution's speedup over the case mix; where peers ran, a
fourth: each solution's speedup over the best peer of the same run, per case. Then a per-case table
with the solutions side by side, the failures, and the environment the numbers came from. A run
without timing (a CPU run) is said to be one, and shows statuses only.

Plots are embedded in the page as base64 PNG (the page needs no other file) and also written as
PNG files next to it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dsa_bench.files import check_output_path, starts_with, write_atomic
from dsa_bench.results.records import CaseRecord, LoadedResults, load_results, now_iso
from dsa_bench.results.roofline import roofline_rows
from dsa_bench.results.tables import summarize
from dsa_bench.solution import REFERENCE_SOLUTION

_FAILED_COLOR = "#c62828"
#: how the environment table names a results file's launch mode (its ``launch`` field)
LAUNCH_SHOWN = {"eager": "eager calls", "cuda_graph": "CUDA-graph replay (run --cuda-graph)"}


@dataclass
class ReportFigure:
    name: str  # unique within a report; used for the PNG file name
    title: str
    figure: Figure
    results: LoadedResults


def _solutions(records: list[CaseRecord]) -> list[str]:
    """Solution names in run order, the reference first."""
    names = list(dict.fromkeys(r.solution for r in records))
    return sorted(names, key=lambda n: n != REFERENCE_SOLUTION)


def _cases(records: list[CaseRecord]) -> list[str]:
    return list(dict.fromkeys(r.case for r in records))


def _literal(text: str) -> str:
    """``text`` for a matplotlib label: a ``$`` in a case or solution name would start math
    mode (and an unparsable formula raises at drawing time); escaped, it is shown as it is."""
    return text.replace("$", r"\$")


def _figure_width(n_cases: int) -> float:
    return min(max(8.0, 0.28 * n_cases + 2.5), 40.0)


def _grouped_bars(ax: Any, cases: list[str], series: dict[str, list[float]], failed: dict[str, list[bool]]) -> None:
    """One bar container per solution (labelled with its name), side by side within each case."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (solution, heights) in enumerate(series.items()):
        xs = [c + (i - (n - 1) / 2) * width for c in range(len(cases))]
        ax.bar(xs, heights, width=width, label=_literal(solution))
        bad = [x for x, f in zip(xs, failed[solution], strict=True) if f]
        if bad:
            ax.scatter(bad, [0] * len(bad), marker="x", color=_FAILED_COLOR, zorder=3, transform=ax.get_xaxis_transform(), clip_on=False)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([_literal(c) for c in cases], rotation=90, fontsize=7 if len(cases) > 40 else 8)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.grid(axis="y", alpha=0.3)


def _lookup(records: list[CaseRecord]) -> dict[tuple[str, str], CaseRecord]:
    return {(r.case, r.solution): r for r in records}


def latency_figure(results: LoadedResults) -> Figure:
    records = results.records
    cases, solutions, by_key = _cases(records), _solutions(records), _lookup(records)
    series: dict[str, list[float]] = {}
    failed: dict[str, list[bool]] = {}
    for s in solutions:
        rows = [by_key.get((c, s)) for c in cases]
        series[s] = [r.timing.mean_ms * 1000 if r is not None and r.passed and r.timing else math.nan for r in rows]
        failed[s] = [r is not None and r.failed for r in rows]
    fig = Figure(figsize=(_figure_width(len(cases)), 4.8), layout="constrained")
    ax = fig.add_subplot()
    _grouped_bars(ax, cases, series, failed)
    ax.set_yscale("log")
    ax.set_ylabel(_literal(f"latency, µs (mean of trial medians, {results.timer or 'untimed'})"))
    ax.set_title(_literal(f"{results.workload}: latency per case (lower is better; x = failed)"))
    ax.legend(loc="upper left", fontsize=8)
    return fig


def _per_case_bars(results: LoadedResults, value_of: Callable[[CaseRecord], float | None]) -> tuple[Figure, Any]:
    """A figure of grouped bars, one group per case and one bar per solution but the reference:
    ``value_of`` of each passed record (failed ones marked)."""
    records = results.records
    cases, by_key = _cases(records), _lookup(records)
    solutions = [s for s in _solutions(records) if s != REFERENCE_SOLUTION]
    series = {
        s: [(value_of(r) or math.nan) if r is not None and r.passed else math.nan for r in (by_key.get((c, s)) for c in cases)]
        for s in solutions
    }
    failed = {s: [(r := by_key.get((c, s))) is not None and r.failed for c in cases] for s in solutions}
    fig = Figure(figsize=(_figure_width(len(cases)), 4.8), layout="constrained")
    ax = fig.add_subplot()
    _grouped_bars(ax, cases, series, failed)
    return fig, ax


def speedup_figure(results: LoadedResults) -> Figure:
    fig, ax = _per_case_bars(results, lambda r: r.speedup)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="reference (1x)")
    ax.set_yscale("log")
    ax.set_ylabel("speedup over the reference (same run)")
    ax.set_title(_literal(f"{results.workload}: speedup per case (higher is better; x = failed)"))
    ax.legend(loc="upper left", fontsize=8)
    return fig


def peer_speedup_figure(results: LoadedResults) -> Figure:
    """Per case, each solution's speedup over the peer it is measured against (CaseRecord.peer)."""
    fig, ax = _per_case_bars(results, lambda r: r.peer_speedup)
    over = results.header.speedup_over
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label=_literal(f"{over or 'the fastest peer'} (1x)"))
    ax.set_ylabel(_literal(f"speedup over {over or 'the fastest peer that passed the case'} (same run)"))
    against = "the peer" if over is None else over
    ax.set_title(_literal(f"{results.workload}: speedup over {against} per case (higher is better; x = failed)"))
    ax.legend(loc="upper left", fontsize=8)
    return fig


def speedup_distribution_figure(results: LoadedResults) -> Figure:
    """Empirical CDF of each solution's speedup over the cases it passed, geomean marked."""
    solutions = [s for s in _solutions(results.records) if s != REFERENCE_SOLUTION]
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for s in solutions:
        values = [r.speedup for r in results.records if r.solution == s and r.passed and r.speedup]
        if not values:
            continue
        geomean = math.exp(sum(math.log(v) for v in values) / len(values))
        line = ax.ecdf(values, label=_literal(f"{s} (geomean {geomean:.2f}x, {len(values)} cases)"))
        ax.axvline(geomean, color=line.get_color(), linewidth=0.8, linestyle=":")
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("speedup over the reference")
    ax.set_ylabel("fraction of cases with speedup ≤ x")
    ax.set_title(_literal(f"{results.workload}: speedup distribution over the case mix"))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def roofline_figure(results: LoadedResults) -> Figure:
    """Per case, each solution's fraction of the roofline (CaseRecord.roofline), the reference's too;
    a hatched bar is nearer the compute bound, a plain one the memory bound."""
    records = results.records
    cases, solutions, by_key = _cases(records), _solutions(records), _lookup(records)
    series: dict[str, list[float]] = {}
    failed: dict[str, list[bool]] = {}
    for s in solutions:
        rows = [by_key.get((c, s)) for c in cases]
        series[s] = [100 * r.roofline.fraction_of_roofline if r is not None and r.passed and r.roofline else math.nan for r in rows]
        failed[s] = [r is not None and r.failed for r in rows]
    fig = Figure(figsize=(_figure_width(len(cases)), 4.8), layout="constrained")
    ax = fig.add_subplot()
    _grouped_bars(ax, cases, series, failed)
    for container, s in zip(ax.containers, solutions, strict=False):  # one bar container per solution, in order
        for bar, c in zip(container, cases, strict=True):
            r = by_key.get((c, s))
            if r is not None and r.roofline is not None and r.roofline.bound == "compute":
                bar.set_hatch("//")
    ax.axhline(100.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("% of the roofline (nearer bound)")
    ax.set_title(_literal(f"{results.workload}: fraction of the roofline per case (higher is better; hatched = compute bound, "
                          "plain = memory bound; x = failed)"))  # fmt: skip
    ax.legend(loc="upper left", fontsize=8)
    return fig


def _figure_plan(loaded: list[LoadedResults]) -> list[tuple[str, str, Any, LoadedResults]]:
    """(unique name, title, maker, results) of every plot the report will hold, none drawn yet."""
    plan = []
    used: set[str] = set()
    for results in loaded:
        if not results.timed:
            continue
        has_solutions = any(r.solution != REFERENCE_SOLUTION for r in results.records)
        makers = [("latency", "Latency per case", latency_figure)]
        if has_solutions:
            makers += [
                ("speedup", "Speedup per case", speedup_figure),
                ("speedup-distribution", "Speedup distribution", speedup_distribution_figure),
            ]
        if has_solutions and any(r.peer_speedup for r in results.records):
            makers.append(("peer-speedup", "Speedup over the best peer per case", peer_speedup_figure))
        if any(r.roofline is not None for r in results.records):
            makers.append(("roofline", "Fraction of the roofline per case", roofline_figure))
        for suffix, title, make in makers:
            name = base = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', results.workload)[:80]}-{suffix}"
            k = 2
            while name in used:
                name, k = f"{base}-{k}", k + 1
            used.add(name)
            plan.append((name, title, make, results))
    return plan


def build_figures(loaded: list[LoadedResults]) -> list[ReportFigure]:
    """The report's plots; results without timing get none."""
    return [ReportFigure(name, title, make(results), results) for name, title, make, results in _figure_plan(loaded)]


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 0.2rem; margin-top: 2.5rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.85rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: left; }
th { background: #f0f0f0; } td.num { text-align: right; }
.notice { background: #fff8e1; border-left: 4px solid #f9a825; padding: 0.5rem 1rem; }
.failed { color: #c62828; font-weight: 600; } .passed { color: #2e7d32; }
.plot { overflow-x: auto; margin: 1rem 0; } .plot img { max-width: none; height: 420px; }
.meta { color: #555; } pre { background: #f6f6f6; padding: 0.5rem; overflow-x: auto; }
"""


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="html", disable_numparse=True)


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1000:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _with_peer(results: LoadedResults) -> bool:
    return any(r.peer is not None for r in results.records)


def _summary_headers(results: LoadedResults) -> list[str]:
    headers = ["solution", "passed", "mean speedup (failed = 0)", "geomean speedup", "mean µs"]
    return headers + (["mean vs peer (failed = 0)", "geomean vs peer"] if _with_peer(results) else [])


def _summary_rows(results: LoadedResults) -> list[list[Any]]:
    rows = []
    for s in _solutions(results.records):
        summary = summarize(results.records, s)
        row = [s, f"{summary.passed}/{summary.total}", _x(summary.mean_speedup), _x(summary.geomean_speedup), _us(summary.mean_latency_ms)]
        if _with_peer(results):
            row += [_x(summary.mean_peer_speedup), _x(summary.geomean_peer_speedup)]
        rows.append(row)
    return rows


def _case_rows(results: LoadedResults) -> tuple[list[list[Any]], list[str]]:
    records = results.records
    cases, solutions, by_key = _cases(records), _solutions(records), _lookup(records)
    axes = list(dict.fromkeys(a for r in records for a in r.axes))
    headers = ["case", *axes]
    with_peer = _with_peer(results)
    for s in solutions:
        headers += [f"{s} status"] + ([f"{s} µs", f"{s} speedup"] if results.timed else []) + ([f"{s} vs peer"] if with_peer else [])
    rows = []
    for c in cases:
        first = next(r for r in records if r.case == c)
        row: list[Any] = [c, *[first.axes.get(a, "") for a in axes]]
        for s in solutions:
            r = by_key.get((c, s))
            row.append("-" if r is None else r.status.value)
            if results.timed:
                row += [_us(r.timing.mean_ms if r is not None and r.timing else None), _x(r.speedup if r is not None else None)]
            if with_peer:
                row.append("-" if r is None or r.peer_speedup is None else f"{r.peer_speedup:.2f}x ({r.peer})")
        rows.append(row)
    return rows, headers


def _environment_rows(results: LoadedResults) -> list[list[Any]]:
    header = results.header
    rows = [[key, value] for key, value in results.environment.written().items()]
    rows.append(["timer", results.timer or "none (correctness only)"])
    if results.l2_flush:
        rows.append(["L2 flush", results.l2_flush])
    if results.launch:
        rows.append(["launch", LAUNCH_SHOWN.get(results.launch, results.launch)])
    for key, value in (header.settings.written() if header.settings is not None else {}).items():
        if key == "tolerance" and isinstance(value, dict):  # atol, rtol, lse_atol, score_rtol
            value = ", ".join(f"{name}={tol:g}" if isinstance(tol, (int, float)) else f"{name}={tol!r}" for name, tol in value.items())
        rows.append([f"setting: {key}", value])
    for name, meta in (header.solutions or {}).items():
        rows.append([f"solution: {name}", f"{meta.path or ''} (sha256 {(meta.content_hash or '')[:16]}…)"])
    for name, note in (header.solution_notes or {}).items():
        rows.append([f"note: {name}", note])
    return rows


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _status_classes(table_html: str) -> str:
    """Colour status cells (tabulate's html escapes content but adds no classes)."""
    table_html = re.sub(r"<td>(PASSED)</td>", r'<td class="passed">\1</td>', table_html)
    return re.sub(r"<td>((?:INCORRECT_\w+|RUNTIME_ERROR|COMPILE_ERROR|TIMEOUT))</td>", r'<td class="failed">\1</td>', table_html)


def render_html(loaded: list[LoadedResults], figures: list[ReportFigure], pngs: dict[str, bytes]) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>dsa-bench report</title>',
        f"<style>{_CSS}</style></head><body>",
        "<h1>dsa-bench report</h1>",
        f'<p class="meta">generated {e(now_iso())} from {len(loaded)} results file(s)</p>',
    ]
    overview = [
        [
            r.path.name,
            r.workload,
            r.definition,
            f"{r.timer}, {r.l2_flush} L2 flush{', CUDA-graph replay' if r.launch == 'cuda_graph' else ''}" if r.timer else "untimed",
            r.environment.gpu or r.environment.device or "",
            len(r.records),
        ]
        for r in loaded
    ]
    parts.append(_table(overview, ["results file", "workload", "definition", "timer", "device", "records"]))
    for index, results in enumerate(loaded):
        parts.append(f'<section id="results-{index}"><h2>{e(results.workload)} <small class="meta">{e(results.definition)}</small></h2>')
        # a file without the field comes from before interrupted runs were kept: it is not called incomplete
        interrupted = not results.header.complete and "complete" in results.header.model_fields_set
        complete = " — <b>incomplete run (interrupted)</b>" if interrupted else ""
        parts.append(f'<p class="meta">{e(results.path.name)}, created {e(results.header.created or "?")}{complete}</p>')
        if not results.timed:
            parts.append(
                '<p class="notice">Nothing was timed in this run (correctness only, e.g. a CPU run without CUDA): '
                "the report shows statuses only.</p>"
            )
        parts.append("<h3>Summary</h3>")
        parts.append(
            _status_classes(
                _table(_summary_rows(results), _summary_headers(results))
            )
        )
        roofline_headers, roofline_rows_ = roofline_rows(results.records)
        if roofline_rows_:  # how close to the hardware, the timer and the host time per solution (docs/roofline.md)
            parts.append("<h3>Roofline and timer</h3>")
            parts.append(_table(roofline_rows_, roofline_headers))
        mine = [f for f in figures if f.results is results]
        if mine:
            parts.append("<h3>Plots</h3>")
            for fig in mine:
                data = base64.b64encode(pngs[fig.name]).decode()
                parts.append(
                    f'<figure class="plot"><img alt="{e(fig.title)}: {e(results.workload)}" data-figure="{e(fig.name)}" '
                    f'src="data:image/png;base64,{data}"><figcaption>{e(fig.title)}</figcaption></figure>'
                )
        rows, headers = _case_rows(results)
        parts.append("<h3>Cases</h3>")
        parts.append(_status_classes(_table(rows, headers)))
        failed = [r for r in results.records if r.failed]
        if failed:
            parts.append("<h3>Failures</h3><ul>")
            parts += [f"<li><b>{e(r.case)}</b> [{e(r.solution)}] {e(r.status.value)}<pre>{e(r.message)}</pre></li>" for r in failed]
            parts.append("</ul>")
        parts.append("<h3>Environment</h3>")
        parts.append(_table(_environment_rows(results), ["what", "value"]))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


_HTML_STARTS = (b"<!doctype html", b"<html")
_PNG_START = (b"\x89PNG\r\n\x1a\n",)


def write_report(results_paths: list[Path], output: Path) -> tuple[Path, list[Path]]:
    """Write the HTML report and its PNG plots (``<output stem>-<plot>.png`` next to it).

    Every output path is checked before anything is drawn: none may be one of the results
    files, and an existing file is replaced only if it is an HTML page (the report) or a PNG
    image (a plot). Each file is written atomically.
    """
    loaded = [load_results(p) for p in results_paths]
    check_output_path(output, "--output", "dsa-bench HTML report", lambda p: starts_with(p, _HTML_STARTS, skip_space=True), results_paths)
    plan = _figure_plan(loaded)
    png_paths = {name: output.parent / f"{output.stem}-{name}.png" for name, *_ in plan}
    for path in png_paths.values():
        check_output_path(path, "--output (a plot next to it)", "PNG image", lambda p: starts_with(p, _PNG_START), results_paths)
    figures = [ReportFigure(name, title, make(results), results) for name, title, make, results in plan]
    pngs = {f.name: _png(f.figure) for f in figures}
    for name, data in pngs.items():
        write_atomic(png_paths[name], data, "plot")
    write_atomic(output, render_html(loaded, figures, pngs), "report")
    return output, list(png_paths.values())
