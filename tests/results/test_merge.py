"""`dsa-bench results merge`: parts of one workload's run joined into one results file."""

from __future__ import annotations

import json

from synthetic_results import write_results
from typer.testing import CliRunner

from dsa_bench.cli import app


def _latencies(cases: list[str]) -> dict[str, dict[str, float]]:
    return {case: {"reference": 1.0, "triton": 0.01} for case in cases}


def merge(*args: str):
    return CliRunner().invoke(app, ["results", "merge", *args])


def test_merge_joins_parts_and_refuses_overlaps(tmp_path):
    first = write_results(tmp_path / "part1.json", "indexer_h64", _latencies(["c0", "c1"]))
    second = write_results(tmp_path / "part2.json", "indexer_h64", _latencies(["c2"]))
    merged = tmp_path / "merged.json"
    result = merge(str(first), str(second), "-o", str(merged))
    assert result.exit_code == 0, result.output
    doc = json.loads(merged.read_text())
    assert sorted({r["case"] for r in doc["records"]}) == ["c0", "c1", "c2"] and len(doc["records"]) == 6
    assert doc["complete"] and [p["file"] for p in doc["merged_from"]] == ["part1.json", "part2.json"]

    overlap = write_results(tmp_path / "overlap.json", "indexer_h64", _latencies(["c1"]))
    result = merge(str(first), str(overlap), "-o", str(tmp_path / "bad.json"))
    assert result.exit_code == 2 and "already came from" in result.stderr
    other_hash = write_results(tmp_path / "rehashed.json", "indexer_h64", _latencies(["c3"]), hashes={"triton": "changed"})
    result = merge(str(first), str(other_hash), "-o", str(tmp_path / "bad.json"))
    assert result.exit_code == 2 and "another content hash" in result.stderr
    assert not (tmp_path / "bad.json").exists()
    result = merge(str(first), str(second), "-o", str(first))
    assert result.exit_code == 2 and "this is an input of the command" in result.stderr


def test_merge_refuses_parts_timed_with_another_launch_mode(tmp_path):
    eager = write_results(tmp_path / "eager.json", "indexer_h64", _latencies(["c0"]), launch="eager")
    older = write_results(tmp_path / "older.json", "indexer_h64", _latencies(["c1"]))  # no launch field: eager
    graph = write_results(tmp_path / "graph.json", "indexer_h64", _latencies(["c2"]), launch="cuda_graph")
    result = merge(str(eager), str(older), "-o", str(tmp_path / "merged.json"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "merged.json").read_text())["launch"] == "eager"
    result = merge(str(eager), str(graph), "-o", str(tmp_path / "bad.json"))
    assert result.exit_code == 2 and "field 'launch' differs" in result.stderr, result.stderr
    assert not (tmp_path / "bad.json").exists()
