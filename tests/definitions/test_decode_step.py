"""The decode-step definitions (issue 51): reference, checks (ids modulo ties, out/lse on the solution's ids,
records byte-exact), validation, workloads, and the Triton and production solutions' CPU-testable parts."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest
import torch
from conftest import ROOT, run_cli

from dsa_bench.definitions import decode_step as ds
from dsa_bench.definitions import get_definition, indexer, kv_insert, mla_decode
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.checks import judge
from dsa_bench.definitions.kv_records import INDEXER_KEY_PAGE, V4, V32
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.workloads import load_trace, load_workload

CPU = torch.device("cpu")
TOL = Tolerance(atol=1e-2, rtol=1e-2, lse_atol=1e-4)
FORMATS = {"v32": V32, "v4": V4}


def _axes(fmt, b=3, s_q=2, h_q=16, max_pages=40, spare=4, padded=False):
    definition = get_definition(ds.name_of(fmt, 2048))
    var = {"b": b, "s_q": s_q, "h_q": h_q, "max_num_pages": max_pages, "num_blocks": b * max_pages + spare,
           "page_bytes": fmt.page_stride(64) + (fmt.tma_stride if padded else 0)}
    if fmt is V4:
        var["max_position"] = max_pages * 64
    return definition, definition.axes(var)


def _inputs(fmt, lens, seed=1, s_q=2, h_q=16, skip=0, padded=False):
    definition, axes = _axes(fmt, b=len(lens), s_q=s_q, h_q=h_q, max_pages=max(1, -(-max(lens) // 64)), padded=padded)
    given = {"seq_lens": torch.tensor(lens, dtype=torch.int32)}
    params = {"slot_mapping": {"skip": skip}} if skip else {}
    assert definition.validate(axes, given, params) == []
    return definition, axes, definition.generate(axes, given, params, InputRng(seed, CPU))


def _copy(inputs):
    """A solution's own copy of an input set (the caches are updated in place)."""
    out = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    backing = ds.kv_pages(inputs["kv_cache"]).clone()
    out["kv_cache"] = mla_decode.cache_view(V32 if "kv_c" in inputs else V4, backing, 64)
    return out


def _solve(definition, inputs, outputs=None):
    """Run the reference as a solution on a copy; its outputs plus what the harness observes."""
    mine = _copy(inputs)
    got = definition.reference(*definition.input_args(mine)) if outputs is None else outputs(mine)
    return {**got, **definition.observed_values(mine)}


# --------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_reference_equals_a_direct_per_row_composition(fmt):
    """The batched reference against the stages composed by hand, one query row at a time."""
    definition, axes, inputs = _inputs(fmt, [2300, 1500, 1, 0], skip=1)
    got = _solve(definition, inputs)
    kv_backing = ds.kv_pages(inputs["kv_cache"]).clone()
    index_cache = inputs["index_cache"].clone()
    b, s_q = inputs["slot_mapping"].shape
    slots = inputs["slot_mapping"].reshape(-1)
    rows = ds._mla_rows(fmt, inputs)
    fmt.write(kv_backing, 64, slots, kv_insert.expected_records(fmt, rows).parts)
    keys = INDEXER_KEY_PAGE.quantize(inputs["index_k"].reshape(-1, 128).float(), "raw")
    INDEXER_KEY_PAGE.write(index_cache, 64, slots, keys)
    kv_cache = mla_decode.cache_view(fmt, kv_backing, 64)
    for i in range(b):
        for s in range(s_q):
            length = max(0, int(inputs["seq_lens"][i]) - (s_q - 1 - s))
            table = inputs["block_table"][i : i + 1]
            ids = indexer.reference(inputs["q_index_fp8"][i, s][None], index_cache, inputs["weights"][i, s][None],
                                    torch.tensor([length], dtype=torch.int32), table)["topk_indices"]
            assert torch.equal(got["topk_indices"][i, s], ids[0]), (i, s)
            one = mla_decode.decode(fmt, inputs["q"][i : i + 1, s : s + 1], kv_cache, ids[None], inputs["sm_scale"], inputs["attn_sink"])
            assert torch.equal(got["out"][i, s], one["out"][0, 0]) and torch.equal(got["lse"][i, s], one["lse"][0, 0]), (i, s)
    # an empty sequence: every id -1, out 0, lse +inf; the one-token sequence's first query row sees nothing
    assert bool((got["topk_indices"][3] == -1).all()) and bool(torch.isposinf(got["lse"][3]).all())
    assert bool((got["topk_indices"][2, 0] == -1).all()) and int((got["topk_indices"][2, 1] >= 0).sum()) == 1
    assert definition.check(inputs, got, definition.expect(inputs), TOL).passed


