"""The attention and decode ``out`` check that scales with the row: each row's largest error against one bf16
ulp of that row's largest value plus the noise of bf16-rounded probabilities (checks.row_tolerances). A 2 %
scaling of long decode rows fails, while the reference and a kernel with bf16 probabilities pass; a row is
empty by its indices, not by the reference's lse; sm_scale is bounded at validation."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import ROOT, load_script

from dsa_bench.definitions import mla_decode as md
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.checks import bf16_ulp, compare_close, compare_rows, row_tolerances
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.workloads import load_workload

CPU = torch.device("cpu")
DECODE = {"v32": md.DEFINITIONS[0], "v4": md.DEFINITIONS[1], "v41": md.DEFINITIONS[2]}


def long_rows(fmt: str, seed: int, b: int = 2, h_q: int = 64) -> tuple[object, dict]:
    """A decode case whose every row counts all 2048 entries (no sink), built on the CPU."""
    definition = DECODE[fmt]
    record = md.FORMAT_OF[definition.name]
    page = -(-record.packed_page_bytes(64) // record.tma_stride) * record.tma_stride
    axes = definition.axes({"b": b, "s_q": 1, "h_q": h_q, "topk": 2048, "s_k": 4096, "num_blocks": 2 * b * 64 + 8,
                            "block_size": 64, "page_bytes": page})  # fmt: skip
    params = {"attn_sink": {"off": True}}
    assert not definition.validate(axes, {}, params)
    return definition, definition.generate(axes, {}, params, InputRng(seed, CPU))


def test_bf16_ulp():
    values = torch.tensor([1.0, 1.5, 0.1, 3.0, 0.0, -2.0])
    assert bf16_ulp(values).tolist() == [2**-7, 2**-7, 2**-11, 2**-6, 0.0, 2**-6]


@pytest.mark.parametrize("fmt", list(DECODE))
def test_a_two_percent_scaling_of_long_rows_fails_while_bf16_probabilities_pass(fmt):
    emulated_kernel = load_script("mla_decode_error").emulated_kernel
    definition, inputs = long_rows(fmt, seed=11)
    expected = definition.expect(inputs)
    tol = Tolerance(lse_atol=md.LSE_ATOL)
    assert definition.check(inputs, expected, expected, tol).passed
    out, lse = emulated_kernel(md.FORMAT_OF[definition.name], inputs)  # split-K, log2 domain, bf16 probabilities
    result = definition.check(inputs, {"out": out, "lse": lse}, expected, tol)
    assert result.passed, result.message
    bound = row_tolerances(expected["out"], expected["out_noise"])
    worst = float(((out.float() - expected["out"].float()).abs().amax(-1) / bound).max())
    assert worst < 0.8, f"a correct kernel's rows reach {worst:.2f} of their bound"
    # the planted defect: every long row 2 % small
    scaled = (expected["out"].float() * 0.98).bfloat16()
    assert compare_close("out", scaled, expected["out"], tol).passed, "element-wise atol/rtol = 1e-2 let it through"
    result = definition.check(inputs, {"out": scaled, "lse": expected["lse"]}, expected, tol)
    assert result.status is Status.INCORRECT_NUMERICAL
    rows = 2 * 64
    assert result.message.startswith(f"out: {rows} of {rows} rows out of tolerance"), result.message
    assert "batch 0 query 0 head 0" in result.message


def attention_with_bf16_probabilities(inputs: dict) -> dict:
    """The attention's math with the weights rounded to bf16 before the value product (as mma kernels do)."""
    output, lse = attn.attend(**inputs)
    idx = inputs["sparse_indices"].long()
    padding = idx < 0
    rows = idx.clamp_min(0).flatten()
    tokens = idx.shape[0]
    ckv = inputs["ckv_cache"].reshape(-1, 512).index_select(0, rows).view(tokens, -1, 512).float().masked_fill(padding[..., None], 0.0)
    kpe = inputs["kpe_cache"].reshape(-1, 64).index_select(0, rows).view(tokens, -1, 64).float()
    s = float(inputs["sm_scale"])
    logits = (inputs["q_nope"].float() @ ckv.mT + inputs["q_pe"].float() @ kpe.mT) * s
    logits = logits.masked_fill(padding[:, None, :], float("-inf"))
    peak = logits.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    weights = torch.exp(logits - peak)
    out = (weights.bfloat16().float() @ ckv) / weights.sum(-1).clamp_min(1.0)[..., None]
    return {"output": out.bfloat16(), "lse": lse}


