"""The flashmla peer's head padding (solutions/flashmla/heads.py, entry.py) on a CPU: 16 and 32 heads are
padded to 64 for FlashMLA and sliced back, as serving engines do. FlashMLA itself needs an SM90 GPU, so the
entry runs here against a stand-in ``flash_mla`` module that holds FlashMLA's head assert and lse layout and
computes with the definition's reference; the GPU test in tests/definitions/test_mla_decode.py runs the real one."""

from __future__ import annotations

import importlib
import json
import sys
import types
import weakref

import pytest
import torch
from conftest import ROOT

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import mla_decode as md
from dsa_bench.definitions.base import Tolerance
from dsa_bench.definitions.status import Status
from dsa_bench.workloads import build_inputs, load_trace

SOLUTION = ROOT / "solutions" / "flashmla"
CPU = torch.device("cpu")


def _package(name: str) -> None:
    package = types.ModuleType(name)
    package.__path__ = [str(SOLUTION)]
    sys.modules[name] = package


_package("dsa_test_flashmla_heads")
heads = importlib.import_module("dsa_test_flashmla_heads.heads")


class FakeFlashMla(types.ModuleType):
    """``flash_mla`` as the entry calls it: asserts FlashMLA's head counts, returns out [b, s_q, h, 512] and
    lse [b, h, s_q] (the wheel's layout), computed by the definition's reference; records each call's q."""

    def __init__(self) -> None:
        super().__init__("flash_mla")
        self.heads_seen: list[int] = []
        self.__file__ = "<the test's stand-in>"

    def get_mla_metadata(self):
        return object(), None

    def flash_mla_with_kvcache(self, q, kv_cache, block_table, cache_seqlens, head_dim_v, meta, *, softmax_scale, is_fp8_kvcache,
                               indices, attn_sink, use_legacy, kv_format, topk_length=None):  # fmt: skip
        assert q.shape[2] in (64, 128) and attn_sink.shape == (q.shape[2],), "FlashMLA's sparse decode takes 64 or 128 heads"
        assert block_table is None and cache_seqlens is None and is_fp8_kvcache and use_legacy and head_dim_v == 512
        self.heads_seen.append(q.shape[2])
        fmt = {"V32": md.V32, "V4": md.V4}[kv_format]
        out, lse = md.attend(fmt, q, kv_cache, indices, softmax_scale, attn_sink, topk_length)
        return out.to(torch.bfloat16), lse.transpose(1, 2).contiguous()


@pytest.fixture
def entry(monkeypatch):
    fake = FakeFlashMla()
    monkeypatch.setitem(sys.modules, "flash_mla", fake)
    name = "dsa_test_flashmla_entry"
    _package(name)
    monkeypatch.delitem(sys.modules, f"{name}.entry", raising=False)
    module = importlib.import_module(f"{name}.entry")
    yield module, fake
    sys.modules.pop(f"{name}.entry", None)
    sys.modules.pop(name, None)


@pytest.mark.parametrize(("h_q", "heads_run"), [(16, 64), (32, 64), (64, 64), (128, 128)])
def test_head_counts_flashmla_runs(h_q, heads_run):
    assert heads.flashmla_heads(h_q) == heads_run


@pytest.mark.parametrize("h_q", [0, 96, 256])
def test_head_counts_it_cannot_run_are_refused(h_q):
    with pytest.raises(ValueError, match=f"h_q = {h_q}: FlashMLA's sparse decode takes 64 or 128 heads"):
        heads.flashmla_heads(h_q)


def test_padding_puts_zero_queries_and_no_sink_after_the_real_heads():
    q = torch.randn(2, 3, 16, md.V32.d_qk).to(torch.bfloat16)
    sink = torch.randn(16)
    padded_q, padded_sink = heads.pad_heads(q, sink, 64)
    assert padded_q.shape == (2, 3, 64, md.V32.d_qk) and padded_q.dtype == q.dtype and padded_q.is_contiguous()
    assert torch.equal(padded_q[:, :, :16], q) and padded_q[:, :, 16:].eq(0).all()
    assert torch.equal(padded_sink[:16], sink) and torch.isneginf(padded_sink[16:]).all()
    out, lse = torch.randn(2, 3, 64, 512), torch.randn(2, 3, 64)
    got_out, got_lse = heads.slice_heads(out, lse, 16)
    assert torch.equal(got_out, out[:, :, :16]) and got_out.data_ptr() == out.data_ptr()  # a view, no copy
    assert torch.equal(got_lse, lse[:, :, :16])


def _case(tmp_path, fmt: str, h_q: int, s_q: int, sink: dict | None = None):
    definition = get_definition(f"dsa_mla_decode_{fmt}_fp8")
    record = md.FORMAT_OF[definition.name]
    axes = {"b": 3, "s_q": s_q, "h_q": h_q, "topk": 64, "s_k": 300, "num_blocks": 24, "block_size": 64,
            "page_bytes": record.page_stride(64)}  # fmt: skip
    inputs = {"indices": {"type": "random", "params": {"empty_rows": 1, "short_rows": 1, "padding": "scattered"}}}
    if sink is not None:
        inputs["attn_sink"] = {"type": "random", "params": sink}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "c", "axes": axes, "inputs": inputs}) + "\n")
    (case,) = load_trace(path, definition)
    return definition, build_inputs(definition, case, 7, CPU)


@pytest.mark.parametrize("fmt", ["v32", "v4"])
@pytest.mark.parametrize(("h_q", "s_q", "sink"), [(16, 2, None), (32, 4, None), (16, 1, {"value": 3e38}), (64, 2, None)])
def test_entry_pads_to_64_heads_and_returns_the_definitions_answer(entry, tmp_path, fmt, h_q, s_q, sink):
    module, fake = entry
    definition, inputs = _case(tmp_path, fmt, h_q, s_q, sink)
    kernel = module.decode_v32 if fmt == "v32" else module.decode_v4
    out, lse = kernel(*definition.input_args(inputs))
    assert fake.heads_seen == [max(h_q, 64)]
    assert tuple(out.shape) == (3, s_q, h_q, 512) and tuple(lse.shape) == (3, s_q, h_q)
    result = definition.check(inputs, {"out": out, "lse": lse}, definition.expect(inputs), Tolerance(lse_atol=1e-4))
    assert result.status is Status.PASSED, result.message
    assert "padded to 64 heads" in module.solution_notes()


def test_a_padded_graph_is_found_again_only_with_its_own_topk_length_tensor(entry):
    # The captured graph holds the schedule of its topk_length's values: a new tensor that inherits a
    # dead one's address, shape and version (the allocator reuses memory between input sets, and the
    # key is made of exactly those) must not replay it.
    module, _ = entry
    graphs = module.PaddedGraphs()
    lengths = torch.tensor([5, 7], dtype=torch.int32)
    key = ("V4", 1.0, 64, "any argument set")
    graphs.calls[key] = call = module._PaddedCall(torch.zeros(1), torch.zeros(1), weakref.ref(lengths))
    assert graphs.cached(key, lengths) is call
    del lengths
    same_values = torch.tensor([5, 7], dtype=torch.int32)
    assert graphs.cached(key, same_values) is None and key not in graphs.calls
    graphs.calls[key] = module._PaddedCall(torch.zeros(1), torch.zeros(1))  # V3.2: no topk_length, no schedule values
    assert graphs.cached(key, None) is graphs.calls[key]
