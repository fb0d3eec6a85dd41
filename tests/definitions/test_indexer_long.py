"""Issue 45: the indexer at production contexts (indexer_long, indexer_scaled), V4's top-512 and
top-1024 definitions, their generator options, the chunked reference, peers that cannot serve a
selection size, and how a run reports a solution's failed cases."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES, ROOT, run_cli
from synthetic_results import write_results

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.results.records import load_results
from dsa_bench.results.tables import failed_cases, failures_table
from dsa_bench.solution import load_solution
from dsa_bench.workloads import build_inputs, load_workload, parse_case

CPU = torch.device("cpu")
NEW_TRACES = ("indexer_long", "indexer_scaled", "indexer_topk512_edges", "indexer_topk512_long", "indexer_topk1024_edges",
              "indexer_topk1024_long")  # fmt: skip
K = 1024


def test_new_workloads_load_every_case():
    for name in NEW_TRACES:
        assert load_workload(ROOT / "workloads" / f"{name}.yaml").cases, name  # the validator accepts every case


def _shapes(workload: str) -> dict[str, list[int]]:
    return {c.id: c.inputs["seq_lens"].values for c in load_workload(ROOT / "workloads" / f"{workload}.yaml").cases}


def test_indexer_long_covers_the_issues_table():
    lens = _shapes("indexer_long")
    for cid, batch, context in (("b1_l32k", 1, 32), ("b1_l128k", 1, 128), ("b8_l64k", 8, 64), ("b32_l32k", 32, 32),
                                ("b64_l128k", 64, 128), ("b128_l8k", 128, 8), ("b128_l32k", 128, 32)):  # fmt: skip
        assert lens[cid] == [context * K] * batch, cid
    ragged = lens["b32_ragged_4k_128k"]
    assert len(ragged) == 32 and min(ragged) == 4 * K and max(ragged) == 128 * K and len(set(ragged)) > 20
    assert min(lens["b128_ragged_1k_128k"]) == K and max(lens["b128_ragged_1k_128k"]) == 128 * K
    mtp = lens["mtp_b32_l32k"]
    assert mtp[0::2] == [32 * K] * 16 and mtp[1::2] == [32 * K + 1] * 16
    assert {cid for cid in lens if cid.startswith("small_")} == {"small_b2_l8k", "small_ragged_b4_1k_16k", "small_mtp_b4_l8k"}
    suffixes = {"_neg_x1e3": 0, "_neg": 0, "_x1e3": 0, "_x1e-4": 0, "_flat": 0}
    for cid, values in _shapes("indexer_scaled").items():  # every scaled case repeats an indexer_long shape
        suffix = next(s for s in suffixes if cid.endswith(s))
        suffixes[suffix] += 1
        assert values == lens[cid.removesuffix(suffix)], cid
    assert all(suffixes.values()), "negative, scaled up, scaled down, both, and near-constant rows"


def test_mtp_rows_share_their_table_row_and_the_pool_holds_every_sequence():
    workload = load_workload(ROOT / "workloads" / "indexer_long.yaml")
    case = next(c for c in workload.cases if c.id == "small_mtp_b4_l8k")
    inputs = build_inputs(workload.definition, case, 3, CPU)
    table, lens = inputs["block_table"], inputs["seq_lens"].tolist()
    assert lens == [8 * K - 1, 8 * K, 3000, 3001]
    assert torch.equal(table[0], table[1]) and torch.equal(table[2], table[3])
    first, second = set(table[0, :128].tolist()), set(table[2, :47].tolist())
    assert not first & second, "sequences own distinct pages"
    assert case.axes["num_pages"] >= 128 + 47
    # the shorter row of a pair reads the same tokens as the longer one, so their scores agree
    scores = idx.scores(inputs["q_index_fp8"][[1, 1]], inputs["k_index_cache_fp8"], inputs["weights"][[1, 1]],
                        torch.tensor([8 * K - 1, 8 * K], dtype=torch.int32), table[:2])  # fmt: skip
    assert torch.equal(scores[0, : 8 * K - 1], scores[1, : 8 * K - 1])


def _validate(axes: dict, given: dict, params: dict) -> list[str]:
    return idx.validate(idx.DEFINITION.axes(axes), given, params)


AXES = {"batch_size": 4, "max_num_pages": 40, "num_pages": 400}
LENS = {"seq_lens": torch.tensor([2500, 2501, 100, 101], dtype=torch.int32)}


@pytest.mark.parametrize(
    ("given", "params", "message"),
    [
        (LENS, {"weights": {"sign": "down"}}, "weights.params.sign = 'down' must be one of mixed, positive, negative"),
        (LENS, {"weights": {"scale": 0}}, "weights.params.scale = 0 must be a finite number above 0"),
        (LENS, {"weights": {"scale": "big"}}, "weights.params.scale = 'big' must be a finite number above 0"),
        (LENS, {"weights": {"offset": 1}}, "weights.params.offset is not a generator parameter (its parameters are sign, scale)"),
        (LENS, {"k_index_cache_fp8": {"near_constant_rows": [0, 4]}}, "near_constant_rows holds 4, not a row of batch_size = 4"),
        (LENS, {"k_index_cache_fp8": {"near_constant_rows": 1}}, "near_constant_rows = 1 must be a list of row indices"),
        (LENS, {"k_index_cache_fp8": {"near_constant_rows": [1, 1]}}, "near_constant_rows lists a row twice"),
        (LENS, {"k_index_cache_fp8": {"near_constant_rows": [1], "near_constant_spread": 0.5}}, "must be a number in (0, 0.1]"),
        (LENS, {"k_index_cache_fp8": {"near_constant_spread": 0.01}}, "near_constant_spread needs near_constant_rows"),
        (LENS, {"block_table": {"rows_per_sequence": 3}}, "rows_per_sequence = 3 does not divide batch_size = 4"),
        (LENS, {"block_table": {"rows_per_sequence": 0}}, "rows_per_sequence = 0 must be at least 1"),
        (LENS, {"block_table": {"rows_per_sequence": 2.0}}, "rows_per_sequence = 2.0 must be an integer"),
        ({}, {"block_table": {"rows_per_sequence": 2}}, "rows_per_sequence needs explicit seq_lens"),
        ({"seq_lens": torch.tensor([2500, 2501, 2500, 2501], dtype=torch.int32)}, {"block_table": {"rows_per_sequence": 2}},
         None),  # two sequences of 40 pages fit 100 pages; four rows of their own would not
    ],
)
def test_generator_options_are_validated(given, params, message):
    axes = {**AXES, "num_pages": 100} if message is None else AXES
    problems = _validate(axes, given, params)
    if message is None:
        assert problems == []
        assert _validate(axes, given, {}) == ["the rows need 160 pages but num_pages = 100"]
    else:
        assert any(message in p for p in problems), problems


def test_a_bad_option_in_a_trace_names_the_line_and_case(tmp_path):
    record = {"id": "bad", "axes": AXES, "inputs": {"seq_lens": {"type": "explicit", "values": [1, 2, 3, 4]},
                                                     "weights": {"type": "random", "params": {"sign": "down"}}}}  # fmt: skip
    with pytest.raises(DsaBenchError, match=r"trace\.jsonl:7: case 'bad': weights\.params\.sign = 'down'"):
        parse_case(record, idx.DEFINITION, "trace.jsonl:7", tmp_path)


def _generated(params: dict, lens: list[int], seed: int = 5) -> dict:
    axes = idx.DEFINITION.axes({"batch_size": len(lens), "max_num_pages": -(-max(lens) // 64), "num_pages": 600})
    return idx.generate(axes, {"seq_lens": torch.tensor(lens, dtype=torch.int32)}, params, InputRng(seed, CPU))


def test_weight_options_shift_the_draw_and_timed_redraws_follow_them():
    lens = [3000, 2100]
    plain = _generated({}, lens)["weights"]
    negative = _generated({"weights": {"sign": "negative", "scale": 1e3}}, lens)["weights"]
    assert torch.equal(negative, -plain.abs() * 1e3), "the same draw, its sign and scale changed"
    assert torch.equal(_generated({"weights": {"sign": "positive"}}, lens)["weights"], plain.abs())
    axes = idx.DEFINITION.axes({"batch_size": 2, "max_num_pages": 47, "num_pages": 600})
    redrawn = idx.DEFINITION.redraw_inputs(axes, InputRng(9, CPU), {"weights": {"sign": "negative", "scale": 1e-4}})
    assert bool((redrawn["weights"] < 0).all()) and float(redrawn["weights"].abs().max()) < 1e-3
    default = idx.DEFINITION.redraw_inputs(axes, InputRng(9, CPU), {})
    assert torch.equal(redrawn["weights"], -default["weights"].abs() * 1e-4)
    assert torch.equal(default["weights"], idx.draw_queries(axes, InputRng(9, CPU))["weights"])


def test_near_constant_rows_score_within_their_spread():
    lens = [4000, 4000, 3000]
    inputs = _generated({"k_index_cache_fp8": {"near_constant_rows": [1], "near_constant_spread": 1e-4}}, lens)
    inputs["weights"] = inputs["weights"].abs()  # positive scores, so a relative spread is meaningful
    scores = idx.scores(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"], inputs["block_table"])
    flat, other = scores[1, :4000], scores[0, :4000]
    assert float((flat.max() - flat.min()) / flat.mean()) < 1e-3 and flat.unique().numel() > 500, "near-constant, yet not all tied"
    assert float((other.max() - other.min()) / other.mean()) > 0.5
    expected = idx.expect(inputs)
    reference = idx.reference(**inputs)["topk_indices"]
    assert idx.check(inputs, {"topk_indices": reference}, expected, Tolerance()).passed


def test_chunked_scores_and_tolerances_equal_the_one_shot_ones(monkeypatch):
    inputs = _generated({}, [5000, 2100, 0, 4097, 64])
    whole = idx._scores_and_tie_tolerances(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"],
                                           inputs["seq_lens"], inputs["block_table"])  # fmt: skip
    monkeypatch.setattr(idx, "SCORE_CHUNK_ELEMENTS", 5 * 64 * 192 * 7)  # 7 pages a chunk: a row split 12 ways
    assert idx._chunk_pages(5, 79) == 7
    chunked = idx._scores_and_tie_tolerances(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"],
                                             inputs["seq_lens"], inputs["block_table"])  # fmt: skip
    assert torch.equal(whole[0], chunked[0])
    assert torch.equal(whole[1], chunked[1]), "the tolerance's maxima over chunks are the row's"
    assert float(chunked[1][0]) > 0 and float(chunked[1][2]) == 0.0, "an empty row has nothing to tolerate"


def test_chunked_key_draws_fill_every_reachable_token(monkeypatch):
    monkeypatch.setattr(idx, "KEY_DRAW_CHUNK", 1000)
    inputs = _generated({"k_index_cache_fp8": {"near_constant_rows": [2]}}, [3000, 2500, 2100], seed=8)
    values = idx.INDEXER_KEY_PAGE.values(inputs["k_index_cache_fp8"]).view(torch.float8_e4m3fn).float()
    for b, n in enumerate(inputs["seq_lens"].tolist()):
        ids = idx.token_ids(inputs["block_table"][b], n)
        assert bool(torch.isfinite(values[ids // 64, ids % 64]).all()), f"row {b}"
    reference = idx.reference(**inputs)["topk_indices"]
    assert idx.check(inputs, {"topk_indices": reference}, idx.expect(inputs), Tolerance()).passed


# --------------------------------------------------------------------------- top-512 and top-1024


@pytest.mark.parametrize("topk", [512, 1024])
def test_v4_definitions_share_the_contract_with_their_k(topk):
    definition = get_definition(idx.name_of(topk))
    assert definition.const_axes["topk"] == topk and definition.outputs[0].shape == ("batch_size", "topk")
    lens = [0, 1, topk - 1, topk, topk + 1, 2049, 3000]
    axes = definition.axes({"batch_size": len(lens), "max_num_pages": 47, "num_pages": 600})
    inputs = definition.generate(axes, {"seq_lens": torch.tensor(lens, dtype=torch.int32)}, {}, InputRng(4, CPU))
    out = definition.reference(**inputs)["topk_indices"]
    assert out.shape == (len(lens), topk)
    for b, n in enumerate(lens):  # L <= k: the row's tokens in position order, then -1
        if n <= topk:
            assert torch.equal(out[b, :n].long(), idx.token_ids(inputs["block_table"][b], n)) and bool((out[b, n:] == -1).all())
        else:
            assert int((out[b] >= 0).sum()) == topk
    expected = definition.expect(inputs)
    assert [e is None for e in expected] == [n <= topk for n in lens], "rows of more than k tokens are ranked"
    tol = Tolerance()
    assert definition.check(inputs, {"topk_indices": out}, expected, tol).passed
    shuffled = out[:, torch.randperm(topk, generator=torch.Generator().manual_seed(1))]
    assert definition.check(inputs, {"topk_indices": shuffled}, expected, tol).passed, "order inside a row is free"
    # the k+1 row: swap its best token for the one it left out (exactly one is left out)
    b = lens.index(topk + 1)
    ids = idx.token_ids(inputs["block_table"][b], topk + 1)
    left_out = sorted(set(ids.tolist()) - set(out[b].tolist()))
    assert len(left_out) == 1
    best = expected[b].scores.argmax()
    wrong = out.clone()
    wrong[b][out[b] == ids[best]] = left_out[0]
    result = definition.check(inputs, {"topk_indices": wrong}, expected, tol)
    assert result.status is Status.INCORRECT_INDICES and f"row {b}: not a top-{topk} set" in result.message
    # the L = k row with one id missing: a count failure
    short = out.clone()
    short[lens.index(topk)][0] = -1
    result = definition.check(inputs, {"topk_indices": short}, expected, tol)
    assert not result.passed and f"expected min({topk}, seq_len = {topk}) = {topk}" in result.message


@pytest.mark.parametrize("topk", [512, 1024])
def test_v4_ties_are_judged_as_sets_modulo_the_tolerance(topk):
    definition = get_definition(idx.name_of(topk))
    lens = [3 * topk, topk + 1]
    axes = definition.axes({"batch_size": 2, "max_num_pages": -(-3 * topk // 64), "num_pages": 600})
    inputs = definition.generate(axes, {"seq_lens": torch.tensor(lens, dtype=torch.int32)},
                                 {"k_index_cache_fp8": {"distinct_keys": 1}}, InputRng(6, CPU))  # fmt: skip
    # every token of a row has the same key, so any k of its tokens is a correct answer
    any_k = torch.stack([idx.token_ids(inputs["block_table"][b], n)[-topk:] for b, n in enumerate(lens)]).int()
    assert definition.check(inputs, {"topk_indices": any_k}, definition.expect(inputs), Tolerance()).passed


def test_min_traffic_counts_k_ids_per_row():
    inputs = _generated({}, [3000, 600, 100])
    floor = {k: get_definition(idx.name_of(k)).min_traffic_bytes({}, inputs) for k in (512, 2048)}
    # top-512 scores the 600-token row too (query + weights + its keys) and writes 1536 fewer ids per row
    assert floor[512] - floor[2048] == 8192 + 256 + 600 * 132 - 3 * 4 * 1536


def test_sglang_serves_only_top2048_and_flashinfer_every_k():
    sglang = load_solution(ROOT / "solutions" / "deepgemm_sglang")
    flashinfer = load_solution(ROOT / "solutions" / "deepgemm_flashinfer")
    for k in (512, 1024):
        reason = sglang.entry_for(idx.name_of(k)).unsupported
        assert reason is not None and "2048" in reason and f"top-{k}" in reason
        assert flashinfer.entry_for(idx.name_of(k)).unsupported is None
    assert sglang.entry_for(idx.NAME).unsupported is None
    for name in ("triton", "reference"):
        entries = load_solution(ROOT / "solutions" / name).entries
        assert all(idx.name_of(k) in entries for k in idx.TOPKS), name


def test_an_unsupported_entry_is_skipped_with_its_reason(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("run", "-w", "indexer_topk512_edges", "-c", "edges_passthrough", "-s", "reference", "-s", "deepgemm_sglang",
                   "--save", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["solution"]: r for r in json.loads(out.read_text())["records"]}
    assert records["deepgemm_sglang"]["status"] == "SKIPPED"
    assert "fast_topk_transform_fused selects exactly 2048" in records["deepgemm_sglang"]["message"]
    assert records["reference"]["status"] == "PASSED"


# --------------------------------------------------------------------------- failures in the summary


def test_the_summary_names_each_failed_case_its_solution_and_reason(tmp_path):
    latencies = {"b1_l128k": {"reference": 9.0, "triton": 0.14, "deepgemm_sglang": 0.066, "deepgemm_flashinfer": 0.027},
                 "b64_l128k": {"reference": 90.0, "triton": 0.52, "deepgemm_sglang": 0.10, "deepgemm_flashinfer": 0.36}}  # fmt: skip
    path = write_results(tmp_path / "r.json", "indexer_long", latencies, peers=("deepgemm_sglang", "deepgemm_flashinfer"),
                         failures={("b64_l128k", "deepgemm_sglang"): Status.INCORRECT_INDICES})  # fmt: skip
    records = load_results(path).records
    listed = failed_cases(records)
    assert [(f.solution, f.case, f.status) for f in listed] == [("deepgemm_sglang", "b64_l128k", "INCORRECT_INDICES")]
    table = failures_table(records)
    row = next(line for line in table.splitlines() if "deepgemm_sglang" in line)
    assert "b64_l128k" in row and "INCORRECT_INDICES" in row and listed[0].reason in row
    # the failed peer was fastest on b64_l128k; the speedup there is over the fastest peer that passed
    triton = next(r for r in records if r.solution == "triton" and r.case == "b64_l128k")
    assert triton.peer == "deepgemm_flashinfer" and triton.peer_speedup == pytest.approx(0.36 / 0.52)
    assert failures_table([r for r in records if not r.failed]) == ""


def test_a_run_prints_the_failed_peer_case_and_the_checkers_reason(tmp_path):
    peer = FIXTURES / "solutions" / "peer_wrong_topk"
    proc = run_cli("run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-c", "smoke_scored", "-s", "reference", "-s", str(peer),
                   "--no-save", "--json-lines")  # fmt: skip
    assert proc.returncode != 0, "a failed case fails the run"
    lines = proc.stderr.splitlines()  # with --json-lines the tables go to stderr, the records and summary to stdout
    header = next(i for i, line in enumerate(lines) if line.startswith("failed case"))
    rows = [line for line in lines[header + 2 :] if line.split()[1:2] == ["peer_wrong_topk"]]
    assert len(rows) == 1 and rows[0].startswith("smoke_scored ") and "INCORRECT_INDICES" in rows[0]
    assert "not a top-2048 set" in rows[0], "the checker's one-line reason"
    summary = json.loads(proc.stdout.splitlines()[-1])["summary"]
    listed = [(f["solution"], f["case"], f["status"]) for f in summary["failures"]]
    assert listed == [("peer_wrong_topk", "smoke_scored", "INCORRECT_INDICES")]
    assert summary["failures"][0]["reason"].startswith("row ")


# --------------------------------------------------------------------------- end to end on CPU


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "cases"),
    [
        ("indexer_long", ["small_ragged_b4_1k_16k", "small_mtp_b4_l8k"]),
        ("indexer_scaled", ["small_b2_l8k_neg", "small_mtp_b4_l8k_x1e3", "small_ragged_b4_1k_16k_flat"]),
        ("indexer_topk512_edges", ["edges_lengths", "edges_mtp", "edges_negative_weights"]),
        ("indexer_topk1024_edges", ["edges_page_boundaries", "edges_ties_three_keys"]),
    ],
)
def test_small_long_context_cases_pass_end_to_end_on_cpu(tmp_path, workload, cases):
    out = tmp_path / "r.json"
    args = ["run", "-w", workload, "-s", "reference", "-s", "triton", "--save", str(out)]
    for case in cases:
        args += ["-c", case]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())["records"]
    assert sorted((r["case"], r["solution"]) for r in records) == sorted((c, s) for c in cases for s in ("reference", "triton"))
    assert all(r["status"] == "PASSED" for r in records)


# --------------------------------------------------------------------------- on a GPU (the lead runs these)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024])
def test_triton_serves_v4_selection_sizes_on_the_gpu(topk):
    # The CUDA top-k with a runtime k after the score kernel: the filtered top-k on every edge case
    # of k, the long-row top-k on the production shapes it is dispatched for.
    from dsa_bench.run.loader import import_entry

    name = idx.name_of(topk)
    kernel, _ = import_entry(load_solution(ROOT / "solutions" / "triton"), name)
    edges = load_workload(ROOT / "workloads" / f"indexer_topk{topk}_edges.yaml")
    long = load_workload(ROOT / "workloads" / f"indexer_topk{topk}_long.yaml")
    cases = [(edges, c) for c in edges.cases] + [(long, c) for c in long.cases if c.id in ("b1_l128k", "b32_ragged_4k_128k", "b64_l128k")]
    for workload, case in cases:
        inputs = build_inputs(workload.definition, case, 11, torch.device("cuda"))
        out = workload.definition.allocate_outputs(workload.definition.axes(case.axes), torch.device("cuda"))
        kernel(*workload.definition.input_args(inputs), out["topk_indices"])
        result = workload.definition.check(inputs, out, workload.definition.expect(inputs), Tolerance())
        assert result.passed, f"{case.id}: {result.message}"


@pytest.mark.gpu
def test_peers_on_v4_selection_sizes_pass_or_skip(tmp_path):
    # FlashInfer's top-k takes k (PASSED where its packages import); SGLang's does not (SKIPPED, its reason).
    out = tmp_path / "r.json"
    proc = run_cli("run", "-w", "indexer_topk512_edges", "-s", "reference", "-s", "triton", "-s", "deepgemm_flashinfer",
                   "-s", "deepgemm_sglang", "--save", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())["records"]
    by_solution: dict[str, set[str]] = {}
    for r in records:
        by_solution.setdefault(r["solution"], set()).add(r["status"])
    assert by_solution["reference"] == {"PASSED"} and by_solution["triton"] == {"PASSED"}
    assert by_solution["deepgemm_flashinfer"] in ({"PASSED"}, {"SKIPPED"})
    assert by_solution["deepgemm_sglang"] == {"SKIPPED"}
