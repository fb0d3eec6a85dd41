"""Adversarial solutions each get the right status, and the run goes on past every one of them.

CPU-capable fixtures run here in CI; the GPU-only ones (side stream, pointer memoization, CUDA
fault) run where CUDA is present.
"""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES, run_cli

ADVERSARIAL = FIXTURES / "adversarial"


def statuses(doc: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for record in doc["records"]:
        found.setdefault(record["solution"], []).append(record["status"])
    return found


def messages(doc: dict, solution: str) -> list[str]:
    return [r["message"] for r in doc["records"] if r["solution"] == solution]


def run_with(tmp_path, workload: str, cases: list[str], names: list[str], *extra: str) -> tuple[int, dict, str]:
    save = tmp_path / "results.json"
    args = ["run", "-w", workload, "-s", "reference", "--save", str(save), *extra]
    for case in cases:
        args += ["-c", case]
    for name in names:
        args += ["-s", str(ADVERSARIAL / name)]
    proc = run_cli(*args)
    assert "Traceback" not in proc.stdout
    return proc.returncode, json.loads(save.read_text()), proc.stdout + proc.stderr


def test_cpu_adversaries_on_the_indexer(tmp_path):
    names = ["writes_nothing", "caches_by_shape", "sleeps", "kills_itself", "wrong_dtype", "permuted_topk"]
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_boundary", "smoke_scored"], names, "--case-timeout", "8")
    assert code == 1, output
    found = statuses(doc)
    assert found["reference"] == ["PASSED", "PASSED"], "the run goes on past every failure"
    assert found["writes_nothing"] == ["INCORRECT_INDICES"] * 2
    assert "neither -1 nor a token id" in messages(doc, "writes_nothing")[0]
    assert found["caches_by_shape"] == ["INCORRECT_INDICES"] * 2, "a cached answer for a different input set fails"
    assert found["sleeps"] == ["TIMEOUT"] * 2
    assert "no answer within 8 s" in messages(doc, "sleeps")[0]
    assert found["kills_itself"] == ["RUNTIME_ERROR"] * 2
    assert "worker process died (exit code -9)" in messages(doc, "kills_itself")[0]
    assert found["wrong_dtype"] == ["INCORRECT_DTYPE"] * 2
    assert "dtype int64, expected int32" in messages(doc, "wrong_dtype")[0]
    assert found["permuted_topk"] == ["PASSED", "PASSED"]


def test_natural_log_lse_fails(tmp_path):
    code, doc, output = run_with(tmp_path, "sparse_attention_smoke", ["smoke_t3_empty_small"], ["natural_log_lse"])
    assert code == 1, output
    assert statuses(doc) == {"reference": ["PASSED"], "natural_log_lse": ["INCORRECT_NUMERICAL"]}
    assert messages(doc, "natural_log_lse")[0].startswith("lse:")


@pytest.mark.gpu
def test_side_stream_work_is_timed_by_cupti(tmp_path):
    """The fixture hides a ~4 ms spin kernel on a side stream and returns early."""
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], ["side_stream"], "--timer", "cupti")
    assert code == 0, output
    record = next(r for r in doc["records"] if r["solution"] == "side_stream")
    assert record["status"] == "PASSED" and record["timing"]["timer"] == "cupti"
    assert doc["l2_flush"] == "clean", "the default flush leaves the L2 clean"
    assert record["timing"]["min_ms"] > 3.0, "CUPTI sees the hidden kernel"
    # CUDA events on the current stream miss it: the reason CUPTI is the default timer.
    code, events_doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], ["side_stream"], "--timer", "events")
    events_record = next(r for r in events_doc["records"] if r["solution"] == "side_stream")
    assert events_record["timing"]["timer"] == "cuda_events"
    assert events_record["timing"]["median_ms"] < 0.5 * record["timing"]["median_ms"], (events_record["timing"], record["timing"])


@pytest.mark.gpu
def test_pointer_memoization_is_caught_by_timed_call_checks(tmp_path):
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored", "smoke_edges"], ["memoizes_by_pointer"])
    assert code == 1, output
    found = statuses(doc)
    assert found["reference"] == ["PASSED", "PASSED"]
    assert all(s.startswith("INCORRECT") for s in found["memoizes_by_pointer"]), found
    assert any("timed call" in m or "valid ids" in m or "top-" in m for m in messages(doc, "memoizes_by_pointer"))


@pytest.mark.gpu
def test_cuda_fault_is_a_runtime_error_and_the_worker_restarts(tmp_path):
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_passthrough", "smoke_scored"], ["cuda_fault"])
    assert code == 1, output
    found = statuses(doc)
    assert found == {"reference": ["PASSED", "PASSED"], "cuda_fault": ["RUNTIME_ERROR", "RUNTIME_ERROR"]}
    assert any("illegal" in m.lower() for m in messages(doc, "cuda_fault")), messages(doc, "cuda_fault")