def test_new_tokens_are_scored_and_read_from_the_updated_caches():
    """The new token's key and record are in the caches the indexer and the decode read: a step that reads the
    caches as given (NaN at the new slots) fails."""
    definition, axes, inputs = _inputs(V32, [1200], s_q=1)
    slot = int(inputs["slot_mapping"][0, 0])
    assert bool(torch.isnan(INDEXER_KEY_PAGE.scales(inputs["index_cache"])[slot // 64, slot % 64]))  # unwritten before the call

    def without_insert(mine):
        ids = ds.select(mine, mine["index_cache"], 2048)
        return {**mla_decode.decode(V32, mine["q"], mine["kv_cache"], ids, mine["sm_scale"], mine["attn_sink"]), "topk_indices": ids}

    result = definition.check(inputs, _solve(definition, inputs, without_insert), definition.expect(inputs), TOL)
    assert result.status == Status.INCORRECT_NUMERICAL and "kv_pages" in result.message


# --------------------------------------------------------------------------- the checks


def _scored_row_inputs(fmt=V32):
    return _inputs(fmt, [3000, 2100], s_q=2)


def test_a_planted_wrong_id_fails_the_indexer_check():
    definition, axes, inputs = _scored_row_inputs()
    expected = definition.expect(inputs)
    got = _solve(definition, inputs)
    # swap the reference's selected token of row (0, 1) with the lowest-scoring token it left out
    scores = indexer.scores(**{k: v for k, v in expected.rows.items()})[1]
    lens = int(expected.rows["seq_lens"][1])
    table = expected.rows["block_table"][1]
    ids_all = indexer.token_ids(table, lens)
    chosen = set(got["topk_indices"][0, 1].tolist())
    order = torch.argsort(scores[:lens])
    worst = next(int(ids_all[j]) for j in order.tolist() if int(ids_all[j]) not in chosen)
    got["topk_indices"][0, 1, 0] = worst
    result = definition.check(inputs, got, expected, TOL)
    assert result.status == Status.INCORRECT_INDICES
    assert "topk_indices (indexer row = b x s_q + s): row 1: not a top-2048 set" in result.message


def _tied_inputs():
    """Every context key of sequence 0 equal: its scores tie, so any 2048 of them are a correct selection."""
    definition, axes, inputs = _inputs(V32, [2600, 100], s_q=1)
    cache = inputs["index_cache"]
    ids = indexer.token_ids(inputs["block_table"][0], 2600)
    new = int(inputs["slot_mapping"][0, 0])
    ids = ids[ids != new]
    first = INDEXER_KEY_PAGE.read(cache, 64, ids[:1])
    repeated = type(first)(first.values.expand(ids.numel(), -1), first.scales.expand(ids.numel(), -1), first.rope.expand(ids.numel(), -1))
    INDEXER_KEY_PAGE.write(cache, 64, ids, repeated)
    inputs["index_k"][0, 0] = -10.0  # the new token scores 0 (relu of negative dots with positive queries): below the ties
    inputs["q_index_fp8"][0, 0] = inputs["q_index_fp8"][0, 0].float().abs().to(torch.float8_e4m3fn)
    inputs["weights"][0, 0] = inputs["weights"][0, 0].abs()
    return definition, inputs, ids


def test_a_tie_choice_passes_with_out_and_lse_judged_on_its_own_ids():
    definition, inputs, tied = _tied_inputs()
    expected = definition.expect(inputs)
    chosen = set(expected.ids[0, 0].tolist())
    others = [i for i in tied.tolist() if i not in chosen]
    assert len(others) >= 100  # the reference left tied tokens out

    def tie_choice(mine):
        ds.insert(V32, mine, mine["kv_cache"], mine["index_cache"])
        ids = expected.ids.clone()
        ids[0, 0, :100] = torch.tensor(others[:100], dtype=torch.int32)  # another 2048 of the tied tokens
        return {**mla_decode.decode(V32, mine["q"], mine["kv_cache"], ids, mine["sm_scale"], mine["attn_sink"]), "topk_indices": ids}

    got = _solve(definition, inputs, tie_choice)
    result = definition.check(inputs, got, expected, TOL)
    assert result.passed, result.message
    assert "judged against the decode reference on the solution's ids" in result.message
    # the rule matters: the same ids with the reference's own out/lse fail, as out/lse of other tokens must
    stale = {**got, "out": expected.out, "lse": expected.lse}
    assert definition.check(inputs, stale, expected, TOL).status == Status.INCORRECT_NUMERICAL


@pytest.mark.parametrize(("name", "fmt"), [("kv_pages", V32), ("kv_pages", V4), ("index_pages", V32)])
def test_one_wrong_byte_of_a_written_record_fails_naming_its_field(name, fmt):
    definition, axes, inputs = _inputs(fmt, [300, 700], s_q=2, skip=1)
    expected = definition.expect(inputs)
    got = _solve(definition, inputs)
    assert definition.check(inputs, got, expected, TOL).passed
    b, s = (int(i) for i in torch.nonzero(inputs["slot_mapping"] >= 0)[0])
    slot = int(inputs["slot_mapping"][b, s]) % 64
    record = (fmt if name == "kv_pages" else INDEXER_KEY_PAGE).offsets(slot, 64)
    got[name][b, s, record["scales"]] ^= 0x01
    result = definition.check(inputs, got, expected, TOL)
    assert result.status == Status.INCORRECT_NUMERICAL
    assert f"{name}: new token (b {b}, s {s})" in result.message and "scale 0 byte 0 (the new token's record)" in result.message
    assert "1 byte(s) differ" in result.message


def test_a_write_through_a_skipped_slot_is_seen_on_its_page():
    """A -1 slot's page is observed as zeros; a token's neighbours on its page must keep their bytes."""
    definition, axes, inputs = _inputs(V32, [500, 900], s_q=2)
    expected = definition.expect(inputs)
    got = _solve(definition, inputs)
    slot = int(inputs["slot_mapping"][1, 1]) % 64
    neighbour = V32.offsets((slot + 1) % 64, 64)["data"]
    got["kv_pages"][1, 1, neighbour] ^= 0x80
    result = definition.check(inputs, got, expected, TOL)
    assert result.status == Status.INCORRECT_NUMERICAL and "another token's bytes (must stay as given)" in result.message


def test_observed_outputs_are_spec_checked():
    definition, axes, inputs = _inputs(V32, [100], s_q=1)
    got = _solve(definition, inputs)
    del got["index_pages"]
    result = judge(definition, axes, inputs, got, definition.expect(inputs), TOL, CPU)
    assert result.status == Status.INCORRECT_SHAPE and "'index_pages'" in result.message


def test_min_traffic_counts_every_scored_key_and_the_selected_records():
    definition, axes, inputs = _inputs(V32, [3000, 100], s_q=1, h_q=16)
    bound = definition.min_traffic_bytes(axes, inputs)
    record = V32.value_bytes + 4 * V32.num_scales + V32.rope_bytes
    keys = 132 * (3000 - 1)  # the long row is scored; the short one is not
    records = record * (2048 - 1 + 100 - 1)
    outputs = ((2 * 512 + 4) * 16 + 4 * 2048) * 2
    assert bound == keys + records + 2 * 16 * V32.d_qk * 2 + (record + 132) * 2 + outputs


# --------------------------------------------------------------------------- validation and workloads


def _trace(tmp_path, fmt_name: str, inputs: dict | None = None, **axes):
    fmt = FORMATS[fmt_name]
    definition, base = _axes(fmt, b=2, s_q=1, h_q=16, max_pages=4)
    base = {k: base[k] for k in definition.var_axes}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "c", "axes": {**base, **axes}, "inputs": inputs or {}}) + "\n")
    return path, definition


