"""The shipped edge workloads and edge cases: what they hold, that every shipped solution passes
them, and that they catch what the contest-shaped workloads cannot (a NaN for a token without a
valid index). (tests/test_workloads.py checks that tools/make_traces.py writes every trace byte for
byte.)

The cases issue 47 added to the shipped traces: decode rows that repeat ids (each entry counts) and insert block
sizes that are not powers of two (3, 61, 576). A kernel that drops repeats, or addresses pages with shifts and
masks, fails them; the reference and the shipped solution pass them through the harness."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES, ROOT, cli, run_cli

from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import mla_decode as md
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import Tolerance
from dsa_bench.definitions.status import Status
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


# --------------------------------------------------------------------------- issue 47: repeated ids, odd block sizes


CPU = torch.device("cpu")
FORMATS = ("v32", "v4", "v41")
REPEATED = "smoke_b2_sq2_k64_bs64_h64_repeated_ids"
ODD_BLOCKS = ("t17_bs3", "t1023_bs61_padded", "t1024_bs576")


def _inputs(workload: str, case_id: str):
    wl = load_workload(ROOT / "workloads" / f"{workload}.yaml")
    case = next(c for c in wl.cases if c.id == case_id)
    return wl, case, build_inputs(wl.definition, case, 3, CPU)


def _first_entries_only(indices: torch.Tensor) -> torch.Tensor:
    """Each row's indices with every repeat of an id set to -1 (a kernel that counts an id once)."""
    out = indices.clone()
    for row in out.view(-1, out.shape[-1]):
        seen: set[int] = set()
        for k, value in enumerate(row.tolist()):
            if value >= 0 and value in seen:
                row[k] = -1
            seen.add(value)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_that_repeat_ids_count_every_entry(fmt):
    wl, _, inputs = _inputs(f"mla_decode_{fmt}_smoke", REPEATED)
    indices = inputs["indices"]
    assert any(len(set(r)) < len([x for x in r if x >= 0]) for r in indices.view(-1, indices.shape[-1]).tolist()), "ids repeat"
    expected = wl.definition.expect(inputs)
    assert wl.definition.check(inputs, expected, expected, wl.settings.tolerance).passed
    record = md.FORMAT_OF[wl.definition.name]
    once = md.decode(record, inputs["q"], inputs["kv_cache"], _first_entries_only(indices), inputs["sm_scale"], inputs["attn_sink"],
                     inputs.get("topk_length"))  # fmt: skip
    result = wl.definition.check(inputs, once, expected, wl.settings.tolerance)
    assert result.status is Status.INCORRECT_NUMERICAL, "counting a repeated id once changes the softmax"


def _power_of_two_slots(slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """The slots a writer reaches when it splits an id with a shift and a mask, as if the block size were a power of two."""
    shift = max(0, (block_size - 1).bit_length())
    block, offset = slots >> shift, slots & ((1 << shift) - 1)
    return torch.where(slots >= 0, block * block_size + offset.clamp_max(block_size - 1), slots)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case_id", ODD_BLOCKS)
def test_odd_block_sizes_catch_a_power_of_two_address(fmt, case_id):
    wl, case, inputs = _inputs(f"kv_insert_{fmt}_small", case_id)
    definition = wl.definition
    expected = definition.expect(inputs)
    outputs = definition.allocate_outputs(definition.axes(case.axes), CPU)
    definition.reference(*definition.input_args(inputs), outputs["kv_cache"])
    assert definition.check(inputs, outputs, expected, Tolerance()).passed
    bs = case.axes["block_size"]
    wrong = _power_of_two_slots(inputs["slot_mapping"], bs)
    assert not torch.equal(wrong, inputs["slot_mapping"])
    mutant = definition.allocate_outputs(definition.axes(case.axes), CPU)
    capacity = case.axes["num_blocks"] * bs
    args = definition.input_args({**inputs, "slot_mapping": torch.where(wrong < capacity, wrong, -1)})
    definition.reference(*args, mutant["kv_cache"])
    assert definition.check(inputs, mutant, expected, Tolerance()).status is not Status.PASSED


def test_an_insert_of_no_tokens_is_refused(tmp_path):
    line = (ROOT / "traces" / "kv_insert_v32_smoke.jsonl").read_text().splitlines()[0].replace('"num_tokens":1', '"num_tokens":0')
    (tmp_path / "t.jsonl").write_text(line + "\n")
    (tmp_path / "w.yaml").write_text("name: t\ndefinition: dsa_kv_insert_v32_fp8\ntrace: t.jsonl\n")
    proc = cli("validate", str(tmp_path / "w.yaml"))
    assert proc.returncode == 2 and "axes.num_tokens: expected a number >= 1, got 0" in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_new_cases_pass_through_the_harness_on_cpu(fmt):
    """Reference and the shipped Triton solution (interpreter) on the new cases, as `dsa-bench run` runs them."""
    proc = run_cli("run", "-w", f"mla_decode_{fmt}_smoke", "-c", REPEATED, "-s", "reference", "-s", "triton", "--device", "cpu",
                   "--no-save")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("1/1") == 2, proc.stdout
    args = [arg for case_id in ODD_BLOCKS for arg in ("-c", case_id)]
    proc = run_cli("run", "-w", f"kv_insert_{fmt}_small", *args, "-s", "reference", "-s", "triton", "--device", "cpu", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("3/3") == 2, proc.stdout


def test_v32_scales_of_an_explicit_cache_must_be_powers_of_two():
    wl, case, inputs = _inputs("mla_decode_v32_smoke", "smoke_b2_sq1_k64_bs64_h64")
    definition, axes = wl.definition, wl.definition.axes(case.axes)
    record = md.FORMAT_OF[definition.name]
    cache = inputs["kv_cache"].clone()
    given = {"kv_cache": cache, "indices": inputs["indices"]}
    assert definition.validate(axes, given, {}) == []
    slot = int(inputs["indices"][0, 0, 5])
    block, offset = divmod(slot, case.axes["block_size"])
    # a V3.2 record is per token: 512 FP8 values, then its 4 fp32 scales
    cache[block, offset, 0, record.value_bytes : record.value_bytes + 4].view(torch.float32)[0] = 0.3
    problems = definition.validate(axes, given, {})
    assert problems == [f"inputs.kv_cache: the record at slot {slot} has scale 0 = 0.30000001192092896; V3.2 scales must be "
                        "positive powers of two (FlashMLA casts them to bf16, exact only for powers of two)"]  # fmt: skip


def test_the_rope_rotation_rounds_its_two_products_separately():
    """The contract: e·c − o·s is round(round(e·c) − round(o·s)) in float32, never a fused multiply-add."""
    from dsa_bench.definitions.kv_insert import rotate_rope

    gen = torch.Generator().manual_seed(47)
    rope = torch.randn(4096, 64, generator=gen).bfloat16()
    positions = torch.arange(4096) % 512
    angles = torch.rand(512, 32, generator=gen, dtype=torch.float64) * 6.3
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1).float()
    got = rotate_rope(rope, positions, cos_sin)
    e, o = rope.float()[:, 0::2], rope.float()[:, 1::2]
    c, s = cos_sin[positions, :32], cos_sin[positions, 32:]
    assert torch.equal(got[:, 0::2], (e * c) - (o * s)) and torch.equal(got[:, 1::2], (o * c) + (e * s))
    fused = (e.double() * c.double() - (o * s).double()).float()  # one product kept exact, as an FMA does
    assert not torch.equal(got[:, 0::2], fused), "an FMA rounds differently on some elements"
