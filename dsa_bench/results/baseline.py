"""The baseline file: its model, per-case measures of stored runs, loading, and updating it from results files.

A baseline case is written as its names plus :class:`CaseMeasure`'s fields (``asdict``) and read
back the same way once :class:`BaselineModel` has checked the document.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_document, check_output_path, has_json_format, read_json, write_atomic
from dsa_bench.models import ClosedModel, Name, OpenModel
from dsa_bench.results.records import (
    CaseRecord,
    LoadedResults,
    Measure,
    SolutionHeader,
    StatusName,
    check_format,
    load_results,
    now_iso,
    refuse_duplicates,
    refuse_redacted,
    refuse_secret_mix,
)
from dsa_bench.solution import REFERENCE_SOLUTION

BASELINE_FORMAT = "dsa-bench-baseline"


BASELINE_VERSION = 1


class BaselineCaseModel(ClosedModel):
    """A case of a baseline block: ``case``, ``solution`` and CaseMeasure's fields."""

    case: Name
    solution: Name
    status: StatusName
    speedup: Measure | None = None
    latency_ms: Measure | None = None
    spread: Measure | None = None
    reference_latency_ms: Measure | None = None
    reference_spread: Measure | None = None
    peer: Name | None = None  # absent in baselines written before peer speedups
    peer_speedup: Measure | None = None


class BaselineBlockModel(OpenModel):
    definition: str | None = None
    results_created: str | None = None
    results_file: str | None = None
    timer: str | None = None
    l2_flush: str | None = None
    launch: str | None = None  # absent in baselines from before run --cuda-graph: eager when timed (records.recorded_launch)
    settings: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    solutions: dict[str, SolutionHeader] | None = None
    cases: list[BaselineCaseModel]


class BaselineModel(OpenModel):
    format: Literal["dsa-bench-baseline"]
    version: Literal[1]
    updated: str | None = None
    workloads: dict[str, BaselineBlockModel]


@dataclass(frozen=True)
class CaseMeasure:
    """What a comparison needs of one (case, solution): status, speedup and their noise."""

    status: str
    speedup: float | None = None
    latency_ms: float | None = None
    spread: float | None = None
    reference_latency_ms: float | None = None
    reference_spread: float | None = None
    peer: str | None = None  # what peer_speedup is measured against (CaseRecord.peer); shown, never judged
    peer_speedup: float | None = None

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED.value


Key = tuple[str, str, str]  # (workload, case, solution)


def measures_of(results: LoadedResults) -> dict[Key, CaseMeasure]:
    """Per (workload, case, solution) measure; the reference's figures come from the same case."""
    reference: dict[str, CaseRecord] = {r.case: r for r in results.records if r.solution == REFERENCE_SOLUTION}
    found: dict[Key, CaseMeasure] = {}
    for r in results.records:
        ref = reference.get(r.case)
        ref_timing = ref.timing if ref is not None and ref.passed else None
        found[(results.workload, r.case, r.solution)] = CaseMeasure(
            status=r.status.value,
            speedup=r.speedup,
            latency_ms=r.timing.mean_ms if r.timing else None,
            spread=r.timing.spread if r.timing else None,
            reference_latency_ms=ref_timing.mean_ms if ref_timing else None,
            reference_spread=ref_timing.spread if ref_timing else None,
            peer=r.peer,
            peer_speedup=r.peer_speedup,
        )
    return found


def _check_baseline(document: Any, where: str) -> dict[str, Any]:
    check_format(document, BASELINE_FORMAT, BASELINE_VERSION, "baseline", where)
    check_document(BaselineModel, document, where)
    for name, block in document["workloads"].items():
        refuse_duplicates(block["cases"], f"workloads.{name}.cases", where)
    return document


def load_baseline(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise DsaBenchError("baseline file does not exist (create it with `dsa-bench baseline update`)", str(path))
    document = read_json(path, "baseline")
    return _check_baseline(document, str(path))


def baseline_measures(document: dict[str, Any]) -> dict[Key, CaseMeasure]:
    """Per (workload, case, solution) measure of a checked baseline document: a case holds
    ``case``, ``solution`` and CaseMeasure's fields (BaselineCaseModel)."""
    found: dict[Key, CaseMeasure] = {}
    for workload, block in document["workloads"].items():
        for case in block["cases"]:
            measure = {key: value for key, value in case.items() if key not in ("case", "solution")}
            found[(workload, case["case"], case["solution"])] = CaseMeasure(**measure)
    return found


def baseline_block(results: LoadedResults) -> dict[str, Any]:
    """The baseline entry of one workload, from a finished results file."""
    header = results.header
    return {
        "definition": results.definition,
        "results_created": header.created,
        "results_file": results.path.name,
        "timer": results.timer,
        "l2_flush": results.l2_flush,
        "launch": results.launch,
        "settings": header.settings.written() if header.settings is not None else None,
        "environment": results.environment.written(),
        **({"secret": True} if header.secret else {}),  # made from a contest run (compare.refuse_secret_mix)
        "solutions": {name: {"content_hash": meta.content_hash} for name, meta in (header.solutions or {}).items()},
        "cases": [
            {"case": case, "solution": solution, **asdict(measure)} for (_, case, solution), measure in measures_of(results).items()
        ],
    }


def update_baseline(baseline_path: Path, results_paths: list[Path], replace: bool = False) -> dict[str, Any]:
    """Write (or update) a baseline file from results files; returns the new document.

    Each results file's workload replaces that workload's entry; other workloads already in
    the file stay unless ``replace``. Interrupted runs are refused: a baseline must be complete.
    """
    if not results_paths:
        raise DsaBenchError("no results file given")
    check_output_path(baseline_path, "--baseline", "dsa-bench baseline", lambda p: has_json_format(p, BASELINE_FORMAT), results_paths)
    loaded = [load_results(p) for p in results_paths]
    seen: dict[str, Path] = {}
    for results in loaded:
        if results.workload in seen:
            raise DsaBenchError(
                f"workload {results.workload!r} is also in {seen[results.workload]}; give one results file per workload", str(results.path)
            )
        seen[results.workload] = results.path
        if not results.header.complete:
            raise DsaBenchError("results file is incomplete (the run was interrupted); a baseline needs a finished run", str(results.path))
        if not results.records:
            raise DsaBenchError("results file holds no records", str(results.path))
        refuse_redacted(results, "baseline update")
    if baseline_path.exists() and not replace:
        document = load_baseline(baseline_path)
    else:
        document = {"format": BASELINE_FORMAT, "version": BASELINE_VERSION, "workloads": {}}
    for results in loaded:  # one baseline holds secret or public entries, never both
        refuse_secret_mix(results, loaded[0].header.secret, str(loaded[0].path))
        for name, block in document["workloads"].items():
            if name not in seen:
                refuse_secret_mix(results, block.get("secret"), f"{baseline_path}'s entry for {name!r}", block.get("results_file"))
    document["updated"] = now_iso()
    for results in loaded:
        document["workloads"][results.workload] = baseline_block(results)
    document["workloads"] = dict(sorted(document["workloads"].items()))
    write_atomic(baseline_path, json.dumps(document, indent=1) + "\n", "baseline")
    return document
