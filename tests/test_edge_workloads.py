"""The shipped edge workloads: what they hold, that every shipped solution passes them, and that
they catch what the contest-shaped workloads cannot (a NaN for a token without a valid index).
(tests/test_workloads.py checks that tools/make_traces.py writes every trace byte for byte.)"""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES, ROOT, run_cli

from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.workloads import build_inputs, load_workload

EDGES = {"indexer_edges": "indexer_edges.jsonl", "sparse_attention_edges": "sparse_attention_edges.jsonl"}
SHIPPED_SOLUTIONS = ("reference", "triton")
NAN_FOR_EMPTY = FIXTURES / "solutions" / "nan_for_empty_token"


def test_indexer_edges_hold_every_edge(cpu):
    workload = load_workload(ROOT / "workloads" / "indexer_edges.yaml")  # the trace validator accepts every case
    lens = {n for case in workload.cases for n in case.inputs["seq_lens"].values}
    assert {0, 1, 63, 64, 65, 2047, 2048, 2049, 2111, 2112, 5824} <= lens
    assert any(set(c.inputs["seq_lens"].values) == {0} for c in workload.cases), "a case whose every row is empty"
    distinct = {c.inputs["k_index_cache_fp8"].params.get("distinct_keys") for c in workload.cases}
    assert {1, 3} <= distinct, "tie-heavy rows"
    by_id = {c.id: c for c in workload.cases}
    zero = build_inputs(workload.definition, by_id["edges_zero_weights"], 1, cpu)
    assert bool((zero["weights"] == 0).all()), "every score exactly 0"
    shared = build_inputs(workload.definition, by_id["edges_shared_pages"], 1, cpu)
    rows = [set(shared["block_table"][b, : -(-n // 64)].tolist()) for b, n in enumerate(shared["seq_lens"].tolist())]
    assert rows[0] & rows[1] and rows[0] & rows[2] and rows[3] & rows[0], "rows share pages"
    tails = [shared["block_table"][b, -(-n // 64) :].tolist() for b, n in enumerate(shared["seq_lens"].tolist())]
    assert {-1, 2**31 - 1} <= {v for tail in tails for v in tail}, "table entries past a row's pages name no page"
    assert any("seq_len 0" in note for note in idx.DEFINITION.notes), "the contract says what an empty row holds"


def test_attention_edges_hold_every_edge(cpu):
    workload = load_workload(ROOT / "workloads" / "sparse_attention_edges.yaml")
    valid_counts: set[int] = set()
    paddings = set()
    for case in workload.cases:
        inputs = build_inputs(workload.definition, case, 1, cpu)
        valid = inputs["sparse_indices"] >= 0
        valid_counts |= set(valid.sum(dim=1).tolist())
        for row in valid:
            n = int(row.sum())
            if 0 < n < attn.TOPK:  # where its padding sits: after, before or between the valid slots
                paddings.add("tail" if bool(row[:n].all()) else "front" if bool(row[-n:].all()) else "inside")
    assert {0, 1, 5, 64, 2047, 2048} <= valid_counts
    assert {"tail", "front", "inside"} <= paddings, "padding at the end, at the front and between valid slots"
    scales = {c.inputs["sm_scale"].value for c in workload.cases if c.inputs["sm_scale"].kind == "scalar"}
    assert scales and min(scales) > attn.CONTEST_SM_SCALE
    assert any("no valid index" in note and "-inf" in note for note in attn.DEFINITION.notes)


def run_all(tmp_path, workload: str, *solutions: str, extra: tuple[str, ...] = ()) -> dict:
    save = tmp_path / f"{workload}.json"
    args = ["run", "-w", workload, "--save", str(save), *extra]
    for solution in solutions:
        args += ["-s", solution]
    proc = run_cli(*args)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    doc = json.loads(save.read_text())
    doc["_output"] = proc.stdout + proc.stderr
    doc["_code"] = proc.returncode
    return doc


@pytest.mark.slow
@pytest.mark.parametrize("workload", list(EDGES))
def test_every_shipped_solution_passes_the_edge_workloads(tmp_path, workload):
    # On a CPU the triton solution runs its Triton kernels under the interpreter.
    doc = run_all(tmp_path, workload, *SHIPPED_SOLUTIONS)
    assert doc["_code"] == 0, doc["_output"]
    n_cases = len(load_workload(ROOT / "workloads" / f"{workload}.yaml").cases)
    for solution in SHIPPED_SOLUTIONS:
        records = [r for r in doc["records"] if r["solution"] == solution]
        assert len(records) == n_cases
        assert [r["status"] for r in records] == ["PASSED"] * n_cases, [(r["case"], r["status"], r["message"]) for r in records]


def test_the_contest_attention_workload_has_no_empty_token():
    # Why sparse_attention_h16 cannot catch the bug below: every token there has a valid slot.
    workload = load_workload(ROOT / "workloads" / "sparse_attention_h16.yaml")
    assert min(n for c in workload.cases for n in c.inputs["sparse_indices"].params["valid_counts"]) >= 1


@pytest.mark.slow
def test_a_nan_for_an_empty_token_fails_the_edges_and_passes_h16(tmp_path):
    edges = run_all(tmp_path, "sparse_attention_edges", str(NAN_FOR_EMPTY))
    assert edges["_code"] == 1, edges["_output"]
    n_cases = len(load_workload(ROOT / "workloads" / "sparse_attention_edges.yaml").cases)
    assert [r["status"] for r in edges["records"]] == ["INCORRECT_NUMERICAL"] * n_cases, "every edge case has an empty token"
    assert all("has no valid index, so its output must be exactly 0" in r["message"] and "nan" in r["message"] for r in edges["records"])
    # the same kernel on a contest-shaped case: correct, because no token there is empty
    h16 = run_all(tmp_path, "sparse_attention_h16", str(NAN_FOR_EMPTY), extra=("-c", "attention_00_t1_full", "--input-sets", "1"))
    assert h16["_code"] == 0, h16["_output"]
    assert [r["status"] for r in h16["records"]] == ["PASSED"]