LENS = {"seq_lens": {"type": "explicit", "values": [100, 10]}}
TABLE = {"block_table": {"type": "explicit", "values": [[0, 1, 2, 3], [4, 5, 6, 7]]}}
SHARED_PAGE = {"block_table": {"type": "explicit", "values": [[0, 1, 2, 3], [1, 5, 6, 7]]}}
WRONG_SLOT = {"slot_mapping": {"type": "explicit", "values": [[98], [265]]}}


@pytest.mark.parametrize(("fmt", "axes", "inputs", "message"), [
    ("v32", {"h_q": 48}, None, "axes.h_q = 48 must be one of 16, 32, 64, 128"),
    ("v4", {"s_q": 5}, None, "axes.s_q = 5 must be in [1, 4]"),
    ("v4", {"page_bytes": V4.page_stride(64) + 16}, None, f"must be a multiple of the V4 TMA stride {V4.tma_stride} B"),
    ("v4", {"max_position": 100}, None, "axes.max_position = 100 must cover every position"),
    ("v32", {"num_blocks": 3}, None, "random seq_lens up to 256 may need 8 pages but num_blocks = 3"),
    ("v32", {}, {"seq_lens": {"type": "explicit", "values": [300, 10]}},
     "inputs.seq_lens[0] = 300 is outside [0, max_num_pages x 64 = 256]"),
    ("v32", {}, {**LENS, **SHARED_PAGE}, "inputs.block_table[1] lists a page another row (or itself) already holds"),
    ("v32", {}, {**LENS, **TABLE, **WRONG_SLOT},
     "inputs.slot_mapping[0][0] = 98 must be -1 or the slot of position L - s_q + s = 99 through block_table[0] (99)"),
    ("v32", {}, {**WRONG_SLOT}, "inputs.slot_mapping is given explicitly, so inputs.seq_lens and inputs.block_table must be too"),
    ("v32", {}, {"slot_mapping": {"type": "random", "params": {"skip": 5}}}, "slot_mapping.params.skip = 5 must be in [0, b x s_q = 2]"),
    ("v32", {}, {"attn_sink": {"type": "random", "params": {"value": 1.0, "off": True}}}, "contradict each other"),
    ("v32", {}, {"seq_lens": {"type": "random", "params": {"mode": 3}}}, "seq_lens.params.mode is not a generator parameter"),
    ("v4", {}, {"positions": {"type": "explicit", "values": [[3], [256]]}},
     "inputs.positions[1][0] = 256 is outside [0, max_position = 256)"),
])  # fmt: skip
def test_bad_cases_are_refused_naming_the_case_and_field(tmp_path, fmt, axes, inputs, message):
    path, definition = _trace(tmp_path, fmt, inputs, **axes)
    with pytest.raises(DsaBenchError) as err:
        load_trace(path, definition)
    assert "case 'c'" in str(err.value) and message in str(err.value), str(err.value)


