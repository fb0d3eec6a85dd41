"""Baselines of per-case speedups, and comparing a run's results against them.

What is compared is each case's *speedup over the reference measured in the same run*, not its
latency: a ratio of two latencies taken on the same machine minutes apart, which survives clock,
driver and machine-to-machine differences far better than absolute times.

Classification of one (workload, case, solution), with ``threshold`` (default 5 %):

- **failed**: the new status is not PASSED (*newly failing* when the baseline had it PASSED);
- **fixed**: the baseline had it failing and it now passes;
- **untimed**: either side has no speedup (a CPU run, or the reference failed);
- otherwise ``ratio = new speedup / baseline speedup`` and the noise band
  ``band = max(threshold, ½·(s_sol,new + s_ref,new + s_sol,base + s_ref,base))``, where each ``s``
  is a recorded trial spread ((max - min) / mean of the trial medians) of the solution or the
  reference on that case. Half a spread bounds how far a latency's mean may sit from its
  trials' centre, and the four relative errors add up in a ratio of ratios, so the band is a
  worst-case bound on the noise; it never drops below the threshold.
  **slower** when ``ratio < 1 - band``, **faster** when ``ratio > 1 + band``, else **same**.

Per (workload, solution), the geometric mean of the ratios over the cases timed on both sides is
judged the same way against ``max(threshold, sqrt(Σ noise_i²) / N)``, with ``noise_i`` the
case's ½-sum of spreads: independent per-case noise averages out over N cases, so a solution-wide
slowdown is caught even where a noisy reference makes every single case's band wide.

A comparison fails (non-zero exit) on any slower case, any solution slower overall, or any newly
failing case. The speedup over the best peer of the same run (``peer_speedup``) is shown beside
it, baseline and now, but never judged: it moves with the peers' own code and packages. Cases
only in the baseline (not run) or only in the results (no baseline yet) are
listed but never fail it.

Baseline file (``baselines/<gpu>.json``)::

    {"format": "dsa-bench-baseline", "version": 1, "updated": "...",
     "workloads": {"indexer_h64": {"definition": ..., "results_created": ..., "results_file": ...,
                                   "timer": ..., "l2_flush": ..., "launch": ..., "settings": {...}, "environment": {...},
                                   "solutions": {"triton": {"content_hash": ...}, ...},
                                   "cases": [{"case", "solution", "status", "speedup",
                                              "latency_ms", "spread", "reference_latency_ms",
                                              "reference_spread"}, ...]}}}
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.results.baseline import CaseMeasure, Key, baseline_measures, measures_of
from dsa_bench.results.records import (
    LoadedResults,
    RecordedSettings,
    recorded_l2_flush,
    recorded_launch,
    refuse_redacted,
    refuse_secret_mix,
)
from dsa_bench.solution import REFERENCE_SOLUTION

DEFAULT_THRESHOLD = 0.05


class Verdict(str, enum.Enum):
    FASTER = "faster"
    SAME = "same"
    SLOWER = "slower"
    FAILED = "failed"
    FIXED = "fixed"
    UNTIMED = "untimed"


@dataclass(frozen=True)
class CaseComparison:
    key: Key
    verdict: Verdict
    baseline: CaseMeasure
    new: CaseMeasure
    ratio: float | None = None  # new speedup / baseline speedup
    noise: float | None = None  # the recorded noise of that ratio: ½ · (sum of the four spreads)
    band: float | None = None  # the band the ratio was judged against: max(threshold, noise)
    latency_ratio: float | None = None  # baseline latency / new latency: set when it decided (same GPU model)
    latency_band: float | None = None  # the band it was judged against: max(threshold, ½ · both runs' spreads)

    @property
    def newly_failing(self) -> bool:
        return self.verdict is Verdict.FAILED and self.baseline.passed


def ratio_noise(baseline: CaseMeasure, new: CaseMeasure) -> float:
    """Worst-case relative error of a speedup ratio from the four latencies' recorded spreads."""
    spreads = [baseline.spread, baseline.reference_spread, new.spread, new.reference_spread]
    return 0.5 * sum(s for s in spreads if s is not None)


def _judge(ratio: float, band: float) -> Verdict:
    return Verdict.SLOWER if ratio < 1 - band else Verdict.FASTER if ratio > 1 + band else Verdict.SAME


