"""The solution's FP8 sparse MLA decode (solutions/triton/decode/): Triton kernels for V3.2, V4 and V4.1 records.

CPU tests run the kernels under the Triton interpreter (conftest sets TRITON_INTERPRET=1 before
the solution is imported) on tiny shapes, against an fp32 reference written here from the
``kv_records`` writer and reader: records are written with ``fmt.quantize`` / ``fmt.write`` only at
the tokens some index points to, every other cache byte is NaN-producing (FP8 0x7F, fp32 NaN
scales, untouched page padding), so a wrong gather fails loudly. Outputs start as NaN. The
tolerances are the brief's: out elementwise |diff| <= 1e-2 or <= 1e-2 |ref|, lse absolute
<= 2.5e-4; an empty row must give out exactly 0 and lse +inf. GPU tests (``-m gpu``) run
production shapes, every combine, and the ticket words' reuse.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from dataclasses import replace

import pytest
import torch
from conftest import HAS_CUDA, ROOT, exported_symbols, load_script

from dsa_bench.definitions import kv_records as kvr
from dsa_bench.definitions import mla_decode
from dsa_bench.definitions.status import Status
from dsa_bench.workloads import build_inputs, load_workload

SOLUTION_DIR = ROOT / "solutions" / "triton"
# The decode entries are not in solution.yaml yet (their definitions land separately): the modules
# are imported as the harness imports an entry, inside a package rooted at the solution folder (not
# through the attention's entry, which builds its CUDA extension at import on a GPU).
_PACKAGE = "dsa_test_triton_solution_decode"
if _PACKAGE not in sys.modules:
    _package = types.ModuleType(_PACKAGE)
    _package.__path__ = [str(SOLUTION_DIR)]
    sys.modules[_PACKAGE] = _package
entry = importlib.import_module(f"{_PACKAGE}.decode.entry")
policy_mod = importlib.import_module(f"{_PACKAGE}.decode.policy")
kernels = importlib.import_module(f"{_PACKAGE}.decode.triton_kernels")
shapes_mod = importlib.import_module(f"{_PACKAGE}.decode.shapes")
cuda_mod = importlib.import_module(f"{_PACKAGE}.decode.cuda")
cuda_build = importlib.import_module(f"{_PACKAGE}.common.cuda_build")
DecodeConfig = policy_mod.DecodeConfig

FORMATS = {"V32": kvr.V32, "V4": kvr.V4, "V41": kvr.V41}
CPU = torch.device("cpu")
OUT_ATOL = OUT_RTOL = 1e-2
LSE_ATOL = 2.5e-4


# --------------------------------------------------------------------------- inputs and reference


def make_case(fmt, b=2, s_q=2, h_q=64, topk=64, block_size=16, num_blocks=8, seed=0, page_pad=0, valid_frac=0.85,
              empty_rows=(), sink=False, topk_length=None, device=CPU):  # fmt: skip
    """Inputs of one call. Row r of the index matrix (r = batch * s_q + query) holds distinct
    random ids; row 0 starts with both ends of every page; ``valid_frac`` of the rest stay valid
    (the others -1, scattered); ``empty_rows`` are all -1. The cache backing is [num_blocks, page
    stride + page_pad] bytes, NaN-producing except the referenced records."""
    g = torch.Generator().manual_seed(seed)
    stride = fmt.page_stride(block_size) + page_pad
    backing = torch.full((num_blocks, stride), kvr.FP8_NAN_BYTE, dtype=torch.uint8)
    if fmt.scale_dtype == "fp32":
        fmt.scales(backing, block_size).fill_(float("nan"))
    total = num_blocks * block_size
    rows = torch.stack([torch.randperm(total, generator=g)[:topk] for _ in range(b * s_q)]).to(torch.int32)
    ends = torch.tensor([p * block_size + o for p in range(num_blocks) for o in (0, block_size - 1)][:topk], dtype=torch.int32)
    rest = rows[0][~torch.isin(rows[0], ends)]
    rows[0] = torch.cat([ends, rest])[:topk]
    drop = torch.rand(rows.shape, generator=g) > valid_frac
    drop[0, : ends.numel()] = False
    rows[drop] = -1
    for r in empty_rows:
        rows[r] = -1
    indices = rows.view(b, s_q, topk)
    used = torch.unique(indices[indices >= 0])
    x = torch.randn(used.numel(), fmt.input_dims, generator=g) * 2
    fmt.write(backing, block_size, used, fmt.quantize(x, "flashmla"))
    backing = backing.to(device)  # the view below, not a copy of it, keeps the padded page stride on the device
    cache = backing.as_strided((num_blocks, block_size, 1, fmt.bytes_per_token), (stride, fmt.bytes_per_token, fmt.bytes_per_token, 1))
    q = torch.randn(b, s_q, h_q, fmt.d_qk, generator=g).to(torch.bfloat16)
    attn_sink = None
    if sink:
        attn_sink = torch.randn(h_q, generator=g) * 3
        attn_sink[::3] = float("-inf")  # no sink for those heads
    lengths = None if topk_length is None else torch.tensor(topk_length, dtype=torch.int32)
    case = dict(q=q, kv_cache=cache, indices=indices, sm_scale=fmt.d_qk**-0.55, attn_sink=attn_sink, topk_length=lengths)
    case = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    return case, backing, block_size


def reference(fmt, case) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition's fp32 reference (``mla_decode.attend``) on ``case``: out [b, s_q, h_q, 512]
    and lse in natural log; an empty row gets out 0 and lse +inf; the sink scales out by
    1 / (1 + exp(sink - lse)). A case without a sink passes -inf for every head."""
    sink = case["attn_sink"]
    if sink is None:
        sink = torch.full((case["q"].shape[2],), float("-inf"), device=case["q"].device)
    return mla_decode.attend(fmt, case["q"], case["kv_cache"], case["indices"], case["sm_scale"], sink, case["topk_length"])


def run(fmt, case, config=None):
    """The solution on ``case``; outputs NaN-poisoned first. Returns (out, lse, config used)."""
    b, s_q, h_q, _ = case["q"].shape
    out = torch.full((b, s_q, h_q, shapes_mod.D_V), float("nan"), dtype=torch.bfloat16, device=case["q"].device)
    lse = torch.full((b, s_q, h_q), float("nan"), device=case["q"].device)
    used = entry.mla_decode(fmt, case["q"], case["kv_cache"], case["indices"], case["sm_scale"], case["attn_sink"],
                            case["topk_length"], out, lse, config)  # fmt: skip
    return out, lse, used


def assert_matches(out, lse, ref_out, ref_lse, where=""):
    out = out.float()
    assert not out.isnan().any() and not lse.isnan().any(), f"{where}: NaN in the outputs"
    diff = (out - ref_out).abs()
    bad = ~((diff <= OUT_ATOL) | (diff <= OUT_RTOL * ref_out.abs()))
    assert not bad.any(), f"{where}: {int(bad.sum())} out elements off, worst |diff| {diff[bad].max():.4g}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(lse[empty], ref_lse[empty]), f"{where}: an empty row's lse must be +inf"
    assert out[empty].eq(0).all(), f"{where}: an empty row's out must be exactly 0"
    lse_err = (lse[~empty] - ref_lse[~empty]).abs()
    assert lse_err.numel() == 0 or lse_err.max() <= LSE_ATOL, f"{where}: lse off by {lse_err.max():.3g}"


def check(fmt, case, config=None):
    out, lse, used = run(fmt, case, config)
    ref_out, ref_lse = reference(fmt, case)
    assert_matches(out, lse, ref_out, ref_lse, f"{fmt.kv_format} {used}")
    return out, lse, used


# --------------------------------------------------------------------------- CPU (interpreter)