@pytest.mark.parametrize("sm_scale", [None, 0.04])
def test_attention_rows_pass_with_bf16_probabilities_and_fail_scaled(sm_scale):
    axes = attn.DEFINITION.axes({"num_tokens": 4, "num_pages": 160})
    given = {} if sm_scale is None else {"sm_scale": sm_scale}
    params = {"sparse_indices": {"valid_counts": [2048, 2048, 700, 0]}}
    inputs = attn.generate(axes, given, params, InputRng(5, CPU))
    expected = attn.expect(inputs)
    tol = Tolerance()
    assert attn.check(inputs, expected, expected, tol).passed
    result = attn.check(inputs, attention_with_bf16_probabilities(inputs), expected, tol)
    assert result.passed, result.message
    if sm_scale is not None:  # long rows of near-equal weights (the contest's scale concentrates them on a few slots)
        scaled = {**expected, "output": (expected["output"].float() * 0.98).bfloat16()}
        result = attn.check(inputs, scaled, expected, tol)
        assert result.status is Status.INCORRECT_NUMERICAL and "rows out of tolerance" in result.message, result.message


def test_an_empty_row_is_decided_by_its_indices_not_by_the_reference_lse():
    wl = load_workload(ROOT / "workloads" / "mla_decode_v32_smoke.yaml")
    case = next(c for c in wl.cases if c.id == "smoke_b3_sq2_k128_bs61_h128_short_padded")
    from dsa_bench.workloads import build_inputs

    inputs = build_inputs(wl.definition, case, 3, CPU)
    expected = wl.definition.expect(inputs)
    entries = md.counted(inputs["indices"], None).any(-1)
    assert not bool(entries.all()) and bool(entries.any()), "the case has empty and counted rows"
    b, s = (int(i) for i in torch.nonzero(entries)[0])
    # a reference whose lse overflowed on a counted row (what sm_scale 1e37 did) no longer makes it empty
    broken = {**expected, "lse": expected["lse"].clone()}
    broken["lse"][b, s] = math.inf
    claims_empty = {"out": expected["out"].clone(), "lse": broken["lse"].clone()}
    claims_empty["out"][b, s] = 0.0
    result = wl.definition.check(inputs, claims_empty, broken, wl.settings.tolerance)
    assert result.status is Status.INCORRECT_NUMERICAL, "a row with counted entries is judged, never waved through as empty"
    # a row that counts nothing must hold exactly 0 and +inf, whatever the reference says
    eb, es = (int(i) for i in torch.nonzero(~entries)[0])
    wrong = {"out": expected["out"].clone(), "lse": expected["lse"].clone()}
    wrong["lse"][eb, es] = 1.0
    shown = {**expected, "lse": wrong["lse"].clone()}  # even a reference that agrees with it
    result = wl.definition.check(inputs, wrong, shown, wl.settings.tolerance)
    assert result.status is Status.INCORRECT_NUMERICAL and f"batch {eb} query {es} has no counted index" in result.message


def test_attention_empty_tokens_come_from_the_indices():
    axes = attn.DEFINITION.axes({"num_tokens": 2, "num_pages": 64})
    inputs = attn.generate(axes, {}, {"sparse_indices": {"valid_counts": [0, 40]}}, InputRng(2, CPU))
    expected = attn.expect(inputs)
    broken = {**expected, "lse": expected["lse"].clone()}
    broken["lse"][1] = -math.inf  # a reference gone wrong on a token with valid ids
    claims_empty = {"output": torch.zeros_like(expected["output"]), "lse": broken["lse"]}
    assert attn.check(inputs, claims_empty, broken, Tolerance()).status is Status.INCORRECT_NUMERICAL


