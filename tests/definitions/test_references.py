"""The batched references agree with the per-row spec (tests/per_row_spec.py) and never wait on the host.

Fresh random inputs and the edge cases of both contracts: L = 0, 1, 2047, 2048, 2049, 5824, page
boundaries, tie-heavy rows, shared pages with block-table tails that name no page; tokens with 0,
1, 2047 and 2048 valid slots, padding at the front, alternating and scattered, tokens sharing
slots, large logits. The indexer must select the same score multiset as the spec (any order, ties
broken any way) and emit passthrough rows exactly as the spec does (position order); attention
must agree within 1e-5 before the bf16 rounding of its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from conftest import ROOT
from per_row_spec import attention_per_token, indexer_per_row, indexer_row_scores
from torch.utils._python_dispatch import TorchDispatchMode

from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.checks import judge

CPU = torch.device("cpu")
INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- host syncs

_aten = torch.ops.aten
#: aten ops that read device data on the host (a device-to-host sync on CUDA)
_SYNCING_OPS = {
    _aten._local_scalar_dense,
    _aten.nonzero,
    _aten.masked_select,
    _aten._unique2,
    _aten.unique_dim,
    _aten.unique_consecutive,
    _aten.repeat_interleave,
}


class _NoHostSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in _SYNCING_OPS:
            raise AssertionError(f"host sync: {func}")
        if func.overloadpacket is _aten.index:  # a boolean mask index is a nonzero with a data-dependent shape
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
                raise AssertionError(f"host sync: {func} with a boolean mask")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail on every operation that needs a tensor's values on the host (item, bool, int,
    tolist, numpy, nonzero, unique, boolean-mask indexing)."""

    def refuse(*args, **kwargs):
        raise AssertionError("host sync: tolist/numpy")

    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "tolist", refuse)
        patch.setattr(torch.Tensor, "numpy", refuse)
        with _NoHostSync():
            yield


def test_the_sync_detector_catches_the_per_row_spec(monkeypatch):
    # The detector itself: the per-row loops sync on every row, the batched references never.
    _, inputs = indexer_inputs([2049, 10], 33)
    with pytest.raises(AssertionError, match="host sync"), no_host_sync(monkeypatch):
        indexer_per_row(**inputs)
    _, inputs = attention_inputs(counts([3, 0]))
    with pytest.raises(AssertionError, match="host sync"), no_host_sync(monkeypatch):
        attention_per_token(**inputs)
    for probe in (lambda t: t.sum().item(), lambda t: bool(t.any()), lambda t: t[t > 0], lambda t: t.tolist()):
        with pytest.raises(AssertionError, match="host sync"), no_host_sync(monkeypatch):
            probe(torch.arange(4))


# --------------------------------------------------------------------------- indexer


def indexer_inputs(
    lens: list[int],
    max_pages: int,
    seed: int = 0,
    distinct_keys: int | None = None,
    num_pages: int = 512,
    block_table: list[list[int]] | None = None,
    device: torch.device = CPU,
) -> tuple[dict, dict]:
    axes = idx.DEFINITION.axes({"batch_size": len(lens), "max_num_pages": max_pages, "num_pages": num_pages})
    given = {"seq_lens": torch.tensor(lens, dtype=torch.int32)}
    if block_table is not None:
        given["block_table"] = torch.tensor(block_table, dtype=torch.int32)
    params = {} if distinct_keys is None else {"k_index_cache_fp8": {"distinct_keys": distinct_keys}}
    assert not idx.validate(axes, given, params), idx.validate(axes, given, params)
    return axes, idx.generate(axes, given, params, InputRng(seed, device))