@pytest.mark.parametrize("name", FORMATS)
def test_default_path_with_padded_pages_page_ends_empty_row_and_sink(name):
    fmt = FORMATS[name]
    lengths = [64, 40] if fmt is not kvr.V32 else None  # V4 / V4.1: batch 1's rows are short
    case, _, _ = make_case(fmt, page_pad=48, empty_rows=(1,), sink=True, topk_length=lengths, seed=1)
    out, lse, used = check(fmt, case)
    assert used.splits == 1 and used.combine == "none"
    assert torch.isinf(lse[0, 1]).all() and out[0, 1].eq(0).all()


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("combine,splits,block_n", [("two_launch", 2, 32), ("last", 4, 16), ("two_launch", 4, 16)])
def test_split_paths(name, combine, splits, block_n):
    fmt = FORMATS[name]
    lengths = [50, 3] if fmt is not kvr.V32 else None
    case, _, _ = make_case(fmt, b=2, s_q=2, topk=64, empty_rows=(2,), sink=True, topk_length=lengths, seed=2)
    config = DecodeConfig(block_n=block_n, splits=splits, combine=combine, num_warps=4, num_stages=1)
    _, _, used = check(fmt, case, config)
    assert (used.combine, used.splits) == (combine, splits)


@pytest.mark.parametrize("name", FORMATS)
def test_several_blocks_per_program_and_block_sizes_that_are_not_powers_of_two(name):
    # block sizes of the correctness grid (61, 2): page arithmetic by non-power-of-two divisors;
    # several blocks per program (the id look-ahead) and a row ending mid-block.
    fmt = FORMATS[name]
    for block_size, num_blocks in ((61, 3), (2, 70)):
        lengths = [100, 128, 7] if fmt is not kvr.V32 else None
        case, _, _ = make_case(fmt, b=3, s_q=1, topk=128, block_size=block_size, num_blocks=num_blocks, seed=block_size,
                                      topk_length=lengths, page_pad=16)  # fmt: skip
        check(fmt, case, DecodeConfig(block_n=32, splits=1, num_warps=4, num_stages=1))


def test_v4_topk_length_ignores_valid_ids_past_the_length():
    fmt = kvr.V4
    case, _, _ = make_case(fmt, b=3, s_q=2, topk=64, valid_frac=1.0, topk_length=[64, 17, 0], seed=4)
    out, lse, _ = check(fmt, case, DecodeConfig(block_n=16, splits=2, combine="last", num_warps=4, num_stages=1))
    assert torch.isinf(lse[2]).all() and out[2].eq(0).all()  # length 0: every id ignored
    # the ids past the length are valid and their records written: ignoring the length changes batch 1
    wrong, _, _ = run(fmt, dict(case, topk_length=None), DecodeConfig(block_n=16, splits=1, num_warps=4, num_stages=1))
    assert (wrong[1].float() - out[1].float()).abs().max() > 0.05


def test_all_rows_empty_and_large_logits():
    fmt = kvr.V32
    case, _, _ = make_case(fmt, b=1, s_q=2, topk=64, empty_rows=(0, 1), sink=True, seed=5)
    out, lse, _ = check(fmt, case, DecodeConfig(block_n=16, splits=4, combine="two_launch", num_warps=4, num_stages=1))
    assert torch.isinf(lse).all() and lse.gt(0).all() and out.eq(0).all()
    case, _, _ = make_case(fmt, b=1, s_q=2, topk=64, seed=6)
    check(fmt, dict(case, sm_scale=0.5))  # logits of several hundred: exp2 overflows without the running max


#: Sinks at the ends of what the contract allows (a finite float32, or -inf): above FLT_MAX / log2(e)
#: (about 2.4e38) the log2-domain sink overflows to +inf, and exp(88.8) overflows float32.
EXTREME_SINKS = (3e38, torch.finfo(torch.float32).max, 1e30, 1e4, 88.8, -1e4, -3e38, float("-inf"))


@pytest.mark.parametrize("sink", EXTREME_SINKS)
def test_empty_rows_stay_zero_and_plus_inf_under_extreme_sinks(sink):
    # The old _finish computed exp2(sink * log2(e) - lse2) for empty rows too: +inf - +inf = NaN in out.
    fmt = kvr.V32
    case, _, _ = make_case(fmt, b=2, s_q=2, h_q=16, topk=64, empty_rows=(1, 2), seed=8)
    case["attn_sink"] = torch.full((16,), sink)
    case["attn_sink"][::4] = float("-inf")  # some heads without a sink beside the extreme ones
    for config in (None, DecodeConfig(block_h=16, block_n=16, splits=4, combine="two_launch", num_warps=4, num_stages=1),
                   DecodeConfig(block_h=16, block_n=32, splits=2, combine="last", num_warps=4, num_stages=1)):  # fmt: skip
        out, lse, used = check(fmt, case, config)
        assert out[0, 1].eq(0).all() and out[1, 0].eq(0).all() and torch.isposinf(lse[0, 1]).all(), used
        if sink > 100:  # a sink far above every lse leaves out 0 on the rows that count entries too
            assert out[0, 0, 1:4].eq(0).all()


def test_wrong_rope_offset_fails_the_reference():
    """A kernel that reads the RoPE part 16 bytes off (a geometry mutant) must fail the check,
    for the K-only RoPE of V3.2 and the V RoPE of V4: the test can tell."""
    for fmt in (kvr.V32, kvr.V4):
        case, _, bs = make_case(fmt, seed=7)
        good = entry.record_geometry(fmt.kv_format, bs)
        mutant = shapes_mod.RecordGeometry(**{**good.__dict__, "rope_offset": good.rope_offset + 16})
        entry.record_geometry.cache_clear()
        original = entry.record_geometry
        entry.record_geometry = lambda kv_format, block_size, _m=mutant: _m
        try:
            with pytest.raises(AssertionError, match="off|NaN"):
                check(fmt, case)
        finally:
            entry.record_geometry = original
    check(kvr.V4, make_case(kvr.V4, seed=7)[0])  # and the real geometry passes again


