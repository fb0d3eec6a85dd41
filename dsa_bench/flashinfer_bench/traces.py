"""A results file as flashinfer-bench traces (``dsa-bench export RESULTS --format flashinfer-bench``).

One Trace JSON line per record, in flashinfer-bench's schema (0.1.2, ``data/trace.py``)::

    {"definition": ..., "solution": ...,
     "workload": {"uuid": <case id>, "axes": {<variable axes>}, "inputs": {<name>: {"type": "random" | "scalar" | "safetensors", ...}}},
     "evaluation": {"status": ..., "environment": {"hardware": ..., "libs": {...}}, "timestamp": ..., "log": ...,
                    "correctness": {"max_relative_error", "max_absolute_error", "extra"},
                    "performance": {"latency_ms", "reference_latency_ms", "speedup_factor"}}}

What the schema cannot hold is mapped (docs/flashinfer_bench.md has the table):

- statuses: INCORRECT_INDICES becomes INCORRECT_NUMERICAL and TIMING_SUSPECT becomes RUNTIME_ERROR
  (the schema allows correctness only for PASSED and INCORRECT_NUMERICAL); the dsa-bench status
  opens the log and, where correctness is allowed, is ``correctness.extra.dsa_bench_status``. A
  SKIPPED record was not run: it gets no trace.
- the solution is named as ``pack`` names its JSON (``<solution>_<definition>``); a solution run
  from a packed JSON keeps that JSON's name.
- performance: ``latency_ms`` is dsa-bench's latency (the mean of the trial medians),
  ``reference_latency_ms`` the reference's on the same case, ``speedup_factor`` the recorded
  speedup; 0 where nothing was measured (a run without CUDA, a failed reference).
- errors: as recorded; one dsa-bench did not measure (index outputs) is 0 in a passed case and
  NaN in a failed one. NaN and infinities are written as flashinfer-bench writes them ("NaN", "Infinity").
- inputs: random, scalar and safetensors inputs as the trace gives them (safetensors paths relative
  to the dataset root, or to the trace's folder); explicit values cannot be described and are left
  out, and random inputs' generator parameters are dropped: the log names both.
- timer, L2 flush, settings, tolerances, seeds, trial medians and spread, the solution's content
  hash and the message: lines of ``evaluation.log``.
- the roofline (docs/roofline.md), the host wall time per call and the timer: ``correctness.extra``
  (the schema's one open field; its Performance takes no other fields) as ``dsa_bench_roofline``,
  ``dsa_bench_host_latency_ms`` and ``dsa_bench_timer`` (with ``dsa_bench_timer_fallback`` where CUPTI
  was unavailable), and a log line each.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_output_path, read_jsonl, write_atomic
from dsa_bench.flashinfer_bench.dataset import load_dataset_workload
from dsa_bench.results.records import CaseRecord, LoadedResults, SolutionHeader, load_results
from dsa_bench.solution import REFERENCE_SOLUTION
from dsa_bench.workloads import TOLERANCES, Case, Workload, load_workload

#: dsa-bench status -> flashinfer-bench EvaluationStatus (None: no trace; the record was not run).
FLASHINFER_STATUS: dict[str, str | None] = {
    "PASSED": "PASSED",
    "INCORRECT_SHAPE": "INCORRECT_SHAPE",
    "INCORRECT_DTYPE": "INCORRECT_DTYPE",
    "INCORRECT_NUMERICAL": "INCORRECT_NUMERICAL",
    "INCORRECT_INDICES": "INCORRECT_NUMERICAL",  # wrong output values; the schema has no status for wrong indices
    "RUNTIME_ERROR": "RUNTIME_ERROR",
    "COMPILE_ERROR": "COMPILE_ERROR",
    "TIMEOUT": "TIMEOUT",
    "TIMING_SUSPECT": "RUNTIME_ERROR",  # correct outputs, impossible times: no valid performance to report
    "SKIPPED": None,
}


#: the environment entries that go into ``environment.libs`` (the schema's library versions)
_LIBS = ("dsa_bench", "python", "torch", "triton", "cuda", "cupti_python", "driver")


@dataclass
class TraceExport:
    """The traces of one results file, and what could not go in."""

    traces: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # "case [solution]: why"
    #: the run's inputs (workload file, trace, blobs) and input folders (a dataset): never overwritten
    inputs: list[Path] = field(default_factory=list)
    input_folders: list[Path] = field(default_factory=list)


def _number(value: float) -> float | str:
    """A float as flashinfer-bench writes it (``ser_json_inf_nan="strings"``): JSON has no NaN or infinity."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _recorded_workload(results: LoadedResults, root: Path) -> tuple[Workload, Path]:
    """The workload the results were run on, read again for its cases' inputs, and the folder its
    safetensors paths are relative to (the dataset's root, or the trace's folder)."""
    header = results.header.workload

    def at(recorded: str) -> Path:
        path = Path(recorded)
        return path if path.is_absolute() else root / path

    try:
        if header.dataset:
            selector = str(at(header.trace)) if header.trace else header.definition
            workload = load_dataset_workload(at(header.dataset), selector)
            base = at(header.dataset)
        elif header.path:
            workload = load_workload(at(header.path))
            base = workload.trace_path.parent if workload.trace_path is not None else root
        else:
            raise DsaBenchError("workload.path: the results name no workload file")
    except DsaBenchError as exc:
        problem = f"export reads the workload of the run again for its cases' inputs, and cannot: {exc}"
        raise DsaBenchError(problem, str(results.path)) from None
    if workload.definition.name != results.definition:
        raise DsaBenchError(
            f"the workload now runs {workload.definition.name!r}, but the results were run on {results.definition!r}", str(results.path)
        )
    return workload, base.resolve()