def classify(key: Key, baseline: CaseMeasure, new: CaseMeasure, threshold: float, same_gpu: bool = False) -> CaseComparison:
    """Verdict of one (case, solution).

    Across GPU models the speedup over the same-run reference is the only comparable measure.
    On the same GPU model the solution's own latency decides instead: the PyTorch reference is
    host-bound, so its latency (the speedup's numerator) drifts with the host CPU from machine
    to machine far more than its trial spread shows (13 % between two H200 machines, see
    benchmarks/README.md), while a GPU-bound solution's latency repeats within 0.4 %. The
    reference itself is always judged by its (trivial) speedup: it is the yardstick, not under test.
    """
    if Status.SKIPPED.value in (new.status, baseline.status):  # a peer this machine cannot run: nothing to compare
        return CaseComparison(key, Verdict.UNTIMED, baseline, new)
    if not new.passed:
        return CaseComparison(key, Verdict.FAILED, baseline, new)
    if not baseline.passed:
        return CaseComparison(key, Verdict.FIXED, baseline, new)
    if not new.speedup or not baseline.speedup:
        return CaseComparison(key, Verdict.UNTIMED, baseline, new)
    ratio = new.speedup / baseline.speedup
    noise = ratio_noise(baseline, new)
    band = max(threshold, noise)
    if same_gpu and new.latency_ms and baseline.latency_ms and key[2] != REFERENCE_SOLUTION:
        latency_ratio = baseline.latency_ms / new.latency_ms
        own_band = max(threshold, 0.5 * ((new.spread or 0.0) + (baseline.spread or 0.0)))
        return CaseComparison(key, _judge(latency_ratio, own_band), baseline, new, ratio, noise, band, latency_ratio, own_band)
    return CaseComparison(key, _judge(ratio, band), baseline, new, ratio, noise, band)


@dataclass(frozen=True)
class SolutionComparison:
    """One solution on one workload over all cases timed on both sides.

    Per-case noise is mostly independent from case to case, so the geometric mean of the
    ratios is far better determined than any single case: its band is
    ``max(threshold, sqrt(Σ noise_i²) / N)``. This catches a solution-wide slowdown that each
    case's own band (wide when the reference is noisy) would let through.
    """

    workload: str
    solution: str
    cases: int  # timed on both sides
    geomean_ratio: float  # of the speedup ratios, or of the latency ratios when ``metric`` is "latency"
    band: float
    verdict: Verdict
    metric: str = "speedup"


def summarize_solution(workload: str, solution: str, cases: list[CaseComparison], threshold: float) -> SolutionComparison | None:
    timed = [(c.ratio, c.noise, c) for c in cases if c.ratio is not None and c.noise is not None]
    if not timed:
        return None
    geomean = math.exp(statistics.fmean(math.log(ratio) for ratio, _, _ in timed))
    band = max(threshold, math.sqrt(sum(noise**2 for _, noise, _ in timed)) / len(timed))
    metric = "speedup"
    latency_ratios = [c.latency_ratio for _, _, c in timed if c.latency_ratio is not None]
    if len(latency_ratios) == len(timed):  # same GPU model: the latency decides (see classify)
        metric = "latency"
        geomean = math.exp(statistics.fmean(math.log(r) for r in latency_ratios))
        noise = [0.5 * ((c.new.spread or 0.0) + (c.baseline.spread or 0.0)) for _, _, c in timed]
        band = max(threshold, math.sqrt(sum(x**2 for x in noise)) / len(timed))
    return SolutionComparison(workload, solution, len(timed), geomean, band, _judge(geomean, band), metric)


@dataclass
class Comparison:
    threshold: float
    cases: list[CaseComparison] = field(default_factory=list)
    only_in_baseline: list[Key] = field(default_factory=list)
    only_in_results: list[Key] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    code_changed: dict[tuple[str, str], bool | None] = field(default_factory=dict)  # (workload, solution)
    solutions: list[SolutionComparison] = field(default_factory=list)
    timed: bool = False  # some results file holds timings (a CPU run holds none)

    @property
    def nothing_timed(self) -> bool:
        """No speedup was compared: the results (or the baseline) hold no timing, so only statuses were."""
        return not any(c.ratio is not None for c in self.cases)

    @property
    def slower(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict is Verdict.SLOWER]

    @property
    def newly_failing(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.newly_failing]

    @property
    def slower_solutions(self) -> list[SolutionComparison]:
        return [s for s in self.solutions if s.verdict is Verdict.SLOWER]

    @property
    def ok(self) -> bool:
        return not self.slower and not self.newly_failing and not self.slower_solutions


