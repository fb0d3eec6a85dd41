"""Merging results files of one workload that cover different cases into one results file.

For a run split over several sittings (a time limit stopped the first part): every record keeps
the speedup measured in its own run, since each case's reference and solutions were timed side by
side in the same process. The files must agree on workload, settings, timer, L2 flush, launch
mode (eager or CUDA-graph replay), GPU and solution content hashes, and no (case, solution) may appear twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_output_path, has_json_format, write_atomic
from dsa_bench.results.records import RESULTS_FORMAT, CaseRecord, Environment, LoadedResults, ResultsHeader, load_results

MUST_AGREE = ("format", "version", "workload", "settings", "timer", "l2_flush", "launch", "secret", "redacted")
#: what each part's own sittings were: kept with the part, under merged_from
PER_PART = ("wall_breakdown", "resumed")


@dataclass
class MergedResults:
    header: ResultsHeader
    records: list[CaseRecord]

    @property
    def document(self) -> dict[str, Any]:
        return {**self.header.written(), "records": [r.model_dump() for r in self.records]}


def _as_written(header: ResultsHeader, field: str) -> Any:
    """A header field as the file holds it (nested models compared by their fields)."""
    return header.written().get(field)


def merge_results(paths: list[Path]) -> MergedResults:
    """One results document holding every record of ``paths`` (checked, in order)."""
    if not paths:
        raise DsaBenchError("no results file given")
    loaded = [load_results(p) for p in paths]
    first = loaded[0].header
    seen: dict[tuple[str, str], Path] = {}
    records: list[CaseRecord] = []
    for part in loaded:
        header, where = part.header, str(part.path)
        for field in MUST_AGREE:
            if _as_written(header, field) != _as_written(first, field):
                raise DsaBenchError(f"field {field!r} differs from {paths[0]}", where)
        gpu, first_gpu = (header.environment or Environment()).gpu, (first.environment or Environment()).gpu
        if gpu != first_gpu:
            raise DsaBenchError(f"GPU {gpu} differs from {paths[0]}", where)
        first_solutions = first.solutions or {}
        for name, info in (header.solutions or {}).items():
            if name in first_solutions and info.content_hash != first_solutions[name].content_hash:
                raise DsaBenchError(f"solution {name!r} has another content hash than in {paths[0]}", where)
        for record in part.records:
            key = (record.case, record.solution)
            if key in seen:
                raise DsaBenchError(f"case {key[0]!r} of solution {key[1]!r} already came from {seen[key]}", where)
            seen[key] = part.path
            records.append(record)
    merged = {k: v for k, v in first.written().items() if k not in ("complete", "finished", "cases", *PER_PART)}
    cases = None
    if all(p.header.cases is not None for p in loaded):  # the case selections, joined
        cases = list(dict.fromkeys(c for p in loaded for c in p.header.cases or []))
        merged["cases"] = cases
    merged["complete"] = _covers_every_case(loaded, cases, records)
    merged["finished"] = max(p.header.finished or p.header.created or "" for p in loaded)
    merged["merged_from"] = [
        {"file": p.path.name, "created": p.header.created, "finished": p.header.finished, "complete": p.header.complete,
         "records": len(p.records), **{k: v for k, v in p.header.written().items() if k in PER_PART}}
        for p in loaded
    ]  # fmt: skip
    return MergedResults(ResultsHeader.model_validate(merged), records)


def _covers_every_case(loaded: list[LoadedResults], cases: list[str] | None, records: list[CaseRecord]) -> bool:
    """Whether the merge is a complete run: every part complete, or (the parts naming their case
    selections) a record of every solution for every selected case. An interrupted part alone
    never makes a complete merge."""
    if all(p.header.complete for p in loaded):
        return True
    if cases is None:
        return False
    solutions = {name for p in loaded for name in p.header.solutions or {}}
    have = {(r.case, r.solution) for r in records}
    return all((case, name) in have for case in cases for name in solutions)


def write_merged(paths: list[Path], out: Path) -> MergedResults:
    """Merge ``paths`` into ``out``, which may replace only another results file (never an input)."""
    check_output_path(out, "--out", "dsa-bench results", lambda p: has_json_format(p, RESULTS_FORMAT), paths)
    merged = merge_results(paths)
    write_atomic(out, json.dumps(merged.document, indent=1), "results")
    return merged