def test_explicit_caches_are_refused():
    definition, axes = _axes(V32, b=1, s_q=1, max_pages=1)
    problems = definition.validate(axes, {"index_cache": INDEXER_KEY_PAGE.empty_cache(axes["num_blocks"], CPU)}, {})
    assert any(p.startswith("inputs.index_cache cannot be given explicitly") for p in problems), problems


def test_shipped_workloads_load_and_cover_the_production_grid():
    for fmt in ("v32", "v4"):
        for kind, h_q in (("h128", 128), ("tp8", 16)):
            workload = load_workload(ROOT / "workloads" / f"decode_step_{fmt}_{kind}.yaml")
            axes = [c.axes for c in workload.cases]
            assert {a["h_q"] for a in axes} == {h_q} and {a["s_q"] for a in axes} == {1, 2}
            assert {a["b"] for a in axes} == {1, 8, 32, 64, 128}
            contexts = {a["max_num_pages"] * 64 for a in axes}
            assert min(contexts) == 8192 and max(contexts) == 131072
            assert workload.settings.warmup >= workload.settings.input_sets
        for kind in ("smoke", "mix"):
            workload = load_workload(ROOT / "workloads" / f"decode_step_{fmt}_{kind}.yaml")
            assert workload.cases
    for topk in (512, 1024):  # V4's other selection sizes: MTP at 128 and 16 heads, and CPU-sized rows around k
        workload = load_workload(ROOT / "workloads" / f"decode_step_v4_topk{topk}.yaml")
        assert workload.definition.name == f"dsa_decode_step_v4_topk{topk}"
        assert {c.axes["h_q"] for c in workload.cases} == {128, 16} and {c.axes["s_q"] for c in workload.cases} == {2}
        assert max(c.axes["max_num_pages"] for c in workload.cases) * 64 == 131072
        smoke = load_workload(ROOT / "workloads" / f"decode_step_v4_topk{topk}_smoke.yaml")
        lengths = {n for c in smoke.cases for n in c.inputs["seq_lens"].values}
        assert {topk - 1, topk, topk + 1, 0} <= lengths, lengths


def _solution_module(folder: str, module: str):
    package = f"dsa_test_step_{folder}"
    if package not in sys.modules:
        pkg = types.ModuleType(package)
        pkg.__path__ = [str(ROOT / "solutions" / folder)]
        sys.modules[package] = pkg
    return importlib.import_module(f"{package}.{module}")


def test_triton_key_insert_is_byte_exact_with_the_reference_writer():
    key_insert = _solution_module("triton", "step.triton_kernels")
    keys = torch.randn(7, 128).to(torch.bfloat16)
    keys[1] = 0.0  # amax 0: the 1e-4 floor
    keys[2] *= 1e-3  # amax below 448e-4: the floor again
    keys[3] *= 300.0  # values at the top of e4m3
    slots = torch.tensor([0, 63, 64, 130, -1, 200, 5])
    got = INDEXER_KEY_PAGE.empty_cache(5, CPU)
    want = got.clone()
    INDEXER_KEY_PAGE.write(want, 64, slots, INDEXER_KEY_PAGE.quantize(keys.float(), "raw"))
    key_insert.insert_keys(keys, slots, got)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("fmt", [V32, V4, INDEXER_KEY_PAGE], ids=["v32", "v4", "indexer"])