def _trace(tmp_path, definition: str, case: dict) -> str:
    (tmp_path / "t.jsonl").write_text(json.dumps(case) + "\n")
    (tmp_path / "w.yaml").write_text(f"name: t\ndefinition: {definition}\ntrace: t.jsonl\n")
    with pytest.raises(DsaBenchError) as info:
        load_workload(tmp_path / "w.yaml")
    return str(info.value)


def test_an_sm_scale_of_1e37_is_refused_at_validation(tmp_path):
    axes = {"b": 2, "s_q": 1, "h_q": 64, "topk": 64, "s_k": 256, "num_blocks": 6, "block_size": 64, "page_bytes": 41984}
    case = {"id": "c", "axes": axes, "inputs": {"sm_scale": {"type": "scalar", "value": 1e37}}}
    message = _trace(tmp_path, "dsa_mla_decode_v32_fp8", case)
    assert message.startswith(f"{tmp_path / 't.jsonl'}:1: case 'c': ") and "inputs.sm_scale = 1e+37 must be in (0, 1]" in message
    assert "d_qk^-0.5 = 0.0417" in message
    case["inputs"]["sm_scale"]["value"] = 1.0  # the bound itself is allowed
    (tmp_path / "t.jsonl").write_text(json.dumps(case) + "\n")
    assert load_workload(tmp_path / "w.yaml").cases[0].id == "c"
    attention = {"id": "c", "axes": {"num_tokens": 1, "num_pages": 4}, "inputs": {"sm_scale": {"type": "scalar", "value": 1e37},
                 "sparse_indices": {"type": "random", "params": {"valid_counts": [1]}}}}  # fmt: skip
    assert "sm_scale = 1e+37 must be in (0, 1]" in _trace(tmp_path, attn.NAME, attention)


def test_the_decode_has_its_own_natural_log_lse_atol(tmp_path):
    text = (ROOT / "workloads" / "mla_decode_v32_smoke.yaml").read_text()
    (tmp_path / "w.yaml").write_text(text.replace("  lse_atol: 1.0e-4\n", "").replace("../traces/", f"{ROOT / 'traces'}/"))
    assert "lse_atol" not in (tmp_path / "w.yaml").read_text()
    tolerance = load_workload(tmp_path / "w.yaml").settings.tolerance
    assert tolerance.lse_atol == md.LSE_ATOL == 1e-4, "not the attention's base-2 2.5e-4"
    assert tolerance.atol == 1e-2 and tolerance.rtol == 1e-2
    assert load_workload(ROOT / "workloads" / "sparse_attention_smoke.yaml").settings.tolerance.lse_atol == 2.5e-4
    # one of 2048 equal slots left out moves the lse by ln(2048/2047): 4.9 times the derived bound
    assert math.log(2048 / 2047) / md.LSE_ATOL > 4.8


def test_compare_rows_names_the_row_and_refuses_nan():
    ref = torch.tensor([[1.0, 0.5], [0.25, 0.125]]).bfloat16()
    tolerance = row_tolerances(ref, torch.zeros(2))
    assert compare_rows("out", ref, ref, tolerance).passed
    off = ref.clone()
    off[1, 1] = 0.1
    result = compare_rows("out", off, ref, tolerance, row_label=lambda at: f"token {at[0]}")
    assert result.status is Status.INCORRECT_NUMERICAL and "1 of 2 rows" in result.message and "first at token 1" in result.message
    off[1, 1] = float("nan")
    assert "got nan" in compare_rows("out", off, ref, tolerance).message
    assert compare_rows("out", off, ref, tolerance, skip=torch.tensor([False, True])).passed