def test_ticket_words_survive_changing_split_counts_and_the_int32_wrap():
    """MODE_LAST under the interpreter: calls with 2, 4, 1, 8 splits on the same ticket words,
    starting just below the int32 wrap, each leave every word on a multiple of TICKETS_PER_CALL,
    advanced by exactly one call, and stay correct."""
    fmt = kvr.V41
    case, _, _ = make_case(fmt, b=1, s_q=2, topk=128, seed=8)
    words = entry.ticket_words(CPU, 2)
    units = words.view(-1, kernels.TICKET_STRIDE)[:, 0]
    units.fill_(2**31 - 2 * kernels.TICKETS_PER_CALL)
    start = units.clone()
    calls = 0
    for splits in (2, 4, 1, 8, 4):  # topk 128: 8 splits of 16 positions
        check(fmt, case, DecodeConfig(block_n=min(64, 128 // splits), splits=splits, combine="last" if splits > 1 else "auto",
                                                   num_warps=4, num_stages=1))  # fmt: skip
        calls += splits > 1
        expected = ((start.long() + calls * kernels.TICKETS_PER_CALL + 2**31) % 2**32 - 2**31).to(torch.int32)
        assert torch.equal(units[:2], expected[:2]), (splits, units[:2], expected[:2])
    assert units[0] < 0  # wrapped


def test_inputs_are_checked_and_left_unmodified():
    fmt = kvr.V32
    case, backing, _ = make_case(fmt, seed=9)
    before = {k: v.clone() for k, v in case.items() if isinstance(v, torch.Tensor)}
    backing_before = backing.clone()
    run(fmt, case)
    for k, v in before.items():
        assert torch.equal(case[k], v), k
    assert torch.equal(backing, backing_before)
    b, s_q, h_q, _ = case["q"].shape
    out = torch.empty(b, s_q, h_q, shapes_mod.D_V, dtype=torch.bfloat16)
    lse = torch.empty(b, s_q, h_q)
    with pytest.raises(ValueError, match="q: expected bf16"):
        entry.kernel_v4(case["q"], case["kv_cache"], case["indices"], 1.0, None, None, out, lse)  # V3.2 q for V4
    with pytest.raises(ValueError, match="indices: expected int32"):
        entry.kernel_v32(case["q"], case["kv_cache"], case["indices"].long(), 1.0, None, out, lse)
    with pytest.raises(ValueError, match="page stride"):
        squeezed = case["kv_cache"].as_strided(case["kv_cache"].shape, (16, *case["kv_cache"].stride()[1:]))
        entry.kernel_v32(case["q"], squeezed, case["indices"], 1.0, None, out, lse)
    with pytest.raises(ValueError, match="out: expected"):
        entry.kernel_v32(case["q"], case["kv_cache"], case["indices"], 1.0, None, out[..., :256], lse)


def test_configs_check_their_tiling_and_the_barrier_is_refused_here():
    with pytest.raises(ValueError, match="split size"):
        DecodeConfig(block_n=64, splits=4).validate(64, 128)  # split of 32 < BLOCK_N
    with pytest.raises(ValueError, match="block_h"):
        DecodeConfig(block_h=48, splits=1, combine="none").validate(64, 128)
    with pytest.raises(ValueError, match="power of two"):
        DecodeConfig(splits=3).validate(64, 2048)
    with pytest.raises(ValueError, match="interpreter"):
        policy_mod.resolve_combine(DecodeConfig(splits=4, combine="barrier"), 8, 132, interpreted=True)
    with pytest.raises(ValueError, match="resident"):
        policy_mod.resolve_combine(DecodeConfig(splits=4, combine="barrier"), 200, 132, interpreted=False)
    fmt = kvr.V32
    case, _, _ = make_case(fmt, seed=10)
    with pytest.raises(ValueError, match="interpreter"):
        run(fmt, case, DecodeConfig(block_n=16, splits=2, combine="barrier"))


def test_gpu_policy_on_the_production_shapes():
    """What the GPU would run on an H200's 132 SMs: a single grid of at most 132 programs behind
    the barrier at b = 2, one program per (token, head block) from b = 64 on."""
    sms = 132
    cases = {(2, 128): 16, (2, 64): 32, (64, 128): 1, (128, 128): 1, (128, 64): 1}
    for (b, h_q), splits in cases.items():
        for fmt in ("V32", "V4"):
            config = policy_mod.select_config(fmt, h_q, b * 2, 2048, sms)
            programs = b * 2 * (h_q // config.block_h) * config.splits
            assert config.splits == splits, (fmt, b, h_q, config)
            assert config.combine == ("barrier" if splits > 1 else "none") and (splits == 1 or programs <= sms), config
    config = policy_mod.select_config("V32", 128, 148, 2048, sms)  # b = 74: 296 units, waves 3 at S = 1
    assert config.splits > 1 and config.combine == "two_launch"
    assert policy_mod.select_config("V4", 64, 2, 32, sms).block_n == 32  # a block never exceeds the row
    os.environ["DSA_DECODE_TWO_LAUNCH"] = "1"
    try:
        assert policy_mod.select_config("V32", 128, 4, 2048, sms).combine == "two_launch"
    finally:
        del os.environ["DSA_DECODE_TWO_LAUNCH"]


@pytest.mark.parametrize("h_q", [16, 32])
def test_gpu_policy_for_16_and_32_heads(h_q):
    """Off SM90 (the Triton table), 16 and 32 heads run the Triton kernel with one head block of h_q, split
    so that the few programs of a small batch still fill the SMs (on SM90: cuda_config, tested below)."""
    sms = 132
    for b, s_q in ((1, 1), (8, 2), (128, 2)):
        for fmt in ("V32", "V4"):
            config = policy_mod.select_config(fmt, h_q, b * s_q, 2048, sms)
            assert (config.kernel, config.block_h) == ("triton", h_q), config
            assert config.splits > 1 if b * s_q <= 16 else config.splits == 1, (b, s_q, config)
            config.validate(h_q, 2048)
    assert policy_mod.select_config("V4", h_q, 2, 512, sms).block_h == h_q  # V4's top-512


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("h_q,s_q", [(16, 1), (16, 4), (32, 2), (32, 3)])
def test_16_and_32_heads_and_mtp_query_tokens(name, h_q, s_q):
    fmt = FORMATS[name]
    lengths = [64, 23] if fmt is not kvr.V32 else None
    case, _, _ = make_case(fmt, b=2, s_q=s_q, h_q=h_q, topk=64, empty_rows=(1,), sink=True, topk_length=lengths, seed=h_q + s_q)
    _, _, used = check(fmt, case)
    assert used.block_h == h_q
    check(fmt, case, DecodeConfig(block_h=16, block_n=16, splits=2, combine="two_launch", num_warps=4, num_stages=1))
    assert "h_q 16 and 32" in entry.solution_notes() and "mma.sync m16n8k16" in entry.solution_notes()
    assert "transposed wgmma m64n32k16 at 32" in entry.solution_notes()


def test_cuda_kernel_config_and_policy():
    """The CUDA kernel's tiling is fixed; its schedule (whole tokens, then split ones) follows
    cuda_schedule on one program per SM."""
    sms = 132
    schedules = {(2, 128): (0, 16), (2, 64): (0, 16), (1, 64): (0, 16), (64, 128): (0, 1), (128, 128): (0, 1), (74, 128): (132, 4),
                 (74, 64): (132, 8)}  # fmt: skip
    # the combine kernel at 64 heads (the in-launch combine is taken only at 16 and 32 heads by default)
    combines = {(2, 128): "two_launch", (2, 64): "two_launch", (1, 64): "two_launch", (64, 128): "none", (128, 128): "none",
                (74, 128): "two_launch", (74, 64): "two_launch"}  # fmt: skip
    for (b, h_q), (whole, splits) in schedules.items():
        config = policy_mod.cuda_config(b * 2, h_q, 2048, sms)
        assert (config.kernel, config.whole_tokens, config.splits) == ("cuda", whole, splits), (b, h_q)
        assert config.combine == combines[b, h_q], (b, h_q, config)
        config.validate(h_q, 2048)
    # b = 74, h_q 128: two waves of whole rows (132 tokens x 2 head blocks), then 16 tokens x 2 x 4 splits
    # (128 programs, one wave), against 4.5 waves with every token split in 2
    assert policy_mod.cuda_schedule(148, 2, 2048, 64, sms) == (132, 4)
    assert policy_mod.cuda_schedule(0, 2, 2048, 64, sms) == (0, 1)
    with pytest.raises(ValueError, match="whole_tokens must be >= 0, and 0 with one split"):
        replace(policy_mod.CUDA_CONFIG, splits=1, whole_tokens=3, combine="none").validate(128, 2048)
    with pytest.raises(ValueError, match="whole_tokens is the CUDA kernel's schedule"):
        DecodeConfig(splits=2, whole_tokens=1).validate(64, 2048)
    cuda = policy_mod.CUDA_CONFIG
    with pytest.raises(ValueError, match="tiling is fixed"):
        replace(cuda, splits=1, combine="none", block_n=32).validate(128, 2048)
    with pytest.raises(ValueError, match="ticket barrier .* or in a second launch"):
        replace(cuda, splits=4, combine="last").validate(128, 2048)
    replace(cuda, splits=4, combine="barrier").validate(128, 2048)
    with pytest.raises(ValueError, match="multiple of 64"):
        replace(cuda, splits=1, combine="none").validate(96, 2048)
    with pytest.raises(ValueError, match=r"splits must be in \[1, 32\]"):
        replace(cuda, splits=33, combine="two_launch").validate(128, 2048)
    with pytest.raises(ValueError, match="kernel must be one of"):
        DecodeConfig(kernel="cutlass").validate(64, 2048)
    # under the interpreter (these CPU tests) the default is Triton's, and the CUDA kernel is refused
    fmt = kvr.V32
    case, _, _ = make_case(fmt, seed=3)
    _, _, used = check(fmt, case)
    assert used.kernel == "triton"
    with pytest.raises(ValueError, match="does not run under the Triton interpreter"):
        run(fmt, case, replace(cuda, splits=1))
    out = torch.empty(*case["q"].shape[:3], 512, dtype=torch.bfloat16)
    assert cuda_mod.unsupported_reason(kvr.V41, case["q"], case["kv_cache"], out).startswith("V41 records")
    assert cuda_mod.unsupported_reason(fmt, case["q"], case["kv_cache"], out) == "not an SM90 GPU"


@pytest.mark.parametrize("h_q", [16, 32])
def test_cuda_16_and_32_head_kernel_config_and_policy(h_q):
    """16 and 32 heads on SM90: the 16/32-head CUDA kernel, one program per query token and split,
    split until the SMs have work (b = 8, s_q = 1: 8 rows x 16 splits on 132 SMs), but into no
    fewer than two tiles a split: at b = 1, 16 splits beat 32 one-tile ones (the combine's share)."""
    sms = 132
    for (b, s_q), splits in {(1, 1): 16, (1, 2): 16, (8, 1): 16, (8, 2): 8, (32, 1): 4, (128, 2): 1}.items():
        config = policy_mod.cuda_config(b * s_q, h_q, 2048, sms)
        assert (config.kernel, config.block_h, config.num_warps, config.splits) == ("cuda", h_q, 16, splits), (b, s_q, config)
        # at most 128 programs: the in-launch combine where a consumer thread merges one fragment (16 heads
        # from 8 splits, 32 from 16), else the combine kernel
        assert config.combine == ("none" if splits == 1 else "barrier" if splits >= h_q // 2 else "two_launch"), (b, s_q)
        config.validate(h_q, 2048)
    # top-1024 keeps its one-tile programs at b = 1 (16 splits measured faster than 8 there)
    assert policy_mod.cuda_config(2, h_q, 1024, sms).splits == 16 and policy_mod.cuda_config(2, h_q, 512, sms).splits == 8
    with pytest.raises(ValueError, match="tiling is fixed"):  # the 64-head kernel's tiling at 16/32 heads
        replace(policy_mod.CUDA_CONFIG, splits=1, combine="none").validate(h_q, 2048)
    assert policy_mod.cuda_base_config(h_q).block_h == h_q and policy_mod.cuda_base_config(64) == policy_mod.CUDA_CONFIG
    # partials: a unit is the h_q heads of one query token, 256 scales per 16 heads (one per consumer thread)
    parts, cpu = 5, torch.device("cpu")
    partials = cuda_mod.SplitPartials.allocate(parts, cpu, h_q)
    assert partials.out.numel() == parts * h_q * 512 and partials.lse.numel() == parts * h_q
    assert partials.scale.numel() == parts * h_q // 16 * 256 == parts * cuda_mod.partial_scales(h_q)
    partials.check(parts, cpu, h_q)
    with pytest.raises(ValueError, match="partials.out"):
        partials.check(parts + 1, cpu, h_q)
    with pytest.raises(ValueError, match="partials.out"):
        cuda_mod.SplitPartials.allocate(parts, cpu, h_q).check(parts, cpu)  # sized for 16/32 heads, checked for 64


def test_cuda_in_launch_combine_only_where_the_barrier_is_safe(monkeypatch):
    """The CUDA kernel's ticket barrier needs the whole grid resident (at most one program per SM)
    and a split count dividing the ticket words' step; else the combine kernel, and an explicit
    barrier is refused by name. DSA_DECODE_TWO_LAUNCH=1 forces the combine kernel."""
    sms = 132
    base = policy_mod.cuda_base_config(16)
    assert policy_mod.cuda_programs(16, 16, 8, 0) == 128 and policy_mod.cuda_programs(148, 128, 4, 132) == 392
    assert policy_mod.resolve_combine(replace(base, splits=8), 128, sms, interpreted=False).combine == "barrier"
    assert policy_mod.resolve_combine(replace(base, splits=8), 133, sms, interpreted=False).combine == "two_launch"
    assert policy_mod.resolve_combine(replace(base, splits=3), 12, sms, interpreted=False).combine == "two_launch"
    with pytest.raises(ValueError, match="splits dividing 64"):
        policy_mod.resolve_combine(replace(base, splits=3, combine="barrier"), 12, sms, interpreted=False)
    with pytest.raises(ValueError, match="may exceed the 132 resident"):
        policy_mod.resolve_combine(replace(base, splits=8, combine="barrier"), 264, sms, interpreted=False)
    # auto: only where a consumer thread merges at most one fragment, at 16 and 32 heads
    assert [policy_mod.in_launch_combine_pays(16, s) for s in (4, 8, 16)] == [False, True, True]
    assert [policy_mod.in_launch_combine_pays(32, s) for s in (8, 16)] == [False, True]
    assert not policy_mod.in_launch_combine_pays(128, 32)
    assert policy_mod.resolve_cuda_combine(replace(base, splits=4), 16, 16, sms).combine == "two_launch"
    assert policy_mod.resolve_cuda_combine(replace(base, splits=4, combine="barrier"), 16, 16, sms).combine == "barrier"
    assert policy_mod.resolve_cuda_combine(replace(policy_mod.CUDA_CONFIG, splits=16), 4, 128, sms).combine == "two_launch"
    assert policy_mod.cuda_config(16, 16, 2048, sms).combine == "barrier"
    monkeypatch.setenv("DSA_DECODE_TWO_LAUNCH", "1")
    assert policy_mod.cuda_config(16, 16, 2048, sms).combine == "two_launch"


def test_cuda_split_partials_scratch_is_checked_by_name():
    # fp16 partials with one fp32 scale per consumer thread and an fp32 lse per head, sized per partial.
    parts, cpu = 3, torch.device("cpu")
    partials = cuda_mod.SplitPartials.allocate(parts, cpu)
    assert partials.out.dtype == torch.float16 and partials.out.numel() == parts * 64 * 512
    assert partials.scale.numel() == parts * cuda_mod.PARTIAL_SCALES and partials.lse.numel() == parts * 64
    partials.check(parts, cpu)
    with pytest.raises(ValueError, match=r"partials.out: expected a contiguous torch.float16 tensor of at least 131072"):
        partials.check(parts + 1, cpu)
    with pytest.raises(ValueError, match=r"partials.scale: expected a contiguous torch.float32 tensor of at least 768"):
        replace(partials, scale=partials.scale[:-1]).check(parts, cpu)
    with pytest.raises(ValueError, match="partials.out: expected a contiguous torch.float16"):
        replace(partials, out=partials.out.float()).check(parts, cpu)
    with pytest.raises(ValueError, match="partials.lse: expected a contiguous"):
        replace(partials, lse=torch.empty(parts * 128, dtype=torch.float32)[::2]).check(parts, cpu)
    with pytest.raises(ValueError, match="partials.out is on cpu, q on meta"):
        partials.check(parts, torch.device("meta"))
    # only the split tokens' units write partials: b = 74, s_q 2, h_q 128 with 132 whole tokens, 4 splits
    assert cuda_mod.split_parts(148, 128, 4, 132) == 16 * 2 * 4 and cuda_mod.split_parts(148, 16, 4, 0) == 148 * 4
    assert cuda_mod.split_parts(148, 128, 1, 0) == 0 == cuda_mod.split_parts(148, 128, 4, 148)


PAGE_MAGIC_CHECK = r"""
#include <cstdio>
#include <random>
#include "decode_sm90.h"
// Every block size d <= 4096 and 3000 random ones up to 2^31 - 1, against ids near 0, near 2^31,
// around multiples of d and at random: the page (n * magic) >> shift must be n / d.
int main() {
  std::mt19937_64 rng(7);
  long bad = 0, checked = 0;
  auto check = [&](int d) {
    uint32_t magic;
    int shift;
    dsa_decode::block_magic_for(d, &magic, &shift);
    auto one = [&](uint32_t n) {
      ++checked;
      if (static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> shift) != n / static_cast<uint32_t>(d)) {
        if (bad++ < 5) std::printf("d=%d n=%u\n", d, n);
      }
    };
    for (uint32_t n = 0; n < 1024; ++n) one(n);
    for (uint32_t n = 0x7fffffffu; n > 0x7fffffffu - 1024; --n) one(n);
    for (int k = 0; k < 512; ++k) one(static_cast<uint32_t>(rng() & 0x7fffffffu));
    for (int64_t q = 1; q <= 0x7fffffff / d; q = q * 3 + 1) {
      one(static_cast<uint32_t>(q * d - 1));
      one(static_cast<uint32_t>(q * d));
      if (q * d < 0x7fffffff) one(static_cast<uint32_t>(q * d + 1));
    }
  };
  for (int d = 1; d <= 4096; ++d) check(d);
  for (int k = 0; k < 3000; ++k) check(1 + static_cast<int>(rng() % 0x7fffffffu));
  check(0x7fffffff);
  std::printf("checked %ld bad %ld\n", checked, bad);
  return bad != 0;
}
"""


@pytest.mark.slow
def test_page_magic_multiply_is_exact(tmp_path):
    """The CUDA producer finds a record's page as ``(id * block_magic) >> block_shift``
    (``block_magic_for`` in decode_sm90.h) instead of dividing by the block size: exact for every
    block size and every id below 2^31, checked here on the host code the launcher runs."""
    nvcc = cuda_build.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    source = tmp_path / "page_magic.cpp"
    source.write_text(PAGE_MAGIC_CHECK)
    binary = tmp_path / "page_magic"
    built = subprocess.run([nvcc, "-std=c++17", "-O2", "-I", str(cuda_mod.HERE / "csrc"), str(source), "-o", str(binary)],
                           capture_output=True, text=True)  # fmt: skip
    assert built.returncode == 0, built.stderr
    done = subprocess.run([str(binary)], capture_output=True, text=True)
    assert done.returncode == 0 and " bad 0" in done.stdout, done.stdout


@pytest.mark.slow
def test_cuda_library_builds_for_sm90a_without_a_gpu(tmp_path):
    """The decode library as a GPU machine builds it (plus ``-Xptxas -v``): both formats' decode
    kernels and the combine without spills or serialized wgmma, the header's constants matching
    the record descriptors, argument errors named before any CUDA call, only the C ABI exported."""
    if cuda_build.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    import re

    build = (cuda_mod.STEM, cuda_mod.WHAT, cuda_mod.HERE, cuda_mod.SOURCES, cuda_mod.HEADERS, "sm_90a")
    compiled = cuda_build.compile_library(*build, root=tmp_path, extra_flags=("-Xptxas", "-v"))
    assert "spill stores" in compiled.log and not re.search(r"[1-9]\d* bytes spill stores", compiled.log), compiled.log
    assert "C7512" not in compiled.log, "wgmma serialized for lack of registers"
    # Both formats with the halves and the scorer schedules (csrc/config.cuh, Role), with two producer
    # warpgroups but V4's halves with one (m64_producer_groups), each for uniform and mixed
    # whole+split schedules (kMixed). The 16/32-head kernel (launch_m16.cu): both formats at one and two
    # m16 tiles, two producer warpgroups, both schedules, and its combines.
    entries = re.findall(r"Compiling entry function '\w*?(decode_kernel_m16ILi[01]ELi[12]ELi2ELb[01]E|"
                         r"decode_kernelILi[01]ELb[01]ELi[12]ELb[01]E|"
                         r"combine_kernel_forINS0_11PartialsM16ILi[12]E|combine_kernelE)\w*'", compiled.log)  # fmt: skip
    m64 = [f"decode_kernelILi{f}ELb{s}ELi{g}ELb{m}E" for f, s, g in ((0, 0, 2), (0, 1, 2), (1, 0, 1), (1, 1, 2)) for m in (0, 1)]
    m16 = [f"decode_kernel_m16ILi{f}ELi{t}ELi2ELb{m}E" for f in (0, 1) for t in (1, 2) for m in (0, 1)]
    combines = ["combine_kernelE", "combine_kernel_forINS0_11PartialsM16ILi1E", "combine_kernel_forINS0_11PartialsM16ILi2E"]
    assert sorted(entries) == sorted(m64 + m16 + combines), compiled.log
    library = cuda_build.CudaLibrary(compiled, cuda_mod.WHAT, cuda_mod.PREFIX, cuda_mod.SIGNATURES)  # opens without a GPU
    assert library.mismatched(cuda_mod.EXPECTED_CONSTANTS) == []
    assert library.mismatched(dict(cuda_mod.EXPECTED_CONSTANTS, V4_QUANT_DIMS=512)) == ["V4_QUANT_DIMS"]

    g = shapes_mod.RecordGeometry.of(kvr.V32, 64)

    def launch_args(fmt=0, h_q=128, splits=1, q=16, whole=0, tickets=None):
        return [0, None, fmt, q, 0, 0, 0, 16, g.packed_page_bytes, 64, g.data_slot_bytes, g.scale_base, g.scale_slot_bytes,
                g.rope_offset, 16, 0, 0, None, None, 16, 0, 0, 0, 16, 0, 0, 0, None, None, None, tickets, 2, 2, h_q, 2048, splits,
                whole, 0.1]  # fmt: skip

    with pytest.raises(RuntimeError, match="format must be 0"):
        library.call("launch", *launch_args(fmt=2))
    with pytest.raises(RuntimeError, match="h_q must be 16, 32 or a positive multiple"):
        library.call("launch", *launch_args(h_q=96))
    with pytest.raises(RuntimeError, match="h_q must be 16, 32 or a positive multiple"):
        library.call("launch", *launch_args(h_q=48))
    with pytest.raises(RuntimeError, match="splits must be in"):
        library.call("launch", *launch_args(splits=33))
    with pytest.raises(RuntimeError, match="null tensor pointer"):
        library.call("launch", *launch_args(splits=2))  # no partial scratch
    with pytest.raises(RuntimeError, match="null tensor pointer"):
        library.call("launch", *launch_args(splits=2, whole=3))  # one token split: scratch needed
    with pytest.raises(RuntimeError, match=r"whole_tokens must be in \[0, batch \* s_q\]"):
        library.call("launch", *launch_args(whole=5))
    with pytest.raises(RuntimeError, match="needs splits dividing TICKETS_PER_CALL"):
        library.call("launch", *launch_args(splits=3, tickets=16))
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        library.call("launch", *launch_args(q=8))
    exported = exported_symbols(compiled.path)
    if exported is not None:
        wanted = {cuda_mod.PREFIX + name for name in [*cuda_mod.SIGNATURES, "error_string", *cuda_mod.EXPECTED_CONSTANTS]}
        assert exported == wanted, "the C ABI alone is exported"


def test_geometry_comes_from_the_descriptors():
    for fmt in FORMATS.values():
        for bs in (1, 2, 61, 64):
            g = shapes_mod.RecordGeometry.of(fmt, bs)
            at = fmt.offsets(bs - 1, bs)
            assert at["data"] == (bs - 1) * g.data_slot_bytes and at["scales"] == g.scale_base + (bs - 1) * g.scale_slot_bytes
            assert g.quant_dims + g.v_rope_dims == shapes_mod.D_V and g.d_qk - shapes_mod.D_V == g.k_extra_dims
    with pytest.raises(ValueError, match="e4m3 values"):
        shapes_mod.RecordGeometry.of(kvr.V41_FP4, 64)


_SM90_COMPILE = textwrap.dedent(
    """
    import json, re, sys, types, importlib
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    pkg = types.ModuleType("decode_sol"); pkg.__path__ = [sys.argv[1]]; sys.modules["decode_sol"] = pkg
    K = importlib.import_module("decode_sol.decode.triton_kernels")
    entry = importlib.import_module("decode_sol.decode.entry")
    from dsa_bench.definitions import kv_records as kvr
    block_h = int(sys.argv[2]) if len(sys.argv) > 2 else 64  # heads per program (16 and 32: the TP8 / TP4 path)
    result = {}
    for name, mode in (("V32", K.MODE_DIRECT), ("V4", K.MODE_BARRIER), ("V41", K.MODE_LAST)):
        fmt = kvr.get_format(name)
        g = entry.record_geometry(name, 64)
        fn = K._decode_kernel
        names = list(fn.arg_names)
        sig = {"q_ptr": "*bf16", "cache_ptr": "*u8", "idx_ptr": "*i32", "topk_length_ptr": "*i32", "sink_ptr": "*fp32",
               "out_ptr": "*bf16", "lse_ptr": "*fp32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "ticket_ptr": "*i32",
               "qk_scale_log2": "fp32", "page_stride": "i64"}
        sig.update({n: "i32" for n in names if n.startswith("stride_")})
        splits = 1 if mode == K.MODE_DIRECT else 16
        consts = dict(S_Q=2, TOPK=2048, D_V=512, BLOCK_H=block_h, BLOCK_N=64, NUM_SPLITS=splits, SPLIT_SCAN=2048 // splits, MODE=mode,
                      L2_PREFETCH=True, HAS_TOPK_LENGTH=name != "V32", HAS_SINK=True, **g.constexprs(), TICKET_STRIDE=K.TICKET_STRIDE,
                      TICKETS_PER_CALL=K.TICKETS_PER_CALL, INTERPRETED=False)
        sig.update({k: "constexpr" for k in consts})
        attrs = {(names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items() if v.startswith("*")}
        c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 8, "num_stages": 1})
        ptx = c.asm["ptx"]
        result[name] = {"mma": sorted(set(re.findall(r"wgmma\\.mma_async\\S*|mma\\.sync\\S*", ptx))), "shared": c.metadata.shared,
                        "atomics": len(re.findall(r"atom\\.global\\S*acq_rel", ptx)),
                        "polls": len(re.findall(r"ld\\.global\\S*acquire", ptx))}
    print(json.dumps(result))
    """
)


@pytest.mark.slow
def test_kernels_compile_for_sm90_with_wgmma():
    # Compiles the GPU tile (64 heads x 64 records, 8 warps) for Hopper with this machine's
    # Triton (no GPU needed): both products on wgmma, shared memory within the SM's 227 KB.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", _SM90_COMPILE, str(SOLUTION_DIR)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip
    if proc.returncode != 0 and ("No module named 'triton.backends" in proc.stderr or "ptxas" in proc.stderr.lower()):
        pytest.skip(f"this Triton cannot compile for sm_90 here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert any("m64n256k16.f32.bf16.bf16" in m for m in r["mma"]), (name, r)  # P·V: 256 value columns per warpgroup
        assert any("m64n32k16.f32.bf16.bf16" in m for m in r["mma"]), (name, r)  # q·k: 32 records per warpgroup
        assert r["shared"] <= 227 * 1024, (name, r)
    # no ticket at S = 1; the last-arriver combine arrives once; the barrier arrives, then polls with acquiring loads
    assert result["V32"]["atomics"] == 0 and result["V41"]["atomics"] == 1 and result["V41"]["polls"] == 0
    assert result["V4"]["atomics"] == 1 and result["V4"]["polls"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("block_h", [16, 32])
def test_kernels_compile_for_sm90_at_16_and_32_heads(block_h):
    # The TP8 / TP4 tiles (one head block of h_q, 8 warps, as select_config gives them) compile for
    # Hopper with this machine's Triton, on tensor-core instructions, within the SM's shared memory.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", _SM90_COMPILE, str(SOLUTION_DIR), str(block_h)], capture_output=True, text=True, env=env,
                          timeout=900, check=False)  # fmt: skip
    if proc.returncode != 0 and ("No module named 'triton.backends" in proc.stderr or "ptxas" in proc.stderr.lower()):
        pytest.skip(f"this Triton cannot compile for sm_90 here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert r["mma"] and r["shared"] <= 227 * 1024, (name, r)


def test_benchmark_lists_the_policy_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels" / "mla_decode.py"), "--list", "--format", "V32",
                           "--hq", "128", "--batch", "2", "--batch", "128"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()  # per shape the Triton kernel's config, then the SM90 CUDA kernel's schedule
    assert len(lines) == 4 and "splits=16" in lines[0] and "combine='barrier'" in lines[0] and lines[0].endswith("128 programs")
    assert lines[1].endswith("SM90 CUDA kernel: 0 tokens whole, 4 split 16 ways -> 128 programs")
    assert "splits=1," in lines[2] and lines[2].endswith("512 programs")
    assert lines[3].endswith("SM90 CUDA kernel: 256 tokens whole -> 512 programs")


def test_benchmark_cpu_dry_run_checks_its_inputs_and_reference():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels" / "mla_decode.py"), "--cpu-dry-run", "--format", "V4",
                           "--hq", "64", "--batch", "2", "--s-q", "1", "--topk", "64", "--s-k", "512"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": PASS") == 3 and "combine='last'" in proc.stdout and "combine='two_launch'" in proc.stdout


def test_benchmark_variant_sources_from_a_revision_or_a_folder(tmp_path):
    # NAME=REV takes solutions/triton as git has it at REV; NAME=DIR copies a copy of it; anything
    # else is refused naming the argument.
    bench = load_script("mla_decode")
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("no git history here")
    name, folder = bench.variant_sources("head=HEAD", tmp_path / "rev")
    assert name == "head"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", "HEAD", "solutions/triton/"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    copied = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
    assert copied == sorted(f.removeprefix("solutions/triton/") for f in listed)
    for file in listed:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{file}"], capture_output=True, check=True)
        assert (folder / file.removeprefix("solutions/triton/")).read_bytes() == shown.stdout
    name, copied_dir = bench.variant_sources(f"copy={ROOT / 'solutions' / 'triton'}", tmp_path / "dir")
    shipped = ROOT / "solutions" / "triton" / "decode" / "csrc" / "launch_sm90.cu"
    assert (copied_dir / "decode" / "csrc" / "launch_sm90.cu").read_bytes() == shipped.read_bytes()
    refused = [("noequals", "expected NAME=REV or NAME=DIR"), ("1x=HEAD", "expected NAME=REV"),
               ("x=no-such-revision-here", "neither a folder nor a git revision"), (f"x={tmp_path}", "has no decode/entry.py")]  # fmt: skip
    for bad, why in refused:
        with pytest.raises(ValueError, match=why):
            bench.variant_sources(bad, tmp_path / "bad")


def test_benchmark_imports_a_variant_as_its_own_package(tmp_path):
    # A variant's Python is its own: a copy whose entry differs is what runs, the shipped modules untouched.
    bench = load_script("mla_decode")
    name, folder = bench.variant_sources(f"marked={ROOT / 'solutions' / 'triton'}", tmp_path)
    (folder / "decode" / "entry.py").write_text((folder / "decode" / "entry.py").read_text() + "\nVARIANT_MARK = 'marked'\n")
    variant_entry, cuda = bench.import_variant(name, folder)
    assert variant_entry.VARIANT_MARK == "marked" and not hasattr(entry, "VARIANT_MARK")
    assert cuda.HERE == (folder / "decode").resolve() != cuda_mod.HERE


@pytest.mark.slow
def test_benchmark_builds_a_variant_without_a_gpu(tmp_path):
    if cuda_build.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    bench = load_script("mla_decode")
    name, folder = bench.variant_sources(f"copy={ROOT / 'solutions' / 'triton'}", tmp_path)
    _, cuda = bench.import_variant(name, folder)
    compiled = cuda_build.compile_library(f"{cuda.STEM}_{name}", f"variant {name}", cuda.HERE, cuda.SOURCES, cuda.HEADERS, "sm_90a")
    library = cuda_build.CudaLibrary(compiled, f"variant {name}", cuda.PREFIX, cuda.SIGNATURES)  # built for sm_90a, opened
    assert library.mismatched(cuda.EXPECTED_CONSTANTS) == []


# --------------------------------------------------------------------------- GPU


GPU = torch.device("cuda") if HAS_CUDA else None


def _gpu_case(fmt, b, s_q, h_q, topk=2048, seq_blocks=64, **kw):
    return make_case(fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, block_size=64, num_blocks=b * seq_blocks, device=GPU, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4"])
@pytest.mark.parametrize("b,h_q", [(2, 128), (2, 64), (16, 128)])
def test_gpu_production_shapes_default_config(name, b, h_q):
    fmt = FORMATS[name]
    lengths = [2048 - 700 * (i % 3) for i in range(b)] if fmt is kvr.V4 else None
    case, _, _ = _gpu_case(fmt, b, 2, h_q, valid_frac=0.97, empty_rows=(1,), sink=True, topk_length=lengths)
    check(fmt, case)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4", "V41"])
def test_gpu_every_combine_and_tiling(name):
    fmt = FORMATS[name]
    lengths = [2048, 1000] if fmt is not kvr.V32 else None
    case, _, _ = _gpu_case(fmt, 2, 2, 128, valid_frac=0.9, empty_rows=(3,), sink=True, topk_length=lengths)
    for config in (
        DecodeConfig(splits=16, combine="barrier"),
        DecodeConfig(splits=8, combine="last"),
        DecodeConfig(splits=4, combine="two_launch", partial_dtype="bf16"),
        DecodeConfig(splits=1, combine="none", num_stages=2),
        DecodeConfig(splits=2, block_n=32, combine="two_launch", l2_prefetch=False),
        DecodeConfig(splits=16, combine="barrier", num_stages=2, block_n=32),
    ):
        _, _, used = check(fmt, case, config)
        assert used.combine == config.combine


@pytest.mark.gpu
def test_gpu_barrier_words_reused_across_many_calls():
    # h_q 64: 4 units, so even 32 splits keep the barrier's grid (128 programs) co-resident
    fmt = kvr.V32
    case, _, _ = _gpu_case(fmt, 2, 2, 64)
    ref = reference(fmt, case)
    words = entry.ticket_words(GPU, 4)
    words.view(-1, kernels.TICKET_STRIDE)[:, 0].fill_(2**31 - 5 * kernels.TICKETS_PER_CALL)
    for i in range(60):
        splits = (2, 4, 8, 16, 32)[i % 5]
        out, lse, used = run(fmt, case, DecodeConfig(splits=splits, combine=("barrier", "last")[i % 2]))
        assert used.combine == ("barrier", "last")[i % 2]
        if i % 7 == 0:
            assert_matches(out, lse, *ref, f"call {i}")
    torch.cuda.synchronize()
    assert_matches(out, lse, *ref, "last call")
    assert (words.view(-1, kernels.TICKET_STRIDE)[:4, 0] % kernels.TICKETS_PER_CALL == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4"])
def test_gpu_cuda_kernel_is_the_default_and_matches_on_every_split(name):
    fmt = FORMATS[name]
    lengths = [2048, 1000] if fmt is kvr.V4 else None
    case, _, _ = _gpu_case(fmt, 2, 2, 128, valid_frac=0.9, empty_rows=(3,), sink=True, topk_length=lengths)
    _, _, used = check(fmt, case)
    assert used.kernel == "cuda" and used.splits > 1 and used.combine == "two_launch"
    # 1, 2 and 4 splits (at least 8 tiles a program) run the consumers' scorer schedule, the default
    # 16 and 32 the halves schedule (csrc/config.cuh, Role), in both formats; every split count with
    # the in-launch combine (the 32-split grid, 256 programs, is too large for it) and the combine kernel.
    for splits in (1, 2, 4, 16, 32):
        for combine in ("barrier", "two_launch") if splits > 1 else ("none",):
            if combine == "barrier" and splits == 32:
                continue
            _, _, used = check(fmt, case, replace(policy_mod.CUDA_CONFIG, splits=splits, combine=combine))
            assert (used.kernel, used.splits, used.combine) == ("cuda", splits, combine)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4"])
@pytest.mark.parametrize("h_q", [128, 64, 32, 16])
def test_gpu_cuda_kernel_with_whole_and_split_tokens(name, h_q):
    """cuda_schedule's mixed grid: the first whole_tokens query tokens whole, the later ones split
    (any count, 2 to 32), the combine merging only those; with an empty row and a short one among
    both, sinks and V4's topk_length. A mutation of the split units' partial index or of the combine's
    token fails it."""
    fmt = FORMATS[name]
    b, s_q = 3, 2
    lengths = [2048, 0, 700] if fmt is kvr.V4 else None
    case, _, _ = _gpu_case(fmt, b, s_q, h_q, valid_frac=0.9, empty_rows=(1, 4), sink=True, topk_length=lengths, seed=h_q)
    base = policy_mod.cuda_base_config(h_q)
    for whole, splits in ((1, 2), (3, 3), (5, 32), (4, 7), (0, 4)):
        for combine in ("two_launch", "barrier") if 64 % splits == 0 else ("two_launch",):
            _, _, used = check(fmt, case, replace(base, splits=splits, whole_tokens=whole, combine=combine))
            assert (used.kernel, used.splits, used.whole_tokens, used.combine) == ("cuda", splits, whole, combine)
    with pytest.raises(ValueError, match=r"whole_tokens must be in \[0, 6\]"):
        run(fmt, case, replace(base, splits=2, whole_tokens=7, combine="two_launch"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4"])
@pytest.mark.parametrize("block_size,topk,page_pad", [(64, 64, 0), (16, 600, 48), (61, 130, 16), (2, 100, 0)])
def test_gpu_cuda_kernel_on_small_pages_short_rows_and_padded_page_strides(name, block_size, topk, page_pad):
    fmt = FORMATS[name]
    lengths = [topk - 7, 0, topk] if fmt is kvr.V4 else None
    blocks = -(-3 * 2 * topk // block_size) + 2
    case, _, _ = make_case(fmt, b=3, s_q=2, h_q=64, topk=topk, block_size=block_size, num_blocks=blocks, page_pad=page_pad,
                           empty_rows=(2,), sink=True, topk_length=lengths, device=GPU)  # fmt: skip
    for splits in (1, 2):
        _, _, used = check(fmt, case, replace(policy_mod.CUDA_CONFIG, splits=splits))
        assert used.kernel == "cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4"])
@pytest.mark.parametrize("h_q", [16, 32])
def test_gpu_cuda_16_and_32_heads_on_every_split_and_query_count(name, h_q):
    """The 16/32-head CUDA kernel (16 heads mma.sync, 32 the transposed wgmma consumers of
    consumer_st.cuh): the default config, every split count, s_q 1..4, with
    an empty row, sinks (some heads without) and V4's topk_length (a short row, a zero-length row)."""
    fmt = FORMATS[name]
    for b, s_q in ((2, 1), (2, 2), (3, 3), (1, 4)):
        lengths = [2048, 0, 1000][:b] if fmt is kvr.V4 else None
        case, _, _ = _gpu_case(fmt, b, s_q, h_q, valid_frac=0.9, empty_rows=(b * s_q - 1,), sink=True, topk_length=lengths,
                               seed=b * 10 + s_q)  # fmt: skip
        _, _, used = check(fmt, case)
        assert (used.kernel, used.block_h) == ("cuda", h_q), used
        if (b, s_q) == (2, 2):
            for splits in (1, 2, 3, 4, 8, 16, 32):  # auto: the in-launch combine from h_q / 2 splits
                _, _, used = check(fmt, case, replace(policy_mod.cuda_base_config(h_q), splits=splits))
                assert (used.kernel, used.splits, used.block_h) == ("cuda", splits, h_q)
                assert used.combine == ("none" if splits == 1 else "barrier" if splits >= h_q // 2 else "two_launch")
                if splits in (2, 4, 16):  # the other combine
                    other = "two_launch" if used.combine == "barrier" else "barrier"
                    check(fmt, case, replace(policy_mod.cuda_base_config(h_q), splits=splits, combine=other))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["V32", "V4"])
@pytest.mark.parametrize("h_q", [16, 32])
@pytest.mark.parametrize("block_size,topk,page_pad", [(64, 64, 0), (16, 600, 48), (61, 130, 16), (2, 100, 0)])
def test_gpu_cuda_16_and_32_heads_on_small_pages_short_rows_and_padded_page_strides(name, h_q, block_size, topk, page_pad):
    fmt = FORMATS[name]
    lengths = [topk - 7, 0, topk] if fmt is kvr.V4 else None
    blocks = -(-3 * 2 * topk // block_size) + 2
    case, _, _ = make_case(fmt, b=3, s_q=2, h_q=h_q, topk=topk, block_size=block_size, num_blocks=blocks, page_pad=page_pad,
                           empty_rows=(2,), sink=True, topk_length=lengths, device=GPU)  # fmt: skip
    for splits in (1, 2, 5):
        _, _, used = check(fmt, case, replace(policy_mod.cuda_base_config(h_q), splits=splits))
        assert (used.kernel, used.block_h) == ("cuda", h_q)


@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [16, 128])
def test_gpu_cuda_in_launch_combine_keeps_its_ticket_words_across_split_counts_and_the_wrap(h_q):
    """The CUDA kernel's ticket words are the Triton kernel's (one buffer per stream): calls with
    2 to 32 splits, the in-launch combine and the combine kernel in turn, from just below the int32
    wrap, each leave every word on a multiple of the step, and every call's output is right."""
    fmt = kvr.V32
    case, _, _ = _gpu_case(fmt, 2, 2, h_q, valid_frac=0.9, empty_rows=(1,), sink=True)
    ref = reference(fmt, case)
    units = 4 * h_q // policy_mod.cuda_base_config(h_q).block_h
    words = entry.ticket_words(GPU, units)
    words.view(-1, kernels.TICKET_STRIDE)[:, 0].fill_(2**31 - 5 * kernels.TICKETS_PER_CALL)
    for i in range(30):
        splits = (2, 4, 8, 16, 32)[i % 5] if h_q == 16 else (2, 4, 8, 16)[i % 4]
        combine = ("barrier", "two_launch", "barrier")[i % 3]
        out, lse, used = run(fmt, case, replace(policy_mod.cuda_base_config(h_q), splits=splits, combine=combine))
        assert (used.kernel, used.combine) == ("cuda", combine)
        assert_matches(out, lse, *ref, f"call {i}: {splits} splits, {combine}")
    assert (words.view(-1, kernels.TICKET_STRIDE)[:units, 0] % kernels.TICKETS_PER_CALL == 0).all()


@pytest.mark.gpu
def test_gpu_cuda_in_launch_combine_refuses_a_grid_beyond_the_sms():
    """The library itself refuses the ticket barrier for a grid that could not all be resident
    (it would spin forever), whatever the Python policy said."""
    fmt = kvr.V32
    sms = torch.cuda.get_device_properties(GPU).multi_processor_count
    b = sms // 16 + 1  # s_q 1 at 16 heads and 16 splits: more programs than SMs
    case, _, _ = _gpu_case(fmt, b, 1, 16, seq_blocks=32)
    q, cache = case["q"], case["kv_cache"]
    out = torch.empty(*q.shape[:3], 512, dtype=torch.bfloat16, device=GPU)
    lse = torch.empty(*q.shape[:3], dtype=torch.float32, device=GPU)
    parts = cuda_mod.split_parts(b, 16, 16, 0)
    partials = cuda_mod.SplitPartials.allocate(parts, GPU, 16)
    geometry = entry.record_geometry(fmt.kv_format, cache.shape[1])
    with pytest.raises(Exception, match="invalid configuration"):
        cuda_mod.run(fmt, geometry, q, cache.view(torch.uint8), case["indices"], case["sm_scale"], None, None, out, lse, 16,
                     partials, 0, entry.ticket_words(GPU, parts // 16))  # fmt: skip
    three = cuda_mod.SplitPartials.allocate(cuda_mod.split_parts(b, 16, 3, 0), GPU, 16)
    with pytest.raises(ValueError, match="splits dividing 64"):
        cuda_mod.run(fmt, geometry, q, cache.view(torch.uint8), case["indices"], case["sm_scale"], None, None, out, lse, 3,
                     three, 0, entry.ticket_words(GPU, b))  # fmt: skip


@pytest.mark.gpu
def test_gpu_cuda_kernel_refuses_what_it_cannot_take():
    fmt = kvr.V41
    case, _, _ = _gpu_case(fmt, 2, 1, 64, topk=64, seq_blocks=2)
    _, _, used = check(fmt, case)
    assert used.kernel == "triton"  # V4.1 records: no CUDA path on SM90
    with pytest.raises(ValueError, match="CUDA MLA decode cannot take this call"):
        run(fmt, case, replace(policy_mod.CUDA_CONFIG, splits=1))


@pytest.mark.gpu
def test_benchmark_times_a_variant_and_forced_split_counts_beside_the_shipped_build(tmp_path):
    # The shipped sources as a variant: built apart, swapped in through the entry, checked and timed.
    out = tmp_path / "variant.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels" / "mla_decode.py"), "--format", "V32", "--hq", "64",
                           "--batch", "2", "--warmup", "1", "--iterations", "3", "--trials", "1", "--no-flashmla", "--out", str(out),
                           "--variant", f"same={ROOT / 'solutions' / 'triton'}", "--cuda-splits", "4", "--cuda-splits", "64"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())["records"]
    variant = [r for r in records if r["candidate"] == "variant same"]
    assert len(variant) == 1 and variant[0]["passed"] and variant[0]["us"] > 0, records
    assert "same" in proc.stdout
    # --cuda-splits: the shipped kernel at a forced split count, checked and timed; a count it refuses is an error row
    forced = {r["candidate"]: r for r in records if r["candidate"].startswith("splits=")}
    assert forced["splits=4"]["passed"] and forced["splits=4"]["us"] > 0, records
    assert forced["splits=64"]["us"] is None and "splits must be in [1, 32]" in forced["splits=64"]["error"], records



def _check_workload_case(workload, case, device):
    """The solution's entry on one case of a shipped workload, judged by the definition's own check
    with the workload's tolerances (what the harness does). Returns the config that ran."""
    definition = workload.definition
    fmt = mla_decode.FORMAT_OF[definition.name]
    inputs = build_inputs(definition, case, 11, device)
    args = definition.input_args(inputs)
    topk_length = args[5] if len(args) > 5 else None
    b, s_q, h_q, _ = inputs["q"].shape
    out = torch.full((b, s_q, h_q, shapes_mod.D_V), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((b, s_q, h_q), float("nan"), device=device)
    used = entry.mla_decode(fmt, *args[:5], topk_length, out, lse)
    result = definition.check(inputs, {"out": out, "lse": lse}, definition.expect(inputs), workload.settings.tolerance)
    assert result.status is Status.PASSED, f"{workload.name} {case.id} ({used}): {result.message}"
    return used


TP_GPU_CASES = {
    "mla_decode_v32_tp8": ["b1_sq1_k2048_sk128k_h16", "b8_sq2_k2048_sk128k_h16", "b128_sq2_k2048_sk32k_h16"],
    "mla_decode_v4_tp8": ["b8_sq1_k2048_sk128k_h16", "b64_sq2_k2048_sk64k_h16"],
    "mla_decode_v32_tp4": ["b32_sq1_k2048_sk64k_h32", "b128_sq2_k2048_sk32k_h32"],
    "mla_decode_v4_tp4": ["b1_sq2_k2048_sk128k_h32", "b8_sq2_k2048_sk128k_h32"],
    "mla_decode_v4_topk512": ["b2_sq2_k512_h128", "b8_sq2_k512_sk128k_h16", "b128_sq2_k512_sk32k_h16"],
    "mla_decode_v4_topk1024": ["b74_sq2_k1024_h128", "b1_sq2_k1024_sk128k_h16"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TP_GPU_CASES))
def test_gpu_16_and_32_heads_and_v4_topks_pass_the_definitions_check(name):
    workload = load_workload(ROOT / "workloads" / f"{name}.yaml")
    by_id = {c.id: c for c in workload.cases}
    for case_id in TP_GPU_CASES[name]:
        used = _check_workload_case(workload, by_id[case_id], GPU)
        h_q = by_id[case_id].axes["h_q"]
        # every case here is V3.2 or V4: the CUDA kernels on SM90 (the 16/32-head one below 64 heads)
        assert used.kernel == "cuda" and (h_q >= 64 or used.block_h == h_q), (case_id, used)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v32", "v4", "v41"])
def test_gpu_tiny_mix_cases_with_extreme_sinks(name):
    """The mixes' tiny cases on the GPU: 16/32 heads (the 16/32-head CUDA kernel for V3.2 and V4), s_q 4,
    top-512/1024, and every extreme sink (3e38 at h_q 64 on the CUDA kernel for V3.2 and V4) with empty rows exact."""
    workload = load_workload(ROOT / "workloads" / f"mla_decode_{name}_mix.yaml")
    tiny = [c for c in workload.cases if c.id.startswith("tiny_")]
    assert len(tiny) == 11
    for case in tiny:
        used = _check_workload_case(workload, case, GPU)
        if case.axes["h_q"] in (16, 32, 64):
            assert used.kernel == ("cuda" if name != "v41" else "triton"), (case.id, used)
            assert case.axes["h_q"] == 64 or used.block_h == case.axes["h_q"], (case.id, used)
