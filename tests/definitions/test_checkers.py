"""The checkers accept every valid answer and reject every wrong one, on hand-built inputs."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch

from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import INT_POISON, InputRng, Tolerance
from dsa_bench.definitions.checks import judge
from dsa_bench.definitions.kv_records import INDEXER_KEY_PAGE
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.workloads import parse_settings

CPU = torch.device("cpu")
TOL = Tolerance()


def hand_indexer_inputs(seq_lens: list[int], token_scale, num_pages: int = 160) -> tuple[dict, dict]:
    """Inputs whose score is known in closed form: score(b, j) = 128 * token_scale(b, j).

    Only head 0 has weight 1 and a query of ones; every key value is 1.0, so
    relu(q·k) = 128 and the token's scale alone decides its rank.
    """
    batch = len(seq_lens)
    max_pages = max(1, max(-(-n // 64) for n in seq_lens))
    axes = idx.DEFINITION.axes({"batch_size": batch, "max_num_pages": max_pages, "num_pages": num_pages})
    inputs = idx.generate(axes, {"seq_lens": torch.tensor(seq_lens, dtype=torch.int32)}, {}, InputRng(0, CPU))
    q = torch.zeros(batch, 64, 128)
    q[:, 0, :] = 1.0
    weights = torch.zeros(batch, 64)
    weights[:, 0] = 1.0
    inputs["q_index_fp8"] = q.to(torch.float8_e4m3fn)
    inputs["weights"] = weights
    values = INDEXER_KEY_PAGE.values(inputs["k_index_cache_fp8"])
    scales = INDEXER_KEY_PAGE.scales(inputs["k_index_cache_fp8"])
    for b, n in enumerate(seq_lens):
        ids = idx.token_ids(inputs["block_table"][b], n)
        values.view(torch.uint8)[ids // 64, ids % 64] = torch.tensor(1.0).to(torch.float8_e4m3fn).view(torch.uint8)
        scales[ids // 64, ids % 64] = torch.tensor([token_scale(b, j) for j in range(n)], dtype=torch.float32)
    return axes, inputs


def check_indexer(axes, inputs, out: torch.Tensor):
    expected = idx.expect(inputs)
    return judge(idx.DEFINITION, axes, inputs, {"topk_indices": out}, expected, TOL, CPU)


def ids_of(inputs, b: int, positions) -> list[int]:
    ids = idx.token_ids(inputs["block_table"][b], int(inputs["seq_lens"][b]))
    return [int(ids[p]) for p in positions]


@pytest.fixture
def increasing():
    """Rows of 0, 2048, 2049 and 1 tokens; scores strictly increase with position."""
    return hand_indexer_inputs([0, 2048, 2049, 1], lambda b, j: (j + 1) * 1e-3)


def test_reference_matches_hand_computed_rows(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    assert out[0].eq(-1).all(), "an empty row is all -1"
    assert sorted(out[1].tolist()) == sorted(ids_of(inputs, 1, range(2048))), "L = 2048 selects every token"
    # L = 2049: the lowest score is position 0, the only token left out.
    assert sorted(out[2].tolist()) == sorted(ids_of(inputs, 2, range(1, 2049)))
    assert out[3, 0].item() == ids_of(inputs, 3, [0])[0] and out[3, 1:].eq(-1).all()
    assert check_indexer(axes, inputs, out).passed


def test_checker_accepts_permuted_rows(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    shuffled = torch.stack([row[torch.randperm(row.numel())] for row in out])  # -1s move too
    assert not torch.equal(shuffled, out)
    assert check_indexer(axes, inputs, shuffled).passed


def test_checker_accepts_any_tie_break():
    # Every token of the 2049-row scores the same: any 2048 of them is a correct top-k.
    axes, inputs = hand_indexer_inputs([2049], lambda b, j: 0.5)
    everything = ids_of(inputs, 0, range(2049))
    for left_out in (0, 1000, 2048):
        chosen = [i for k, i in enumerate(everything) if k != left_out]
        assert check_indexer(axes, inputs, torch.tensor([chosen], dtype=torch.int32)).passed


def test_checker_accepts_tie_at_the_boundary_only():
    # 2050 tokens, 2048 kept: position 0 is the worst, positions 1 and 2 tie for second worst.
    def scale(b, j):
        return 0.001 if j == 0 else 0.002 if j in (1, 2) else 0.01 + j * 1e-5

    axes, inputs = hand_indexer_inputs([2050], scale)
    everything = ids_of(inputs, 0, range(2050))

    def without(*positions):
        return torch.tensor([[i for k, i in enumerate(everything) if k not in positions]], dtype=torch.int32)

    assert check_indexer(axes, inputs, without(0, 1)).passed
    assert check_indexer(axes, inputs, without(0, 2)).passed
    assert check_indexer(axes, inputs, without(0, 3)).status is Status.INCORRECT_INDICES  # 3 beats the tie
    assert check_indexer(axes, inputs, without(1, 2)).status is Status.INCORRECT_INDICES  # kept the worst


def _reject(axes, inputs, out: torch.Tensor, fragment: str) -> None:
    result = check_indexer(axes, inputs, out)
    assert result.status is Status.INCORRECT_INDICES, result
    assert fragment in result.message, result.message


def test_checker_rejects_duplicate_id(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    out[2, 7] = out[2, 8]
    _reject(axes, inputs, out, "appears more than once")


def test_checker_rejects_page_outside_block_table(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    row_pages = set(inputs["block_table"][1, :32].tolist())
    foreign = next(p for p in range(inputs["k_index_cache_fp8"].shape[0]) if p not in row_pages)
    out[1, 0] = foreign * 64 + 3
    _reject(axes, inputs, out, "not among the row's first 32 block-table entries")


def test_checker_rejects_position_beyond_seq_len(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    # Row 3 has one token at position 0; slot 5 of the same page is position 5 >= seq_len 1.
    out[3, 0] = int(inputs["block_table"][3, 0]) * 64 + 5
    _reject(axes, inputs, out, "not below seq_len = 1")


def test_checker_rejects_page_beyond_cache(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    out[1, 0] = 10_000 * 64
    _reject(axes, inputs, out, "beyond num_pages")


def test_checker_rejects_lower_score_swap(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    best = ids_of(inputs, 2, [2048])[0]  # the highest score of row 2
    worst_left_out = ids_of(inputs, 2, [0])[0]
    row = out[2].tolist()
    row[row.index(best)] = worst_left_out
    out[2] = torch.tensor(row)
    _reject(axes, inputs, out, "not a top-2048 set")


def test_checker_rejects_missing_padding(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    out[3, 1] = ids_of(inputs, 1, [0])[0]  # an id where row 3 needs -1 (it has one token)
    _reject(axes, inputs, out, "2 valid ids, expected min(2048, seq_len = 1) = 1")


def test_checker_rejects_extra_padding(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    out[2, 100] = -1
    _reject(axes, inputs, out, "2047 valid ids, expected min(2048, seq_len = 2049) = 2048")


def test_checker_rejects_unwritten_output(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    out[0, 5] = INT_POISON
    _reject(axes, inputs, out, "neither -1 nor a token id")


def test_checker_rejects_wrong_dtype_and_shape(increasing):
    axes, inputs = increasing
    out = idx.reference(**inputs)["topk_indices"]
    assert check_indexer(axes, inputs, out.long()).status is Status.INCORRECT_DTYPE
    assert check_indexer(axes, inputs, out[:, :100]).status is Status.INCORRECT_SHAPE


# --------------------------------------------------------------------------- attention


def attention_inputs(counts: list[int], seed: int = 0, num_pages: int = 64) -> tuple[dict, dict]:
    axes = attn.DEFINITION.axes({"num_tokens": len(counts), "num_pages": num_pages})
    params = {"sparse_indices": {"valid_counts": counts}}
    return axes, attn.generate(axes, {}, params, InputRng(seed, CPU))


def check_attention(axes, inputs, output, lse):
    return judge(attn.DEFINITION, axes, inputs, {"output": output, "lse": lse}, attn.expect(inputs), TOL, CPU)


def test_attention_reference_single_slot_by_hand():
    axes, inputs = attention_inputs([1])
    token = int(inputs["sparse_indices"][0, 0])
    ckv = inputs["ckv_cache"].reshape(-1, 512)[token].double()
    kpe = inputs["kpe_cache"].reshape(-1, 64)[token].double()
    logit = (inputs["q_nope"][0].double() @ ckv + inputs["q_pe"][0].double() @ kpe) * inputs["sm_scale"]
    ref = attn.reference(**inputs)
    # One slot: softmax is 1, so the output is that slot's ckv row and lse = logit / ln 2.
    assert torch.equal(ref["output"][0], ckv.to(torch.bfloat16).expand(16, 512))
    torch.testing.assert_close(ref["lse"][0].double(), logit / math.log(2), rtol=1e-5, atol=1e-5)


def test_attention_reference_matches_float64_loop():
    axes, inputs = attention_inputs([0, 3, 70])
    ref = attn.reference(**inputs)
    for t in range(3):
        row = inputs["sparse_indices"][t]
        valid = row[row >= 0].long()
        if valid.numel() == 0:
            assert ref["output"][t].eq(0).all() and torch.isneginf(ref["lse"][t]).all()
            continue
        ckv = inputs["ckv_cache"].reshape(-1, 512)[valid].double()
        kpe = inputs["kpe_cache"].reshape(-1, 64)[valid].double()
        logits = (inputs["q_nope"][t].double() @ ckv.T + inputs["q_pe"][t].double() @ kpe.T) * inputs["sm_scale"]
        lse2 = torch.logsumexp(logits, -1) / math.log(2)
        out = torch.softmax(logits, -1) @ ckv
        torch.testing.assert_close(ref["lse"][t].double(), lse2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ref["output"][t].double(), out, rtol=1e-2, atol=1e-2)


@pytest.fixture
def attention_case():
    axes, inputs = attention_inputs([5, 0, 2048])
    return axes, inputs, attn.reference(**inputs)


def test_attention_checker_accepts_reference_and_small_noise(attention_case):
    axes, inputs, ref = attention_case
    assert check_attention(axes, inputs, ref["output"], ref["lse"]).passed
    noisy = (ref["output"].float() + 1e-3).to(torch.bfloat16)
    noisy[1] = 0.0  # token 1 has no valid index: its output stays exactly 0
    assert check_attention(axes, inputs, noisy, ref["lse"] + 1e-4).passed


def _reject_attention(axes, inputs, output, lse, fragment: str) -> None:
    result = check_attention(axes, inputs, output, lse)
    assert result.status is Status.INCORRECT_NUMERICAL, result
    assert fragment in result.message, result.message


def test_attention_checker_rejects_nan(attention_case):
    axes, inputs, ref = attention_case
    out = ref["output"].clone()
    out[0, 3, 17] = float("nan")
    _reject_attention(axes, inputs, out, ref["lse"], "output: 1 of")


def test_attention_checker_rejects_natural_log_lse(attention_case):
    axes, inputs, ref = attention_case
    natural = ref["lse"] * math.log(2)
    _reject_attention(axes, inputs, ref["output"], natural, "lse:")


def test_attention_checker_rejects_wrong_neg_inf(attention_case):
    axes, inputs, ref = attention_case
    lse = ref["lse"].clone()
    lse[0, 2] = float("-inf")  # token 0 has valid slots
    _reject_attention(axes, inputs, ref["output"], lse, "lse: 1 of")


def test_attention_checker_requires_neg_inf_on_empty_rows(attention_case):
    axes, inputs, ref = attention_case
    lse = ref["lse"].clone()
    lse[1] = 0.0  # token 1 has no valid slot: lse must be exactly -inf
    _reject_attention(axes, inputs, ref["output"], lse, "lse: token 1 has no valid index, so its lse must be exactly -inf")
    out = ref["output"].clone()
    out[1] = 1.0  # and its output must be 0
    _reject_attention(axes, inputs, out, ref["lse"], "output: token 1 has no valid index")


def test_attention_checker_requires_exact_zero_output_on_empty_rows(attention_case):
    axes, inputs, ref = attention_case
    assert ref["output"][1].eq(0).all()
    out = ref["output"].clone()
    out[1, 3, 100] = 0.009  # within atol = 1e-2, but the contract says exactly 0
    message = "output: token 1 has no valid index, so its output must be exactly 0; head 3 column 100 holds 0.00897217"
    _reject_attention(axes, inputs, out, ref["lse"], message)
    out[1, 3, 100] = float("nan")
    _reject_attention(axes, inputs, out, ref["lse"], "output: token 1 has no valid index")
    out[1] = -0.0  # IEEE -0 equals 0
    assert check_attention(axes, inputs, out, ref["lse"]).passed


def test_attention_checker_rejects_lse_off_by_a_fraction(attention_case):
    # 0.15 in base 2 is a softmax denominator 11 % too large: |lse| ~ 20 hid it under rtol = 1e-2.
    axes, inputs, ref = attention_case
    assert float(ref["lse"][2].abs().min()) * TOL.rtol > 0.15, "the old relative test would have passed it"
    lse = ref["lse"].clone()
    lse[2, 5] += 0.15
    _reject_attention(axes, inputs, ref["output"], lse, "lse: 1 of 48 elements out of tolerance (absolute, |diff| <= 0.00025)")


def equal_weight_inputs() -> tuple[dict, dict]:
    """One full row whose 2048 slots all have logit 0 (zero queries): each weighs exactly 1/2048."""
    axes, inputs = attention_inputs([2048])
    inputs["q_nope"].zero_()
    inputs["q_pe"].zero_()
    return axes, inputs


def test_attention_checker_rejects_one_of_2048_equal_slots_left_out():
    axes, inputs = equal_weight_inputs()
    ref = attn.reference(**inputs)
    assert torch.allclose(ref["lse"], torch.full_like(ref["lse"], 11.0))  # log2(2048)
    skipped = dict(inputs, sparse_indices=inputs["sparse_indices"].clone())
    skipped["sparse_indices"][0, 1234] = -1
    mutant = attn.reference(**skipped)  # what a kernel that drops slot 1234 returns
    shift = float((ref["lse"] - mutant["lse"]).abs().max())
    assert shift == pytest.approx(math.log2(2048 / 2047), rel=1e-2)
    # Its output is within atol/rtol element by element, but not within its rows' own bound (about 1/2048 of
    # a slot's values moves every row by more than one bf16 ulp of it); its lse fails on its own too.
    _reject_attention(axes, inputs, mutant["output"], mutant["lse"], "output: 16 of 16 rows out of tolerance")
    _reject_attention(axes, inputs, ref["output"], mutant["lse"], "lse: 16 of 16 elements out of tolerance")
    # A workload may loosen lse_atol; then that lse passes.
    loose = judge(attn.DEFINITION, axes, inputs, {**mutant, "output": ref["output"]}, attn.expect(inputs), Tolerance(lse_atol=1e-3), CPU)
    assert loose.passed, loose.message


def test_attention_checker_rejects_unwritten_output(attention_case):
    axes, inputs, ref = attention_case
    outputs = attn.DEFINITION.allocate_outputs(axes, CPU)
    outputs["lse"].copy_(ref["lse"])
    _reject_attention(axes, inputs, outputs["output"], outputs["lse"], "output:")


def test_lse_atol_is_a_workload_setting_recorded_with_the_tolerance():
    settings = parse_settings({"lse_atol": 1e-3, "atol": 0.02}, "w.yaml")
    assert settings.tolerance == Tolerance(atol=0.02, lse_atol=1e-3)
    assert asdict(settings.tolerance) == {"atol": 0.02, "rtol": 1e-2, "lse_atol": 1e-3, "score_rtol": None}  # what results record
    with pytest.raises(DsaBenchError, match=r"settings.lse_atol = 'tight': expected a finite number >= 0"):
        parse_settings({"lse_atol": "tight"}, "w.yaml")
