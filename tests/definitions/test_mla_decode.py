"""FlashMLA-style sparse decode definitions: the reference against a per-row spec, the exact empty-row and sink
conventions, topk_length, page boundaries, NaN-filled caches, mutants that must fail, and FlashMLA itself (GPU)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
import types

import pytest
import torch
from conftest import ROOT, run_cli

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import mla_decode as md
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.kv_records import V4, KvRecordFormat, RecordParts
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.workloads import build_inputs, load_trace, load_workload

CPU = torch.device("cpu")
FORMATS = ("v32", "v4", "v41")
ROPE_FORMATS = ("v32", "v4")  # V4.1 quantizes its RoPE dims with the rest: no separate RoPE part
SHORT_CASE = "smoke_b3_sq2_k128_bs61_h128_short_padded"  # empty, short and scattered rows; padded pages; short topk_length


def _workload(fmt: str, kind: str = "smoke"):
    return load_workload(ROOT / "workloads" / f"mla_decode_{fmt}_{kind}.yaml")


def _inputs(fmt: str, case_id: str = SHORT_CASE, seed: int = 3, device: torch.device = CPU):
    wl = _workload(fmt)
    case = next(c for c in wl.cases if c.id == case_id)
    return wl.definition, case, build_inputs(wl.definition, case, seed, device), wl.settings.tolerance


def _verdict(definition, inputs, outputs):
    return definition.check(inputs, outputs, definition.expect(inputs), Tolerance(lse_atol=1e-4))  # the decode workloads' own


def _record(fmt: KvRecordFormat, kv_cache: torch.Tensor, slot: int) -> torch.Tensor:
    """One record decoded from its page's bytes at the descriptor's offsets, in float64 (the spec's own reader)."""
    bs = kv_cache.shape[1]
    block, offset = divmod(slot, bs)
    page = kv_cache[block].reshape(-1)  # the page's packed bytes (contiguous inside a page)
    at = fmt.offsets(offset, bs)
    values = page[at["data"] : at["data"] + fmt.value_bytes].view(torch.float8_e4m3fn).double()
    if fmt.scale_dtype == "fp32":
        scales = page[at["scales"] : at["scales"] + 4 * fmt.num_scales].view(torch.float32).double()
    else:
        scales = 2.0 ** (page[at["scales"] : at["scales"] + fmt.num_scales].double() - 127)
    nope = (values.reshape(fmt.num_scales, fmt.scale_tile) * scales[:, None]).reshape(-1)
    if not fmt.rope_dims:
        return nope
    return torch.cat([nope, page[at["rope"] : at["rope"] + fmt.rope_bytes].view(torch.bfloat16).double()])


def _spec(fmt: KvRecordFormat, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition written out row by row, head by head, in float64."""
    q, indices = inputs["q"].double(), inputs["indices"]
    b, s_q, h_q, _ = q.shape
    topk = indices.shape[-1]
    out = torch.zeros(b, s_q, h_q, md.D_V, dtype=torch.float64)
    lse = torch.full((b, s_q, h_q), math.inf, dtype=torch.float64)
    for i in range(b):
        length = int(inputs["topk_length"][i]) if "topk_length" in inputs else topk
        for s in range(s_q):
            ids = [int(x) for x in indices[i, s, :length] if int(x) >= 0]
            if not ids:
                continue
            keys = torch.stack([_record(fmt, inputs["kv_cache"], x) for x in ids])
            for h in range(h_q):
                logits = (keys @ q[i, s, h]) * inputs["sm_scale"]
                lse[i, s, h] = torch.logsumexp(logits, 0)
                sink = float(inputs["attn_sink"][h])
                gate = 1.0 / (1.0 + math.exp(sink - float(lse[i, s, h])))
                out[i, s, h] = torch.softmax(logits, 0) @ keys[:, : md.D_V] * gate
    return out, lse


# --------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_matches_the_per_row_spec(fmt):
    definition, _, inputs, _ = _inputs(fmt)
    ref = definition.expect(inputs)
    out, lse = _spec(md.FORMAT_OF[definition.name], inputs)
    assert torch.equal(torch.isinf(ref["lse"]), torch.isinf(lse)) and bool(torch.isinf(lse).any()) and bool(torch.isfinite(lse).any())
    finite = torch.isfinite(lse)
    assert float((ref["lse"].double() - lse)[finite].abs().max()) < 1e-5
    # out is bf16: within one bf16 rounding of the float64 value
    assert float((ref["out"].double() - out).abs().max()) <= float(out.abs().max()) * 2**-8


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_passes_its_own_check_and_generation_is_deterministic(fmt):
    definition, _, inputs, tol = _inputs(fmt)
    again = build_inputs(definition, _inputs(fmt)[1], 3, CPU)
    for name, value in inputs.items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(again[name])), name  # the harness and the worker agree
    ref = definition.reference(*definition.input_args(inputs))
    assert definition.check(inputs, ref, definition.expect(inputs), tol).status is Status.PASSED


@pytest.mark.parametrize(("fmt", "rope_in_v"), [("v32", False), ("v4", True)])
def test_v_is_the_first_512_dims_of_the_record(fmt, rope_in_v):
    # FlashMLA's out = P @ gathered_kv[..., :512]: V3.2's V leaves the 64 RoPE dims out, V4's holds them
    definition, _, inputs, _ = _inputs(fmt, "smoke_b2_sq1_k64_bs64_h64")
    record = md.FORMAT_OF[definition.name]
    q = inputs["q"].clone()
    q[..., record.d_qk - record.rope_dims :] = 0  # the RoPE dims no longer reach the logits
    cache = inputs["kv_cache"].clone()
    record.rope(cache, 64).mul_(3)
    before = definition.expect(dict(inputs, q=q))
    after = definition.expect(dict(inputs, q=q, kv_cache=cache))
    assert torch.equal(before["lse"], after["lse"])
    assert (not torch.equal(before["out"], after["out"])) == rope_in_v


# --------------------------------------------------------------------------- conventions


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_rows_are_exactly_zero_and_plus_inf(fmt):
    definition, _, inputs, _ = _inputs(fmt)
    ref = definition.expect(inputs)
    empty = ~md.counted(inputs["indices"], inputs.get("topk_length")).any(dim=-1)
    assert bool(empty.any())
    assert bool((ref["out"][empty] == 0).all()) and bool(torch.isposinf(ref["lse"][empty]).all())
    b, s = (int(i) for i in torch.nonzero(empty)[0])
    wrong = {k: v.clone() for k, v in ref.items()}
    wrong["out"][b, s, 3, 100] = 1e-3  # within atol, still not 0
    result = _verdict(definition, inputs, wrong)
    assert result.status is Status.INCORRECT_NUMERICAL
    assert f"batch {b} query {s} has no counted index, so its out must be exactly 0; head 3 column 100" in result.message
    wrong = {k: v.clone() for k, v in ref.items()}
    wrong["lse"][b, s] = float("-inf")  # the sparse-attention definition's convention, not FlashMLA's
    result = _verdict(definition, inputs, wrong)
    assert "lse must be exactly +inf" in result.message


def test_all_invalid_case_has_only_empty_rows():
    definition, _, inputs, tol = _inputs("v4", "smoke_b2_sq1_k64_bs64_h64_all_invalid")
    assert bool((inputs["indices"] == -1).all())
    ref = definition.expect(inputs)
    assert bool(torch.isposinf(ref["lse"]).all()) and not bool(ref["out"].float().any())
    assert definition.check(inputs, ref, definition.expect(inputs), tol).passed


@pytest.mark.parametrize("fmt", FORMATS)
def test_sink_scales_out_and_leaves_lse(fmt):
    definition, _, inputs, _ = _inputs(fmt)
    sink = inputs["attn_sink"]
    assert bool(torch.isneginf(sink).any()) and bool(torch.isfinite(sink).any())
    with_sink = definition.expect(inputs)
    without = definition.expect(dict(inputs, attn_sink=torch.full_like(sink, float("-inf"))))
    assert torch.equal(with_sink["lse"], without["lse"])
    lse = without["lse"]
    gate = torch.where(torch.isneginf(sink), 1.0, 1 / (1 + torch.exp(sink - lse)))
    finite = torch.isfinite(lse)
    expect = (without["out"].float() * gate[..., None])[finite]
    assert torch.allclose(with_sink["out"].float()[finite], expect, atol=2e-3, rtol=1e-2)
    assert float(gate[finite].min()) < 0.5  # the generated sinks sit near the lse: ignoring them is visible
    result = _verdict(definition, inputs, without)
    assert result.status is Status.INCORRECT_NUMERICAL and result.message.startswith("out:")


@pytest.mark.parametrize("fmt", ("v4", "v41"))
def test_entries_past_topk_length_are_ignored_and_point_at_nan(fmt):
    definition, _, inputs, _ = _inputs(fmt)
    record = md.FORMAT_OF[definition.name]
    lengths = inputs["topk_length"]
    assert int((lengths == 0).sum()) == 1 and int((lengths < 128).sum()) == 2
    i = int(torch.nonzero((lengths > 0) & (lengths < 128))[0])
    past = inputs["indices"][i, :, int(lengths[i]) :]
    past = past[past >= 0]
    inside = set(inputs["indices"][md.counted(inputs["indices"], lengths)].tolist())
    lone = [int(x) for x in past if int(x) not in inside]
    assert lone and all(bool(torch.isnan(_record(record, inputs["kv_cache"], x)).all()) for x in lone)
    # rewriting what lies past topk_length changes nothing
    ref = definition.expect(inputs)
    moved = inputs["indices"].clone()
    moved[i, :, int(lengths[i]) :] = -1
    assert torch.equal(definition.expect(dict(inputs, indices=moved))["out"], ref["out"])
    # a kernel that ignores topk_length reads those NaN records and fails
    ignoring = md.decode(record, inputs["q"], inputs["kv_cache"], inputs["indices"], inputs["sm_scale"], inputs["attn_sink"], None)
    result = _verdict(definition, inputs, ignoring)
    assert result.status is Status.INCORRECT_NUMERICAL and "nan" in result.message


@pytest.mark.parametrize("fmt", FORMATS)
def test_indices_reach_page_boundaries_and_the_cache_is_nan_elsewhere(fmt):
    definition, case, inputs, _ = _inputs(fmt)
    record = md.FORMAT_OF[definition.name]
    bs, blocks = case.axes["block_size"], case.axes["num_blocks"]
    used = set(inputs["indices"][inputs["indices"] >= 0].tolist())
    assert set(md.boundary_slots(blocks, bs)) <= used
    assert {0, bs - 1, bs, 2 * bs - 1, blocks * bs - 1} <= used
    assert inputs["kv_cache"].stride(0) > record.packed_page_bytes(bs)  # a view of a padded backing
    written = set(inputs["indices"][md.counted(inputs["indices"], inputs.get("topk_length"))].tolist())
    every = torch.arange(blocks * bs)
    rows = record.dequantize(record.read(inputs["kv_cache"], bs, every))
    finite = torch.isfinite(rows)
    assert {int(s) for s in torch.nonzero(finite.all(dim=1)).flatten()} == written
    assert bool(torch.isnan(rows[~finite.all(dim=1)]).all()), "every unreferenced record is NaN in every dim"


# --------------------------------------------------------------------------- mutants that must fail


def _shifted_rope_read(true_read):
    def read(self: KvRecordFormat, cache, block_size, slots):
        parts = true_read(self, cache, block_size, slots)
        if not self.rope_dims:
            return parts
        pages = self.raw_pages(cache)
        block, offset = slots // block_size, slots % block_size
        at = torch.tensor([self.offsets(int(o), block_size)["rope"] - 16 for o in offset])  # 8 dims too early
        rope = pages[block[:, None], at[:, None] + torch.arange(self.rope_bytes)]
        return RecordParts(parts.values, parts.scales, rope)

    return read


@pytest.mark.parametrize("fmt", ROPE_FORMATS)
def test_rope_read_from_the_wrong_offset_fails(fmt, monkeypatch):
    definition, _, inputs, _ = _inputs(fmt)
    expected = definition.expect(inputs)
    monkeypatch.setattr(KvRecordFormat, "read", _shifted_rope_read(KvRecordFormat.read))
    mutant = definition.reference(*definition.input_args(inputs))
    monkeypatch.undo()
    assert not torch.equal(mutant["lse"], expected["lse"])
    result = definition.check(inputs, mutant, expected, _workload(fmt).settings.tolerance)
    assert result.status is Status.INCORRECT_NUMERICAL, result


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_wrong_gather_hits_nan_and_fails(fmt):
    definition, case, inputs, tol = _inputs(fmt)
    record = md.FORMAT_OF[definition.name]
    capacity = case.axes["num_blocks"] * case.axes["block_size"]
    neighbour = torch.where(inputs["indices"] >= 0, (inputs["indices"] + 1) % capacity, -1)
    args = (inputs["q"], inputs["kv_cache"], neighbour, inputs["sm_scale"], inputs["attn_sink"], inputs.get("topk_length"))
    result = definition.check(inputs, md.decode(record, *args), definition.expect(inputs), tol)
    assert result.status is Status.INCORRECT_NUMERICAL and "got nan" in result.message
    # a kernel that ignores the padded page stride (pages taken as packed) fails too
    cache = inputs["kv_cache"]
    packed = torch.as_strided(cache, cache.shape, (record.packed_page_bytes(case.axes["block_size"]), *cache.stride()[1:]))
    args = (inputs["q"], packed, inputs["indices"], inputs["sm_scale"], inputs["attn_sink"], inputs.get("topk_length"))
    result = definition.check(inputs, md.decode(record, *args), definition.expect(inputs), tol)
    assert result.status is Status.INCORRECT_NUMERICAL


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_lse_off_by_one_equal_slot_fails(fmt):
    # ln(2048/2047) = 4.9e-4 is the lse shift of one of 2048 equal-weight slots left out; the absolute
    # tolerance (1e-4) rejects it, FlashMLA's relative 8.01/65536 of |lse| ~ 8 (9.8e-4) would not
    definition, _, inputs, tol = _inputs(fmt, "smoke_b2_sq1_k64_bs64_h64")
    ref = definition.expect(inputs)
    off = {k: v.clone() for k, v in ref.items()}
    off["lse"] += math.log(2048 / 2047)
    result = definition.check(inputs, off, ref, tol)
    assert result.status is Status.INCORRECT_NUMERICAL and result.message.startswith("lse:") and "absolute" in result.message
    off["lse"] = ref["lse"] + 0.5 * tol.lse_atol
    assert definition.check(inputs, off, ref, tol).passed


# --------------------------------------------------------------------------- validation, workloads, traffic


def _trace(tmp_path, fmt: str, inputs: dict | None = None, **axes):
    definition = get_definition(f"dsa_mla_decode_{fmt}_fp8")
    record = md.FORMAT_OF[definition.name]
    base = {"b": 2, "s_q": 1, "h_q": 64, "topk": 64, "s_k": 256, "num_blocks": 8, "block_size": 64, "page_bytes": record.page_stride(64)}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "c", "axes": {**base, **axes}, "inputs": inputs or {}}) + "\n")
    return path, definition


@pytest.mark.parametrize(("fmt", "axes", "message"), [
    ("v32", {"h_q": 48}, "axes.h_q = 48 must be one of 16, 32, 64, 128"),
    ("v4", {"h_q": 8}, "axes.h_q = 8 must be one of 16, 32, 64, 128"),
    ("v32", {"s_q": 5, "num_blocks": 24}, "axes.s_q = 5 must be in [1, 4]"),
    ("v4", {"topk": 100}, "axes.topk = 100 must be a multiple of 64"),
    ("v4", {"page_bytes": V4.page_stride(64) + 16}, f"must be a multiple of the V4 TMA stride {V4.tma_stride} B"),
    ("v41", {"num_blocks": 1}, "raise axes.num_blocks"),
])  # fmt: skip
def test_bad_cases_are_refused_naming_the_case_and_field(tmp_path, fmt, axes, message):
    path, definition = _trace(tmp_path, fmt, **axes)
    with pytest.raises(DsaBenchError) as err:
        load_trace(path, definition)
    assert "case 'c'" in str(err.value) and message in str(err.value)
    assert err.value.where == f"{path}:1"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("h_q", "s_q"), [(16, 1), (32, 4), (16, 4), (128, 3)])
def test_tp_head_counts_and_mtp_query_tokens_are_accepted(tmp_path, fmt, h_q, s_q):
    path, definition = _trace(tmp_path, fmt, h_q=h_q, s_q=s_q, num_blocks=24)
    (case,) = load_trace(path, definition)
    inputs = build_inputs(definition, case, 5, CPU)
    assert tuple(inputs["q"].shape) == (2, s_q, h_q, md.FORMAT_OF[definition.name].d_qk)
    ref = definition.expect(inputs)
    assert tuple(ref["out"].shape) == (2, s_q, h_q, md.D_V) and bool(torch.isfinite(ref["lse"]).all())


@pytest.mark.parametrize("value", [1e4, -1e4, 88.8, 1e30, 3e38, -3e38, 0])
def test_a_fixed_sink_value_gives_every_head_that_sink(tmp_path, value):
    path, definition = _trace(tmp_path, "v32", inputs={"attn_sink": {"type": "random", "params": {"value": value}}}, h_q=16)
    (case,) = load_trace(path, definition)
    sink = build_inputs(definition, case, 5, CPU)["attn_sink"]
    assert sink.dtype == torch.float32 and torch.equal(sink, torch.full((16,), float(value)))


@pytest.mark.parametrize(("params", "message"), [
    ({"value": 1e39}, "attn_sink.params.value = 1e+39 must be a number finite in float32"),
    ({"value": "big"}, "attn_sink.params.value = 'big' must be a number finite in float32"),
    ({"value": True}, "attn_sink.params.value = True must be a number finite in float32"),
    ({"value": float("-inf")}, "for no sink use off: true"),
    ({"value": 1.0, "off": True}, "value and off: true contradict each other"),
    ({"scale": 1.0}, "scale"),
])  # fmt: skip
def test_bad_sink_params_are_refused(tmp_path, params, message):
    path, definition = _trace(tmp_path, "v4", inputs={"attn_sink": {"type": "random", "params": params}})
    with pytest.raises(DsaBenchError) as err:
        load_trace(path, definition)
    assert "case 'c'" in str(err.value) and message in str(err.value)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sink", [3e38, 1e30, 88.8, -1e4, -3e38])
def test_extreme_sinks_keep_empty_rows_exact_in_the_reference(fmt, sink):
    definition, _, inputs, tol = _inputs(fmt)
    inputs = dict(inputs, attn_sink=torch.full_like(inputs["attn_sink"], sink))
    ref = definition.expect(inputs)
    empty = torch.isposinf(ref["lse"])
    assert bool(empty.any()) and not bool(ref["out"].isnan().any())
    assert ref["out"][empty].eq(0).all()
    _, exact_lse = md.attend(md.FORMAT_OF[definition.name], *definition.input_args(inputs), dtype=torch.float64)
    assert torch.equal(torch.isposinf(exact_lse), empty)
    if sink > 100:  # far above every lse: the sink takes all the weight
        assert ref["out"].eq(0).all()
    assert definition.check(inputs, ref, ref, tol).status is Status.PASSED


def test_shipped_workloads_cover_the_grid():
    for fmt in ("v32", "v4"):
        for h_q in (128, 64):
            wl = _workload(fmt, f"h{h_q}")
            assert [c.axes["b"] for c in wl.cases] == [2, 64, 74, 128]
            assert {(c.axes["h_q"], c.axes["s_q"], c.axes["s_k"], c.axes["topk"], c.axes["block_size"]) for c in wl.cases} == {
                (h_q, 2, 32768, 2048, 64)}
            assert wl.settings.warmup >= wl.settings.input_sets  # FlashMLA's schedule is filled before timing
    for fmt in FORMATS:
        mix = _workload(fmt, "mix")
        axes = [c.axes for c in mix.cases if not c.id.startswith("tiny_")]  # FlashMLA's grid; the tiny cases below
        assert {a["b"] for a in axes} == {4, 74, 321} and {a["s_q"] for a in axes} == {1, 3}
        assert {a["topk"] for a in axes} == {64, 9 * 64, 2048} and {a["h_q"] for a in axes} == {64, 128}
        assert {2, 53, 61, 64, 69, 9 * 64} <= {a["block_size"] for a in axes}
        record = md.FORMAT_OF[mix.definition.name]
        assert any(a["page_bytes"] > record.page_stride(a["block_size"]) for a in axes)
        params = [c.inputs[n].params for c in mix.cases for n in c.inputs]
        assert {"off": True} in params and any(p.get("empty_rows") == 12 for p in params)
        assert any(p.get("padding") == "scattered" for p in params) and any("short_rows" in p for p in params)
        assert any("short" in p for p in params) == (fmt != "v32")
        assert mix.settings.tolerance == Tolerance(lse_atol=1e-4)


def test_shipped_tp_and_topk_workloads_and_the_mixes_tiny_cases():
    contexts = {1: 131072, 8: 131072, 32: 65536, 64: 65536, 128: 32768}
    for fmt in ("v32", "v4"):
        for tp, h_q in (("tp8", 16), ("tp4", 32)):
            wl = _workload(fmt, tp)
            got = sorted((c.axes["s_q"], c.axes["b"], c.axes["s_k"]) for c in wl.cases)
            assert got == sorted((s_q, b, s_k) for s_q in (1, 2) for b, s_k in contexts.items()), tp
            assert {(c.axes["h_q"], c.axes["topk"], c.axes["block_size"]) for c in wl.cases} == {(h_q, 2048, 64)}
            assert all(not c.inputs["attn_sink"].params for c in wl.cases)  # sink on: drawn per head
            assert wl.settings.warmup >= wl.settings.input_sets
    for topk in (512, 1024):
        wl = _workload("v4", f"topk{topk}")
        assert {c.axes["topk"] for c in wl.cases} == {topk} and {c.axes["h_q"] for c in wl.cases} == {16, 128}
        assert [c.axes["b"] for c in wl.cases if c.axes["h_q"] == 128] == [2, 64, 74, 128]
        assert wl.settings.warmup >= wl.settings.input_sets
    for fmt in FORMATS:
        tiny = [c for c in _workload(fmt, "mix").cases if c.id.startswith("tiny_")]
        assert {c.axes["h_q"] for c in tiny} >= {16, 32} and max(c.axes["s_q"] for c in tiny) == 4
        assert {c.axes["topk"] for c in tiny} >= {512, 1024}
        assert all(c.inputs["indices"].params.get("empty_rows", 0) > 0 for c in tiny)  # every one has empty rows
        sinks = {c.inputs["attn_sink"].params.get("value") for c in tiny}
        assert {1e4, -1e4, 88.8, 1e30, 3e38, -3e38} <= sinks
        assert max(c.axes["b"] * c.axes["s_q"] * c.axes["h_q"] * c.axes["topk"] for c in tiny) <= 2**16  # CPU-sized


def _tiny_mix_run(fmt: str, cases: str) -> str:
    proc = run_cli("run", "-w", f"mla_decode_{fmt}_mix", "-c", cases, "-s", "reference", "-s", "triton", "--device", "cpu", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow  # a harness run (~20 s on two cores); test_triton_decode's extreme-sink test is the fast guard
def test_extreme_sink_cases_pass_the_reference_and_triton_on_cpu():
    # the old Triton decode wrote NaN into the empty rows of the 3e38 case (the harness run catches it)
    out = _tiny_mix_run("v32", "tiny_*_sink_*3e38")  # 3e38 and -3e38: past FLT_MAX / log2(e) both ways
    assert out.count("2/2") == 2, out


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_tiny_mix_case_passes_the_reference_and_triton_on_cpu(fmt):
    out = _tiny_mix_run(fmt, "tiny_*")
    assert out.count("11/11") == 2, out


def test_min_traffic_counts_each_record_once():
    definition, case, inputs, _ = _inputs("v4")
    record = md.FORMAT_OF[definition.name]
    mask = md.counted(inputs["indices"], inputs["topk_length"])
    b, s_q, topk = inputs["indices"].shape
    h_q = case.axes["h_q"]
    entries = s_q * int(inputs["topk_length"].sum())
    rows = int(mask.any(dim=-1).sum())
    distinct = len(set(inputs["indices"][mask].tolist()))
    want = (4 * entries + 4 * b + 2 * h_q * 512 * rows + (448 + 7 + 128) * distinct + 4 * h_q + (2 * 512 + 4) * h_q * b * s_q)
    assert record.value_bytes + record.num_scales + record.rope_bytes == 448 + 7 + 128
    assert definition.min_traffic_bytes(definition.axes(case.axes), inputs) == want


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_passes_the_smoke_workload(fmt):
    proc = run_cli("run", "-w", f"mla_decode_{fmt}_smoke", "-s", "reference", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4/4" in proc.stdout


# --------------------------------------------------------------------------- FlashMLA on the GPU


def _flashmla_entry():
    pytest.importorskip("flash_mla", reason="flash_mla (sgl-flash-mla) is not importable")
    package = "dsa_test_flashmla_peer"  # a package rooted at the solution folder, as the harness imports an entry
    if package not in sys.modules:
        module = types.ModuleType(package)
        module.__path__ = [str(ROOT / "solutions" / "flashmla")]
        sys.modules[package] = module
    return importlib.import_module(f"{package}.entry")


#: Cases of each workload the FlashMLA test runs: the first few of the large ones (b = 2 of the production
#: shapes; b = 1 and 8 at s_q 1 of the TP ones, padded to 64 heads; b = 2 at h_q 128 of the top-k ones).
FLASHMLA_FIRST_CASES = {"h128": 1, "tp8": 2, "tp4": 2, "topk512": 1, "topk1024": 1}


@pytest.mark.gpu
@pytest.mark.parametrize(("fmt", "kind"), [(f, k) for f in ROPE_FORMATS for k in ("smoke", "mix", "h128", "tp8", "tp4")]
                         + [("v4", "topk512"), ("v4", "topk1024")])  # fmt: skip
def test_flashmla_decodes_dsa_bench_records(fmt, kind):
    """FlashMLA reads caches written by kv_records' V3.2 and V4 writers and matches the reference, call after call
    (16 and 32 heads padded to 64 by the entry, the mixes' extreme sinks included)."""
    entry = _flashmla_entry()
    kernel = entry.decode_v32 if fmt == "v32" else entry.decode_v4
    device = torch.device("cuda")
    wl = _workload(fmt, kind)
    cases = wl.cases[: FLASHMLA_FIRST_CASES.get(kind, len(wl.cases))]
    worst_out = worst_lse = 0.0
    for case in cases:
        definition = wl.definition
        inputs = build_inputs(definition, case, 11, device)
        axes = definition.axes(case.axes)
        # the second call reuses the schedule the first one filled; with 16 or 32 heads the second call
        # captures the padded call's graph and the third replays it, each on queries redrawn in place
        for call in range(3):
            if call:
                inputs["q"].copy_(definition.redraw(axes, InputRng(11 + call, device))["q"])
            out, lse = kernel(*definition.input_args(inputs))  # the entries return FlashMLA's own outputs
            outputs = {"out": out, "lse": lse}
            torch.cuda.synchronize()
            expected = definition.expect(inputs)  # after the candidate ran, as FlashMLA's own test does
            result = definition.check(inputs, outputs, expected, wl.settings.tolerance)
            assert result.passed, f"{case.id} call {call}: {result.message}"
            finite = torch.isfinite(expected["lse"])
            worst_out = max(worst_out, float((outputs["out"].float() - expected["out"].float()).abs().max()))
            if bool(finite.any()):
                worst_lse = max(worst_lse, float((outputs["lse"] - expected["lse"])[finite].abs().max()))
    if kind in ("tp8", "tp4"):
        assert entry.PADDED.disabled_reason is None, entry.PADDED.disabled_reason
        assert any(padded.graph is not None for padded in entry.PADDED.calls.values())
    print(f"flashmla {fmt} {kind}: max |out diff| {worst_out:.3g}, max |lse diff| {worst_lse:.3g}")
