"""Merging results files of one workload that cover different cases into one results file.

For a run split over several sittings (a time limit stopped the first part): every record keeps
the speedup measured in its own run, since each case's reference and solutions were timed side by
side in the same process. The files must agree on workload, settings, timer, L2 flush, GPU and
solution content hashes, and no (case, solution) may appear twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_output_path, has_json_format, write_atomic
from dsa_bench.results.records import RESULTS_FORMAT, load_results

MUST_AGREE = ("format", "version", "workload", "settings", "timer", "l2_flush", "secret", "redacted")


def merge_results(paths: list[Path]) -> dict[str, Any]:
    """One results document holding every record of ``paths`` (checked, in order)."""
    if not paths:
        raise DsaBenchError("no results file given")
    loaded = [load_results(p) for p in paths]
    first = loaded[0].document
    per_part = ("wall_breakdown", "resumed")  # what each part's own sittings were: kept with the part, under merged_from
    merged = {k: v for k, v in first.items() if k not in ("records", "complete", "finished", "cases", *per_part)}
    seen: dict[tuple[str, str], Path] = {}
    records = []
    for part in loaded:
        doc, where = part.document, str(part.path)
        for field in MUST_AGREE:
            if doc.get(field) != first.get(field):
                raise DsaBenchError(f"field {field!r} differs from {paths[0]}", where)
        if doc["environment"].get("gpu") != first["environment"].get("gpu"):
            raise DsaBenchError(f"GPU {doc['environment'].get('gpu')} differs from {paths[0]}", where)
        for name, info in doc["solutions"].items():
            if name in first["solutions"] and info["content_hash"] != first["solutions"][name]["content_hash"]:
                raise DsaBenchError(f"solution {name!r} has another content hash than in {paths[0]}", where)
        for record in doc["records"]:
            key = (record["case"], record["solution"])
            if key in seen:
                raise DsaBenchError(f"case {key[0]!r} of solution {key[1]!r} already came from {seen[key]}", where)
            seen[key] = part.path
            records.append(record)
    if all("cases" in p.document for p in loaded):  # the case selections, joined
        merged["cases"] = list(dict.fromkeys(c for p in loaded for c in p.document.get("cases") or []))
    merged["records"] = records
    merged["complete"] = _covers_every_case(loaded, merged, records)
    merged["finished"] = max(p.document.get("finished") or p.document["created"] for p in loaded)
    merged["merged_from"] = [
        {"file": p.path.name, "created": p.document["created"], "finished": p.document.get("finished"), "complete": p.document["complete"],
         "records": len(p.document["records"]), **{k: p.document[k] for k in per_part if k in p.document}}
        for p in loaded
    ]  # fmt: skip
    return merged


def _covers_every_case(loaded: list[Any], merged: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """Whether the merge is a complete run: every part complete, or (the parts naming their case
    selections) a record of every solution for every selected case. An interrupted part alone
    never makes a complete merge."""
    if all(p.document.get("complete") for p in loaded):
        return True
    if "cases" not in merged:
        return False
    solutions = {name for p in loaded for name in p.document.get("solutions") or {}}
    have = {(r["case"], r["solution"]) for r in records}
    return all((case, name) in have for case in merged["cases"] for name in solutions)


def write_merged(paths: list[Path], out: Path) -> dict[str, Any]:
    """Merge ``paths`` into ``out``, which may replace only another results file (never an input)."""
    check_output_path(out, "--out", "dsa-bench results", lambda p: has_json_format(p, RESULTS_FORMAT), paths)
    merged = merge_results(paths)
    write_atomic(out, json.dumps(merged, indent=1), "results")
    return merged