def compare_results(
    results: list[LoadedResults], baseline: dict[str, Any], threshold: float = DEFAULT_THRESHOLD, baseline_name: str = "the baseline"
) -> Comparison:
    """Match results against a baseline by (workload, case, solution) and classify every match.
    Secret (contest) results are compared only with a baseline made from secret results, and
    public with public: the two judge different inputs."""
    if not 0 <= threshold < 1:
        raise DsaBenchError(f"threshold {threshold} must be a fraction in [0, 1), e.g. 0.05 for 5 %")
    comparison = Comparison(threshold)
    base = baseline_measures(baseline)
    seen_workloads: set[str] = set()
    for res in results:
        block = baseline["workloads"].get(res.workload)
        if block is None:
            known = ", ".join(sorted(baseline["workloads"])) or "(none)"
            raise DsaBenchError(f"the baseline has no workload {res.workload!r} (it holds: {known})", str(res.path))
        if res.workload in seen_workloads:
            raise DsaBenchError(f"workload {res.workload!r} appears in two results files", str(res.path))
        seen_workloads.add(res.workload)
        refuse_redacted(res, "compare")
        refuse_secret_mix(res, block.get("secret"), f"{baseline_name}'s entry for {res.workload!r}", block.get("results_file"))
        comparison.warnings += _environment_warnings(res, block) + _code_warnings(res, block)
        comparison.timed = comparison.timed or res.timer is not None
        gpu = res.environment.gpu
        same_gpu = gpu is not None and gpu == (block.get("environment") or {}).get("gpu")
        new = measures_of(res)
        for key, measure in new.items():
            if key in base:
                comparison.cases.append(classify(key, base[key], measure, threshold, same_gpu))
            else:
                comparison.only_in_results.append(key)
        comparison.only_in_baseline += [k for k in base if k[0] == res.workload and k not in new]
        hashes = block.get("solutions") or {}
        for name, meta in (res.header.solutions or {}).items():
            old = (hashes.get(name) or {}).get("content_hash")
            comparison.code_changed[(res.workload, name)] = None if old is None else old != meta.content_hash
    groups: dict[tuple[str, str], list[CaseComparison]] = {}
    for c in comparison.cases:
        groups.setdefault((c.key[0], c.key[2]), []).append(c)
    for (workload, solution), items in groups.items():
        summary = summarize_solution(workload, solution, items, threshold)
        if summary is not None:
            comparison.solutions.append(summary)
    skipped = Status.SKIPPED.value
    untimed = sum(1 for c in comparison.cases if c.verdict is Verdict.UNTIMED and skipped not in (c.new.status, c.baseline.status))
    if untimed and not comparison.nothing_timed:
        comparison.warnings.append(
            f"{untimed} case(s) have no speedup on one side (a CPU run, or the reference failed): only their statuses were compared"
        )
    return comparison


def _environment_warnings(results: LoadedResults, block: dict[str, Any]) -> list[str]:
    warnings = []
    old_env, new_env = block.get("environment") or {}, results.environment
    if old_env.get("gpu") != new_env.gpu:
        warnings.append(
            f"{results.workload}: baseline GPU {old_env.get('gpu')!r}, results GPU {new_env.gpu!r}; speedups may shift across GPUs"
        )
    if block.get("timer") != results.timer:
        warnings.append(f"{results.workload}: baseline timer {block.get('timer')!r}, results timer {results.timer!r}")
    baseline_flush = recorded_l2_flush(block)
    if baseline_flush != results.l2_flush:
        warnings.append(
            f"{results.workload}: baseline L2 flush {baseline_flush!r}, results L2 flush {results.l2_flush!r}; "
            "a dirty flush also charges each call for writing back the flush's lines"
        )
    baseline_launch = recorded_launch(block)
    if baseline_launch != results.launch:
        warnings.append(
            f"{results.workload}: baseline launch {baseline_launch!r}, results launch {results.launch!r}; "
            "a CUDA-graph replay (run --cuda-graph) leaves out the host launch gaps an eager call pays for"
        )
    old_settings, new_settings = block.get("settings") or {}, results.header.settings or RecordedSettings()
    for key in ("iterations", "trials", "warmup", "input_sets", "reference_protocol"):
        if old_settings.get(key) != getattr(new_settings, key):
            warnings.append(
                f"{results.workload}: setting {key} was {old_settings.get(key)!r} in the baseline, {getattr(new_settings, key)!r} now"
            )
    # the baseline block is a dict (its model checks it); the results' tolerances as their file holds them
    old_tolerance = old_settings.get("tolerance") or {}
    new_tolerance = new_settings.tolerance.model_dump(exclude_unset=True) if new_settings.tolerance is not None else {}
    for key in sorted((set(old_tolerance) | set(new_tolerance)) & set(_tolerances_read(results.definition))):
        if old_tolerance.get(key) != new_tolerance.get(key):
            warnings.append(
                f"{results.workload}: tolerance {key} was {old_tolerance.get(key)!r} in the baseline, {new_tolerance.get(key)!r} now; "
                "statuses are judged differently (run --atol/--rtol/--lse-atol/--score-rtol set them)"
            )
    return warnings