def test_production_writes_equal_the_descriptor_writer_without_a_host_sync(fmt):
    kv_writes = _solution_module("production", "kv_writes")
    for slots in ([5, -1, 70, -1], [-1, -1], [0, -1, 3]):
        s = torch.tensor(slots)
        parts = fmt.quantize(torch.randn(len(slots), fmt.input_dims), "raw" if fmt is INDEXER_KEY_PAGE else "source")
        want = torch.randint(0, 255, (3, fmt.page_stride(64)), dtype=torch.uint8)
        got = want.clone()
        fmt.write(want, 64, s, parts)
        kv_writes.write_records(fmt, got, s, parts)
        assert torch.equal(got, want), slots


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", [V32, V4, INDEXER_KEY_PAGE], ids=["v32", "v4", "indexer"])
def test_production_writes_capture_in_a_cuda_graph(fmt):
    # Any host synchronisation inside (a 0-dim tensor index reads its value back) fails the capture.
    kv_writes = _solution_module("production", "kv_writes")
    dev = torch.device("cuda")
    s = torch.tensor([5, -1, 70, -1], device=dev)
    parts = fmt.quantize(torch.randn(4, fmt.input_dims, device=dev), "raw" if fmt is INDEXER_KEY_PAGE else "source")
    want = torch.randint(0, 255, (3, fmt.page_stride(64)), dtype=torch.uint8, device=dev)
    got = want.clone()
    fmt.write(want, 64, s, parts)
    stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(stream):
        kv_writes.write_records(fmt, got.clone(), s, parts)  # eager first, as the harness warms up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            kv_writes.write_records(fmt, got, s, parts)
        graph.replay()
    torch.cuda.synchronize(dev)
    assert torch.equal(got, want)


@pytest.mark.slow  # a harness run (~10 s on two cores)
def test_production_peer_is_skipped_naming_what_is_missing():
    proc = run_cli("run", "-w", "decode_step_v32_smoke", "-c", "smoke_b1*", "-s", "production", "--device", "cpu", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "production: 1 case(s) skipped:" in proc.stdout


@pytest.mark.slow  # a harness run of the reference and the interpreted Triton step (~30 s on two cores)
@pytest.mark.parametrize("fmt", ["v32", "v4", "v4_topk512"])
def test_reference_and_triton_pass_the_smoke_workload_on_cpu(fmt):
    proc = run_cli("run", "-w", f"decode_step_{fmt}_smoke", "-c", "smoke_b[12]_*", "-s", "reference", "-s", "triton", "--device", "cpu",
                   "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reference   2/2" in proc.stdout and "triton      2/2" in proc.stdout, proc.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v4", "v4_topk512", "v4_topk1024"])
def test_triton_and_production_pass_the_cpu_sized_workloads_on_a_gpu(fmt):
    """On the GPU: the Triton step (CUDA top-k, CUDA decode for 64/128 heads) and the production peer (where its
    modules are installed; otherwise SKIPPED) against the reference, smoke and mix cases, timed."""
    for kind, count in (("smoke", 3), ("mix", 3)) if "topk" not in fmt else (("smoke", 3),):
        proc = run_cli("run", "-w", f"decode_step_{fmt}_{kind}", "-s", "reference", "-s", "triton", "-s", "production", "--no-save")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"triton      {count}/{count}" in proc.stdout, proc.stdout
        assert f"production  {count}/{count}" in proc.stdout or "production: " in proc.stdout and "skipped" in proc.stdout, proc.stdout


def test_step_flops_count_decode_entries_and_half_the_scored_keys():
    """bf16 equivalents: 2·h_q·(d_qk + 512)·min(k, L') per query row, plus half of 2·64·128·L' where L' > k."""
    definition = get_definition("dsa_decode_step_v32")
    lens = torch.tensor([3000, 10], dtype=torch.int32)
    flops = definition.useful_flops({"h_q": 16, "s_q": 2}, {"seq_lens": lens})
    decode = 2 * 16 * (V32.d_qk + 512)
    visible = [2999, 3000, 9, 10]
    want = sum(decode * min(2048, v) for v in visible) + sum(2 * 64 * 128 * v // 2 for v in visible if v > 2048)
    assert flops == want