def shared_page_table(lens: list[int], max_pages: int, seed: int) -> list[list[int]]:
    """Rows sharing a prefix of pages (prefix caching); entries past a row's last page hold -1 or
    INT32_MAX, which no kernel may read."""
    rng = np.random.default_rng(seed)
    pool = [int(p) for p in rng.permutation(512)]
    shared, start, table = pool[:20], 20, []
    for n in lens:
        need = -(-n // idx.PAGE_SIZE)
        own = pool[start : start + max(0, need - len(shared))]
        start += len(own)
        used = (shared + own)[:need]
        table.append(used + [-1 if k % 2 else INT32_MAX for k in range(max_pages - need)])
    return table


def _zero_weights(inputs: dict) -> None:
    inputs["weights"].zero_()  # every score exactly 0: the whole row ties


def _three_valued_queries(inputs: dict) -> None:
    q = inputs["q_index_fp8"].float()
    inputs["q_index_fp8"] = torch.sign(q).to(torch.float8_e4m3fn)  # -1, 0, 1: few distinct logits


INDEXER_CASES = {
    "lengths": dict(lens=[0, 1, 2047, 2048, 2049, 5824], max_pages=91),
    "page_boundaries": dict(lens=[2112, 2111, 2049, 2048, 2047, 65, 64, 63], max_pages=33),
    "passthrough_only": dict(lens=[0, 1, 63, 64, 2047, 2048], max_pages=32),
    "one_page_table": dict(lens=[64, 0, 1, 63], max_pages=1),
    "all_empty": dict(lens=[0, 0, 0], max_pages=33),
    "ties_one_key": dict(lens=[3200, 2049, 2048, 700], max_pages=50, distinct_keys=1),
    "ties_three_keys": dict(lens=[5824, 4097, 2050], max_pages=91, distinct_keys=3),
    "ties_few_queries_and_keys": dict(lens=[3000, 2600], max_pages=50, distinct_keys=5, change=_three_valued_queries),
    "zero_weights": dict(lens=[2560, 2049, 0], max_pages=40, change=_zero_weights),
    "shared_pages": dict(lens=[2500, 2500, 2100, 100, 0], max_pages=40, shared=True),
    "random_batch_31": dict(lens=None, max_pages=91, num_pages=2000),
}


def build_indexer_case(name: str, seed: int = 1) -> tuple[dict, dict]:
    spec = dict(INDEXER_CASES[name])
    lens = spec["lens"] if spec["lens"] is not None else np.random.default_rng(seed).integers(0, 5825, 31).tolist()
    table = shared_page_table(lens, spec["max_pages"], seed) if spec.get("shared") else None
    axes, inputs = indexer_inputs(lens, spec["max_pages"], seed, spec.get("distinct_keys"), spec.get("num_pages", 512), table)
    if "change" in spec:
        spec["change"](inputs)
    return axes, inputs


def positions_of(ids: torch.Tensor, table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Token positions of a row's physical ids (each must be one of the row's tokens)."""
    row_ids = idx.token_ids(table_row, seq_len)
    order = torch.argsort(row_ids)
    at = torch.searchsorted(row_ids[order], ids.long()).clamp_max(seq_len - 1)
    pos = order[at]
    assert torch.equal(row_ids[pos], ids.long()), "an id that is not one of the row's tokens"
    return pos


def assert_indexer_agrees(axes: dict, inputs: dict) -> None:
    batched = idx.reference(**inputs)["topk_indices"]
    spec = indexer_per_row(**inputs)
    assert batched.dtype == torch.int32 and batched.shape == spec.shape
    for b, n in enumerate(inputs["seq_lens"].tolist()):
        if n <= idx.TOPK:  # passthrough: the same ids in the same (position) order, then -1
            assert torch.equal(batched[b], spec[b]), f"row {b} (L = {n})"
            continue
        chosen = batched[b]
        assert bool((chosen >= 0).all()) and torch.unique(chosen).numel() == idx.TOPK, f"row {b}: 2048 distinct ids"
        table_row = inputs["block_table"][b]
        scores = indexer_row_scores(inputs["q_index_fp8"][b], inputs["k_index_cache_fp8"], inputs["weights"][b], table_row, n)
        picked = torch.sort(scores[positions_of(chosen, table_row, n)], descending=True).values
        ranked = torch.sort(scores, descending=True).values
        noise = 1e-6 * float(scores.abs().max()) + 1e-30  # float32 sums in another order
        assert float((ranked[: idx.TOPK] - picked).abs().max()) <= noise, f"row {b}: not the spec's score multiset"
        if float(ranked[idx.TOPK - 1] - ranked[idx.TOPK]) > 2 * noise:  # no tie at the boundary: the very same set
            assert torch.equal(torch.sort(chosen).values, torch.sort(spec[b]).values), f"row {b}"
    result = judge(idx.DEFINITION, axes, inputs, {"topk_indices": batched}, idx.expect(inputs), Tolerance(), inputs["seq_lens"].device)
    assert result.passed, result.message


@pytest.mark.parametrize("name", list(INDEXER_CASES))
def test_indexer_reference_matches_the_per_row_spec(name):
    assert_indexer_agrees(*build_indexer_case(name))


@pytest.mark.parametrize("seed", [2])
def test_indexer_reference_on_fresh_random_batches(seed):
    assert_indexer_agrees(*build_indexer_case("random_batch_31", seed))


@pytest.mark.parametrize("name", ["lengths", "shared_pages", "ties_three_keys"])
def test_indexer_scores_and_expectation_match_the_spec_row_scores(name):
    _, inputs = build_indexer_case(name)
    args = (inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"], inputs["block_table"])
    batched = idx.scores(*args)
    assert batched.shape == (len(inputs["seq_lens"]), inputs["block_table"].shape[1] * idx.PAGE_SIZE)
    expected = idx.expect(inputs)
    for b, n in enumerate(inputs["seq_lens"].tolist()):
        assert bool(torch.isneginf(batched[b, n:]).all()), "positions >= seq_len score -inf"
        if n == 0:
            assert expected[b] is None
            continue
        spec = indexer_row_scores(inputs["q_index_fp8"][b], inputs["k_index_cache_fp8"], inputs["weights"][b], inputs["block_table"][b], n)
        assert bool(torch.isfinite(batched[b, :n]).all()), "the NaN bytes of unread pages never reach a score"
        allowed = 1e-6 * float(spec.abs().max()) + 1e-30
        assert float((batched[b, :n] - spec).abs().max()) <= allowed
        one_row = idx.row_scores(inputs["q_index_fp8"][b], inputs["k_index_cache_fp8"], inputs["weights"][b], inputs["block_table"][b], n)
        assert float((one_row - spec).abs().max()) <= allowed
        if n <= idx.TOPK:
            assert expected[b] is None, "a passthrough row needs no scores"
        else:
            assert expected[b].scores.shape == (n,) and float((expected[b].scores - spec).abs().max()) <= allowed
            assert expected[b].tie_tolerance > 0


def test_indexer_reference_makes_no_host_sync(monkeypatch):
    for name in ("lengths", "shared_pages", "passthrough_only"):
        _, inputs = build_indexer_case(name)
        with no_host_sync(monkeypatch):
            out = idx.reference(**inputs)["topk_indices"]
        assert torch.equal(out, idx.reference(**inputs)["topk_indices"])


# --------------------------------------------------------------------------- sparse attention


def counts(valid: list[int], padding: str = "tail") -> dict:
    return {"params": {"sparse_indices": {"valid_counts": valid, "padding": padding}}}


def explicit_rows(seed: int = 5, num_pages: int = 256) -> dict:
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in rng.choice(num_pages * attn.PAGE_SIZE, 4096, replace=False)]
    full = ids[:2048]
    rows = [
        [-1] + full[:2047],  # padding at the front
        [full[k // 2] if k % 2 == 0 else -1 for k in range(2048)],  # every other slot
        [-1] * 2047 + [ids[2048]],  # one valid id, in the last slot
        [-1] + full[:2047],  # the same slots as token 0
        full[:1024] + [-1] * 512 + ids[2048:2560],  # half shared, a gap of padding in the middle
        [-1] * 2048,  # empty, between full tokens
        full,  # every slot valid
    ]
    return {"given": {"sparse_indices": torch.tensor(rows, dtype=torch.int32)}}


def attention_inputs(
    case: dict, seed: int = 0, sm_scale: float | None = None, num_pages: int = 256, device: torch.device = CPU
) -> tuple[dict, dict]:
    given = dict(case.get("given", {}))
    params = case.get("params", {})
    tokens = len(given["sparse_indices"]) if "sparse_indices" in given else len(params["sparse_indices"]["valid_counts"])
    if sm_scale is not None:
        given["sm_scale"] = sm_scale
    axes = attn.DEFINITION.axes({"num_tokens": tokens, "num_pages": num_pages})
    assert not attn.validate(axes, given, params)
    return axes, attn.generate(axes, given, params, InputRng(seed, device))


ATTENTION_CASES = {
    "counts": (counts([0, 1, 2048, 2047, 64]), None),
    "counts_scattered": (counts([0, 1, 2048, 2047, 64, 5], "scattered"), None),
    "all_empty": (counts([0, 0, 0]), None),
    "one_empty_token": (counts([0]), None),
    "explicit_padding_and_shared_slots": (explicit_rows(), None),
    "large_logits_0.5": (counts([2048, 1, 0, 300]), 0.5),
    "large_logits_1.0": (counts([2048, 700]), 1.0),
    "random_full": (counts([2048] * 8), None),
}


@pytest.mark.parametrize("name", list(ATTENTION_CASES))
def test_attention_reference_matches_the_per_token_spec(name):
    case, sm_scale = ATTENTION_CASES[name]
    axes, inputs = attention_inputs(case, seed=len(name), sm_scale=sm_scale)
    out, lse = attn.attend(**inputs)
    spec_out, spec_lse = attention_per_token(**inputs)
    empty = (inputs["sparse_indices"] < 0).all(dim=1)
    assert bool((out[empty] == 0).all()) and bool(torch.isneginf(lse[empty]).all()), "an empty token: output 0, lse -inf"
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse[~empty]).all())
    torch.testing.assert_close(out, spec_out, atol=1e-5, rtol=0)
    # float32 resolution: |lse| reaches about 170 at sm_scale 1.0, where one unit in the last place is 1.5e-5
    torch.testing.assert_close(lse, spec_lse, atol=1e-5, rtol=2e-7)
    ref = attn.reference(**inputs)
    assert ref["output"].dtype == torch.bfloat16 and torch.equal(ref["output"], out.to(torch.bfloat16)) and torch.equal(ref["lse"], lse)
    # the bf16 output is the spec's within its rounding
    torch.testing.assert_close(ref["output"].float(), spec_out, atol=1e-5, rtol=2**-8)
    result = judge(attn.DEFINITION, axes, inputs, ref, attn.expect(inputs), Tolerance(), CPU)
    assert result.passed, result.message


def test_attention_reference_makes_no_host_sync(monkeypatch):
    for case, sm_scale in (ATTENTION_CASES["counts"], ATTENTION_CASES["explicit_padding_and_shared_slots"]):
        _, inputs = attention_inputs(case, sm_scale=sm_scale)
        with no_host_sync(monkeypatch):
            out = attn.reference(**inputs)
        assert torch.equal(out["output"], attn.reference(**inputs)["output"])


# --------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_references_on_cuda_make_no_host_sync_and_match_the_spec():
    cuda = torch.device("cuda")
    cases = [
        indexer_inputs([0, 1, 2047, 2048, 2049, 5824], 91, seed=4, device=cuda),
        indexer_inputs(
            [2500, 2500, 2100, 100, 0], 40, seed=4, block_table=shared_page_table([2500, 2500, 2100, 100, 0], 40, 4), device=cuda
        ),
    ]
    for axes, inputs in cases:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            idx.reference(**inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert_indexer_agrees(axes, inputs)
    for case, sm_scale in (ATTENTION_CASES["counts"], ATTENTION_CASES["explicit_padding_and_shared_slots"]):
        _, inputs = attention_inputs(case, sm_scale=sm_scale, device=cuda)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out, lse = attn.attend(**inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        spec_out, spec_lse = attention_per_token(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        torch.testing.assert_close(out.cpu(), spec_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(lse.cpu(), spec_lse, atol=1e-5, rtol=2e-7)


# --------------------------------------------------------------------------- the benchmark script


def test_reference_benchmark_script_runs_on_a_cpu(tmp_path):
    out = tmp_path / "references.json"
    script = ROOT / "benchmarks" / "kernels" / "references.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(script), "-w", "indexer_smoke", "-w", "sparse_attention_smoke", "-c", "smoke_*", "--baseline", "HEAD",
         "--repeats", "1", "--clock", "process", "--threads", "1", "--device", "cpu", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    for workload, n_cases in (("indexer_smoke", 4), ("sparse_attention_smoke", 3)):
        report = doc["workloads"][workload]
        assert len(report["cases"]) == n_cases
        assert {"batched_call_ms", "per_row_call_ms", "HEAD_call_ms", "batched_expect_ms", "HEAD_expect_ms"} <= set(report["totals_ms"])
        assert all(r["batched_timer"] == "host process clock, median" for r in report["cases"])
    assert "of batched" in proc.stdout