def _inputs(case: Case, base: Path) -> tuple[dict[str, Any], list[str]]:
    """The case's inputs as flashinfer-bench describes them, and what it cannot describe."""
    described: dict[str, Any] = {}
    lost = []
    for name, source in case.inputs.items():
        if source.kind == "random":
            described[name] = {"type": "random"}
            if source.params:
                lost.append(f"{name} is random with dsa-bench's generator parameters {json.dumps(dict(source.params), sort_keys=True)}")
        elif source.kind == "scalar":
            described[name] = {"type": "scalar", "value": source.value}
        elif source.kind == "safetensors" and source.path is not None:
            path = source.path.relative_to(base).as_posix() if source.path.is_relative_to(base) else str(source.path)
            described[name] = {"type": "safetensors", "path": path, "tensor_key": source.tensor_key}
        else:
            lost.append(f"{name} holds explicit values (left out: flashinfer-bench's inputs are random, scalar or safetensors)")
    return described, lost


def _solution_name(results: LoadedResults, solution: str) -> str:
    meta = (results.header.solutions or {}).get(solution)
    return solution if meta is not None and meta.packed else f"{solution}_{results.definition}"


def _log(results: LoadedResults, record: CaseRecord, status: str, lost: list[str]) -> str:
    header = results.header
    settings = header.settings.written() if header.settings is not None else {}  # the fields the file holds
    meta = (header.solutions or {}).get(record.solution) or SolutionHeader()
    lines = [f"dsa-bench {results.environment.dsa_bench or ''}: results {results.path}, created {header.created}"]
    mapped = "" if status == record.status.value else f" (flashinfer-bench has no such status: reported as {status})"
    lines.append(f"dsa-bench status: {record.status.value}{mapped}")
    if record.message:
        lines.append(f"message: {record.message}")
    lines.append(f"solution: {record.solution} ({meta.packed or meta.path}, sha256 {meta.content_hash})")
    if results.timer:
        lines.append(f"timer: {results.timer}, L2 flush: {results.l2_flush}, launch: {results.launch}")
    else:
        lines.append("timer: none (a run without CUDA checks correctness only: latency, reference latency and speedup are 0)")
    counts = " ".join(f"{key}={settings[key]}" for key in ("seed", "input_sets", "warmup", "iterations", "trials") if key in settings)
    lines.append(f"settings: {counts}")
    tolerance = settings.get("tolerance") or {}
    lines.append("tolerance: " + " ".join(f"{key}={tolerance[key]}" for key in TOLERANCES if key in tolerance))
    if record.timing is not None:
        medians = ", ".join(f"{m:.6g}" for m in record.timing.trial_medians_ms)
        lines.append(
            f"latency: {record.timing.mean_ms:.6g} ms, the mean of {len(record.timing.samples_ms)} trial medians [{medians}] ms; "
            f"spread {record.timing.spread:.3g}; fastest call {record.timing.min_ms:.6g} ms"
        )
    if record.timing is not None and record.timing.host_samples_ms:
        lines.append(f"host wall time per call: {record.timing.host_mean_ms:.6g} ms (launches and synchronisation included)")
    if record.timing is not None and record.timing.timer_fallback:
        lines.append(f"timer fallback: {record.timing.timer_fallback}")
    if record.roofline is not None:
        r = record.roofline
        lines.append(f"roofline: {100 * r.fraction_of_roofline:.1f}% of the {r.bound} bound; {r.achieved_bandwidth / 1e9:.1f} GB/s of "
                     f"{r.copy_bandwidth / 1e9:.0f} copy bandwidth, {r.achieved_tflops:.1f} TFLOPS ({r.peak_source})")  # fmt: skip
    if lost:
        lines.append("inputs flashinfer-bench cannot describe: " + "; ".join(lost))
    lines.append(f"seeds: {json.dumps(record.seeds, sort_keys=True)}")
    return "\n".join(lines)