def _by_solution(keys: list[Key], shown: int = 3) -> list[str]:
    """One line per (workload, solution): its cases, the first few named."""
    groups: dict[tuple[str, str], list[str]] = {}
    for workload, case, solution in keys:
        groups.setdefault((workload, solution), []).append(case)
    return [
        f"{workload} [{solution}]: {len(cases)} case(s): {', '.join(cases[:shown])}{', ...' if len(cases) > shown else ''}"
        for (workload, solution), cases in groups.items()
    ]


def _tolerances_read(definition: str) -> tuple[str, ...]:
    """The tolerances that can change a status of this definition (a dataset's unknown one: all)."""
    from dsa_bench.definitions import all_definitions
    from dsa_bench.definitions.base import Tolerance

    known = all_definitions().get(definition)
    return known.tolerance_fields if known is not None else tuple(f.name for f in dataclasses.fields(Tolerance))


def _code_warnings(results: LoadedResults, block: dict[str, Any]) -> list[str]:
    """Solutions whose code is not the baseline's: a change in speed may be the code's, not the machine's."""
    warnings = []
    hashes = block.get("solutions") or {}
    for name, meta in (results.header.solutions or {}).items():
        old, now = (hashes.get(name) or {}).get("content_hash"), meta.content_hash
        if old is not None and now is not None and old != now:
            warnings.append(
                f"{results.workload}: solution {name!r} is not the baseline's code (content hash {old[:12]} there, {now[:12]} now); "
                "refresh the baseline with `dsa-bench baseline update` once the new code is the one to beat"
            )
    return warnings


def _pct(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}%" if signed else f"{100 * value:.1f}%"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _geomean(values: list[float | None]) -> float | None:
    """Geometric mean of the peer speedups present (None: no case has one)."""
    present = [v for v in values if v]
    return math.exp(statistics.fmean(math.log(v) for v in present)) if present else None


def _vs_peer(measure: CaseMeasure) -> str:
    return "-" if measure.peer_speedup is None else f"{measure.peer_speedup:.2f}x ({measure.peer})"


def render_comparison(comparison: Comparison, fmt: str = "table", show_all: bool = False) -> str:
    """Summary per (workload, solution), then the cases that are not 'same' (all with ``show_all``)."""
    from tabulate import tabulate

    if fmt not in ("table", "markdown"):
        raise DsaBenchError(f"--format {fmt!r}: choose table or markdown")
    tablefmt = "github" if fmt == "markdown" else "simple"
    heading = (lambda text: f"### {text}\n") if fmt == "markdown" else (lambda text: text)
    out: list[str] = []

    groups: dict[tuple[str, str], list[CaseComparison]] = {}
    for c in comparison.cases:
        groups.setdefault((c.key[0], c.key[2]), []).append(c)
    rows = []
    overall = {(s.workload, s.solution): s for s in comparison.solutions}
    for (workload, solution), items in groups.items():
        counts = {v: sum(1 for c in items if c.verdict is v) for v in Verdict}
        summary = overall.get((workload, solution))
        geomean = (
            "-"
            if summary is None
            else f"{summary.metric} {_pct(summary.geomean_ratio - 1)} ± {_pct(summary.band, signed=False)}: {summary.verdict.value}"
        )
        changed = comparison.code_changed.get((workload, solution))
        rows.append([
            workload, solution, len(items), counts[Verdict.FASTER], counts[Verdict.SAME], counts[Verdict.SLOWER],
            f"{counts[Verdict.FAILED]} ({sum(1 for c in items if c.newly_failing)} new)", counts[Verdict.FIXED],
            counts[Verdict.UNTIMED], geomean, {True: "yes", False: "no", None: "?"}[changed],
            _x(_geomean([c.baseline.peer_speedup for c in items])), _x(_geomean([c.new.peer_speedup for c in items])),
        ])  # fmt: skip
    headers = [
        "workload",
        "solution",
        "cases",
        "faster",
        "same",
        "slower",
        "failed",
        "fixed",
        "untimed",
        "geomean change ± band",
        "code changed",
        "vs peer, baseline",
        "vs peer, now",
    ]
    out.append(heading(f"Speedup vs baseline (threshold {_pct(comparison.threshold, signed=False)})"))
    out.append(tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True))

    skipped = [c for c in comparison.cases if c.verdict is Verdict.UNTIMED and Status.SKIPPED.value in (c.new.status, c.baseline.status)]
    # an untimed case whose status did not change is no change (a CPU run would list every case)
    unchanged = {Verdict.SAME} | ({Verdict.UNTIMED} if not show_all else set())
    shown = [
        c for c in comparison.cases
        if c not in skipped and (show_all or c.verdict not in unchanged or c.baseline.status != c.new.status)
    ]  # fmt: skip
    if shown:
        out.append("")
        out.append(heading("Cases" if show_all else "Cases that changed"))
        detail = [
            [
                c.key[0], c.key[1], c.key[2], c.verdict.value + (" (new)" if c.newly_failing else ""),
                _x(c.baseline.speedup), _x(c.new.speedup), _pct(None if c.ratio is None else c.ratio - 1),
                _pct(c.band, signed=False) if c.band is not None else "-",
                "-" if c.latency_ratio is None else f"{_pct(c.latency_ratio - 1)} ± {_pct(c.latency_band, signed=False)}",
                c.baseline.status if c.baseline.status == c.new.status else f"{c.baseline.status} -> {c.new.status}",
                _x(c.baseline.peer_speedup), _vs_peer(c.new),
            ]
            for c in sorted(shown, key=lambda c: (c.key[0], c.key[2], c.ratio if c.ratio is not None else -1, c.key[1]))
        ]  # fmt: skip
        headers = [
            "workload", "case", "solution", "verdict", "baseline", "now", "change", "noise band", "latency change (decides)", "status",
            "vs peer, baseline", "vs peer, now",
        ]  # fmt: skip
        out.append(tabulate(detail, headers=headers, tablefmt=tablefmt, disable_numparse=True))

    if skipped:
        out.append("")
        out.append("Skipped (a solution that cannot run where one side ran: nothing to compare):")
        out += [f"  {line}" for line in _by_solution([c.key for c in skipped])]
    for title, keys in (("In the baseline but not run", comparison.only_in_baseline), ("Not in the baseline", comparison.only_in_results)):
        if keys:
            out.append("")
            out.append(f"{title} ({len(keys)}):")
            out += [f"  {line}" for line in _by_solution(keys)]
    for warning in comparison.warnings:
        out.append("")
        out.append(f"warning: {warning}")
    out.append("")
    slower, new_fail, overall_slower = len(comparison.slower), len(comparison.newly_failing), comparison.slower_solutions
    if comparison.ok and comparison.nothing_timed:
        why = "the baseline holds none" if comparison.timed else "the results hold no timing: a run without CUDA checks correctness only"
        out.append(
            f"NOTHING TIMED: no case has a speedup on both sides ({why}); the statuses of {len(comparison.cases)} cases were compared, "
            "none newly failing. Compare a timed run (on a GPU) to judge speed."
        )
    elif comparison.ok:
        out.append(f"OK: {len(comparison.cases)} cases compared, none slower beyond the noise band, none newly failing")
    else:
        names = ", ".join(f"{s.workload}/{s.solution}" for s in overall_slower) or "none"
        out.append(
            f"REGRESSION: {slower} case(s) slower beyond the noise band, {new_fail} newly failing, solutions slower overall: {names}"
        )
    if fmt == "markdown":
        out[-1] = f"**{out[-1]}**"
    return "\n".join(out)