def _evaluation(results: LoadedResults, record: CaseRecord, status: str, reference_ms: float | None, lost: list[str]) -> dict[str, Any]:
    env = results.environment.written()  # the libraries' versions under their own names
    evaluation: dict[str, Any] = {
        "status": status,
        "environment": {"hardware": env.get("gpu") or "cpu", "libs": {key: str(env[key]) for key in _LIBS if env.get(key) is not None}},
        "timestamp": results.header.created or results.header.finished or "unknown",
        "log": _log(results, record, status, lost),
    }
    if status in ("PASSED", "INCORRECT_NUMERICAL"):  # the only statuses the schema gives correctness
        unmeasured = 0.0 if record.passed else math.nan
        correctness: dict[str, Any] = {
            "max_relative_error": _number(unmeasured if record.max_rel_error is None else record.max_rel_error),
            "max_absolute_error": _number(unmeasured if record.max_abs_error is None else record.max_abs_error),
        }
        extra: dict[str, Any] = {}
        if status != record.status.value:
            extra["dsa_bench_status"] = record.status.value
        if record.max_abs_error is None and record.max_rel_error is None:
            extra["errors_measured"] = False  # index outputs: dsa-bench judges them without an element error
        extra.update(_timing_extras(record))
        if extra:
            correctness["extra"] = extra
        evaluation["correctness"] = correctness
    if status == "PASSED":
        timing = record.timing
        evaluation["performance"] = {
            "latency_ms": timing.mean_ms if timing is not None else 0.0,
            "reference_latency_ms": reference_ms if timing is not None and reference_ms is not None else 0.0,
            "speedup_factor": record.speedup if record.speedup is not None else 0.0,
        }
    return evaluation


def _timing_extras(record: CaseRecord) -> dict[str, Any]:
    """The roofline, host time and timer of a timed record, for ``correctness.extra`` (flashinfer-bench's
    Performance ignores fields it does not define, so they cannot go there)."""
    timing = record.timing
    if timing is None or not (timing.timer_fallback or timing.host_samples_ms or record.roofline):
        return {}  # results from before these fields: their traces stay as they were
    extras: dict[str, Any] = {"dsa_bench_timer": timing.timer}
    if timing.timer_fallback:
        extras["dsa_bench_timer_fallback"] = timing.timer_fallback
    if timing.host_samples_ms:
        extras["dsa_bench_host_latency_ms"] = timing.host_mean_ms
    if record.roofline is not None:
        extras["dsa_bench_roofline"] = record.roofline.model_dump()
    return extras


def export_traces(results_path: Path, root: Path) -> TraceExport:
    """Every record of a results file as a flashinfer-bench Trace (see the module's docstring)."""
    results = load_results(results_path)
    workload, base = _recorded_workload(results, root)
    cases = {case.id: case for case in workload.cases}
    reference_ms = {r.case: r.timing.mean_ms for r in results.records if r.solution == REFERENCE_SOLUTION and r.timing and r.passed}
    export = TraceExport()
    export.inputs = [p for p in (workload.path, workload.trace_path) if p is not None and p.is_file()]
    export.inputs += sorted({src.path for case in workload.cases for src in case.inputs.values() if src.path is not None})
    if results.header.workload.dataset:
        export.input_folders.append(base)  # every file of a dataset is an input: its workloads/*.jsonl above all
    not_run: dict[tuple[str, str], list[str]] = {}  # (solution, status): cases, one warning per solution
    for index, record in enumerate(results.records):
        status = FLASHINFER_STATUS[record.status.value]
        if status is None:
            not_run.setdefault((record.solution, record.status.value), []).append(record.case)
            continue
        case = cases.get(record.case)
        if case is None or dict(case.axes) != record.axes:
            problem = "is not in the workload's trace any more" if case is None else f"has axes {dict(case.axes)} in the trace now"
            problem = f"records[{index}]: case {record.case!r} {problem}; export needs the trace the results were run on"
            raise DsaBenchError(problem, str(results_path))
        inputs, lost = _inputs(case, base)
        export.traces.append({
            "definition": results.definition,
            "solution": _solution_name(results, record.solution),
            "workload": {"uuid": record.case, "axes": dict(record.axes), "inputs": inputs},
            "evaluation": _evaluation(results, record, status, reference_ms.get(record.case), lost),
        })  # fmt: skip
    for (solution, status_name), skipped in not_run.items():
        which = skipped[0] if len(skipped) == 1 else f"{len(skipped)} cases ({skipped[0]}, ...)"
        export.left_out.append(f"{which} [{solution}]: {status_name}, not run, so there is no evaluation")
    return export


def _looks_like_traces(path: Path) -> bool:
    """Whether an existing file holds flashinfer-bench traces (which export may replace)."""
    try:
        lines = read_jsonl(path, "traces")
    except DsaBenchError:
        return False
    return bool(lines) and all(isinstance(line, dict) and {"definition", "workload", "evaluation"} <= set(line) for _, line in lines)


def check_traces_path(out: Path, results_path: Path, export: TraceExport | None = None) -> None:
    """Refuse an output path over the results file, an input of the run it records (with
    ``export``: its workload, trace, blobs, and any file of its dataset), or a file that holds no traces."""
    inputs, folders = ([results_path], []) if export is None else ([results_path, *export.inputs], export.input_folders)
    check_output_path(out, "--output", "flashinfer-bench traces", _looks_like_traces, inputs=inputs, input_folders=folders)


def write_traces(export: TraceExport, out: Path, results_path: Path) -> None:
    """Write the traces as JSONL (one Trace per line)."""
    check_traces_path(out, results_path, export)
    text = "".join(json.dumps(trace, allow_nan=False) + "\n" for trace in export.traces)
    write_atomic(out, text, "traces")
