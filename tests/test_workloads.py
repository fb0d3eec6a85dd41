"""Workload and trace loading: the shipped traces follow the published mix; bad files get clear errors.

Generated inputs are a pure function of the seed: the same bytes in every process, whatever
its thread count, also when rows share cache pages; and recorded seeds keep their inputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, load_script
from safetensors.torch import save_file

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.checks import judge
from dsa_bench.errors import DsaBenchError
from dsa_bench.project import resolve_solution, resolve_workload
from dsa_bench.workloads import build_inputs, derive_seed, load_trace, load_workload

INDEXER = get_definition(idx.NAME)
ATTENTION = get_definition("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64")


def test_indexer_trace_follows_the_contest_mix():
    wl = load_workload(ROOT / "workloads" / "indexer_h64.yaml")
    assert len(wl.cases) == 128
    bands = {(1, 32): 0, (33, 36): 0, (37, 45): 0, (82, 91): 0}
    longest = 0
    for case in wl.cases:
        assert case.axes["num_pages"] == 11923
        assert 1 <= case.axes["batch_size"] <= 31
        m = case.axes["max_num_pages"]
        band = next(b for b in bands if b[0] <= m <= b[1])
        bands[band] += 1
        lens = case.inputs["seq_lens"].values
        assert case.inputs["seq_lens"].kind == "explicit" and len(lens) == case.axes["batch_size"]
        assert max(lens) <= m * 64
        longest = max(longest, max(lens))
    assert bands == {(1, 32): 69, (33, 36): 18, (37, 45): 21, (82, 91): 20}
    assert longest == 5824


def test_attention_trace_follows_the_contest_mix():
    wl = load_workload(ROOT / "workloads" / "sparse_attention_h16.yaml")
    assert len(wl.cases) == 23
    tokens = {c.axes["num_tokens"] for c in wl.cases}
    assert tokens == {1, 2, 6, 7, 8}
    counts = [n for c in wl.cases for n in c.inputs["sparse_indices"].params["valid_counts"]]
    assert min(counts) >= 1 and max(counts) == 2048
    assert sum(n < 300 for n in counts) >= 10, "many rows are mostly padding"
    assert all(c.axes["num_pages"] == 8462 for c in wl.cases)


def test_inputs_are_deterministic_and_cache_is_nan_outside_reachable_tokens(cpu):
    wl = load_workload(ROOT / "workloads" / "indexer_smoke.yaml")
    case = wl.cases[1]  # seq_lens 0, 2048, 2049
    a = build_inputs(INDEXER, case, 5, cpu)
    b = build_inputs(INDEXER, case, 5, cpu)
    assert torch.equal(a["q_index_fp8"].view(torch.uint8), b["q_index_fp8"].view(torch.uint8))
    assert torch.equal(a["k_index_cache_fp8"], b["k_index_cache_fp8"])
    assert torch.equal(a["block_table"], b["block_table"])
    scales = idx.INDEXER_KEY_PAGE.scales(a["k_index_cache_fp8"])
    reachable = torch.zeros_like(scales, dtype=torch.bool)
    for row, n in enumerate(a["seq_lens"].tolist()):
        ids = idx.token_ids(a["block_table"][row], n)
        reachable[ids // 64, ids % 64] = True
    assert torch.isfinite(scales[reachable]).all()
    assert torch.isnan(scales[~reachable]).all(), "unreachable tokens must read as NaN"
    # Pages are never shared between rows.
    pages = [set(a["block_table"][r, : -(-n // 64)].tolist()) for r, n in enumerate(a["seq_lens"].tolist())]
    assert not (pages[1] & pages[2])


def write_trace(tmp_path: Path, lines: list[str], definition: str = idx.NAME) -> Path:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    wl = tmp_path / "w.yaml"
    wl.write_text(f"name: t\ndefinition: {definition}\ntrace: t.jsonl\n")
    return wl


def indexer_line(**overrides) -> str:
    case = {
        "id": "c",
        "axes": {"batch_size": 2, "max_num_pages": 3, "num_pages": 16},
        "inputs": {"seq_lens": {"type": "explicit", "values": [10, 150]}},
    }
    case.update(overrides)
    return json.dumps(case)


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(DsaBenchError) as info:
        load_workload(path)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_malformed_json_reports_file_and_line(tmp_path):
    path = write_trace(tmp_path, [indexer_line(), "{not json"])
    expect_error(path, "t.jsonl:2", "invalid JSON")


def test_seq_len_beyond_block_table_capacity(tmp_path):
    line = indexer_line(inputs={"seq_lens": {"type": "explicit", "values": [10, 193]}})
    expect_error(write_trace(tmp_path, [line]), "t.jsonl:1", "seq_lens[1] = 193", "max_num_pages*64 = 192")


def test_page_id_beyond_num_pages(tmp_path):
    line = indexer_line(
        inputs={
            "seq_lens": {"type": "explicit", "values": [10, 70]},
            "block_table": {"type": "explicit", "values": [[1, 2, 3], [4, 16, 5]]},
        }
    )
    expect_error(write_trace(tmp_path, [line]), "block_table[1][1] = 16", "num_pages = 16")


def test_explicit_shape_mismatch(tmp_path):
    line = indexer_line(inputs={"seq_lens": {"type": "explicit", "values": [10, 20, 30]}})
    expect_error(write_trace(tmp_path, [line]), "inputs.seq_lens has shape (3,), expected (2,)")


def test_unknown_input_and_axis(tmp_path):
    expect_error(write_trace(tmp_path, [indexer_line(inputs={"queries": {"type": "random"}})]), "inputs.queries: not an input")
    expect_error(write_trace(tmp_path, [indexer_line(axes={"batch_size": 2, "max_num_pages": 3})]), "axes is missing num_pages")
    expect_error(
        write_trace(tmp_path, [indexer_line(axes={"batch_size": 2, "max_num_pages": 3, "num_pages": 16, "topk": 1024})]), "axes.topk = 1024"
    )


def test_token_count_mismatch(tmp_path):
    line = json.dumps(
        {
            "id": "a",
            "axes": {"num_tokens": 3, "num_pages": 64},
            "inputs": {"sparse_indices": {"type": "random", "params": {"valid_counts": [5, 6]}}},
        }
    )
    expect_error(write_trace(tmp_path, [line], ATTENTION.name), "valid_counts has 2 entries, expected num_tokens = 3")


def test_duplicate_case_ids(tmp_path):
    expect_error(write_trace(tmp_path, [indexer_line(), indexer_line()]), "t.jsonl:2", "already used at")


def test_safetensors_and_scalar_inputs(tmp_path, cpu):
    indices = torch.full((2, 2048), -1, dtype=torch.int32)
    indices[0, :3] = torch.tensor([0, 65, 130])
    save_file({"idx": indices}, str(tmp_path / "blob.safetensors"))
    line = json.dumps(
        {
            "id": "blob",
            "axes": {"num_tokens": 2, "num_pages": 4},
            "inputs": {
                "sparse_indices": {"type": "safetensors", "path": "blob.safetensors", "tensor_key": "idx"},
                "sm_scale": {"type": "scalar", "value": 0.5},
            },
        }
    )
    wl = load_workload(write_trace(tmp_path, [line], ATTENTION.name))
    inputs = build_inputs(ATTENTION, wl.cases[0], 1, cpu)
    assert torch.equal(inputs["sparse_indices"], indices) and inputs["sm_scale"] == 0.5
    expected = ATTENTION.reference(**inputs)
    assert torch.isneginf(expected["lse"][1]).all() and torch.isfinite(expected["lse"][0]).all()


def test_missing_safetensors_file(tmp_path):
    line = json.dumps(
        {
            "id": "x",
            "axes": {"num_tokens": 1, "num_pages": 4},
            "inputs": {"sparse_indices": {"type": "safetensors", "path": "nope.safetensors", "tensor_key": "k"}},
        }
    )
    expect_error(write_trace(tmp_path, [line], ATTENTION.name), "nope.safetensors does not exist")


def test_malformed_yaml_and_unknown_names(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndefinition: [unclosed\n")
    expect_error(bad, "bad.yaml:", "malformed YAML")
    unknown = tmp_path / "u.yaml"
    unknown.write_text("name: u\ndefinition: no_such_definition\ntrace: t.jsonl\n")
    expect_error(unknown, "unknown definition 'no_such_definition'")
    with pytest.raises(DsaBenchError, match="unknown workload 'nope'"):
        resolve_workload("nope", ROOT)
    with pytest.raises(DsaBenchError, match="unknown solution 'nope'"):
        resolve_solution("nope", ROOT)


def test_manifest_without_entry_point():
    with pytest.raises(DsaBenchError, match="entry_point must look like 'file.py::function'"):
        resolve_solution(str(FIXTURES / "solutions" / "no_entry_point"), ROOT)


def test_trace_must_not_be_empty(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n")
    with pytest.raises(DsaBenchError, match="no cases"):
        load_trace(tmp_path / "t.jsonl", INDEXER)


def test_settings_model_has_every_run_setting_and_tolerance_with_their_defaults():
    from dsa_bench.workloads import COUNT_BOUNDS, TOLERANCES, RunSettings, SettingsModel, parse_settings

    assert list(SettingsModel.model_fields) == [*COUNT_BOUNDS, *TOLERANCES, "reference_protocol", "secret"]
    assert SettingsModel().run_settings() == RunSettings() == parse_settings(None, "w.yaml")


@pytest.mark.parametrize(
    "inputs,expected",
    [
        # a misspelt field used to be ignored, so the input silently became random with default parameters
        ({"seq_lens": {"type": "random", "parms": {"max": 5}}}, "t.jsonl:1: inputs.seq_lens.parms: unknown field"),
        ({"seq_lens": {"type": "explicit"}}, "t.jsonl:1: inputs.seq_lens.values: missing (a required field)"),
        ({"seq_lens": {"type": "random", "params": [1]}}, "t.jsonl:1: inputs.seq_lens.params: expected an object, got a list of 1"),
        (
            {"seq_lens": {"type": ["random"]}},
            "t.jsonl:1: inputs.seq_lens must be an object with 'type' one of random, explicit, scalar, safetensors",
        ),
        (
            {"seq_lens": {"type": "safetensors", "path": "x.safetensors"}},
            "t.jsonl:1: inputs.seq_lens.tensor_key: missing (a required field)",
        ),
    ],
)
def test_trace_line_model_names_the_field_without_the_source_type(tmp_path, inputs, expected):
    expect_error(write_trace(tmp_path, [indexer_line(inputs=inputs)]), expected)


def test_trace_line_and_workload_file_models_refuse_unknown_and_mistyped_fields(tmp_path):
    expect_error(write_trace(tmp_path, [indexer_line(comment="x")]), "t.jsonl:1: comment: unknown field")
    expect_error(write_trace(tmp_path, [indexer_line(id="")]), "t.jsonl:1: id: expected a non-empty string, got ''")
    expect_error(
        write_trace(tmp_path, [indexer_line(axes={"batch_size": True, "max_num_pages": 3, "num_pages": 16})]),
        "axes.batch_size: expected an integer, got True",
    )
    assert load_workload(write_trace(tmp_path, [indexer_line(note="why this case")])).cases[0].id == "c"
    path = write_trace(tmp_path, [indexer_line()])
    path.write_text(path.read_text() + "setting:\n  seed: 3\n")
    expect_error(path, f"{path}: setting: unknown field")
    path.write_text(f"name: t\ndefinition: {idx.NAME}\n")
    expect_error(path, f"{path}: trace: missing (a required field)")


def test_manifest_model_messages(tmp_path):
    from dsa_bench.solution import load_solution

    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "k.py").write_text("def kernel(*args):\n    return None\n")

    def refused(manifest: str) -> str:
        (folder / "solution.yaml").write_text(manifest)
        with pytest.raises(DsaBenchError) as info:
            load_solution(folder)
        return str(info.value).removeprefix(f"{folder / 'solution.yaml'}: ")

    entry = f"entries:\n  {idx.NAME}:\n"
    manifest = f"name: s\nauthors: me\n{entry}    entry_point: k.py::kernel\n    language: python\n"
    assert refused(manifest) == "authors: unknown field (did you mean 'author'?)"
    assert (
        refused(f"{entry}    entry_point: k.py::kernel\n    language: cuda\n")
        == f"entries.{idx.NAME}.entry_point: a cuda entry must be a .cu or .cpp file, got 'k.py'"
    )
    assert (
        refused(f"{entry}    entry_point: k.py::run-it\n    language: python\n")
        == f"entries.{idx.NAME}.entry_point: 'run-it' is not a function name"
    )
    assert (
        refused(f"{entry}    entry_point: k.py::kernel\n    language: rust\n")
        == f"entries.{idx.NAME}.language: expected one of 'python', 'triton' or 'cuda', got 'rust'"
    )
    assert refused("entries: {}\n") == "entries: expected at least 1 item(s), got an object"


def test_every_shipped_trace_is_what_make_traces_writes(tmp_path):
    """tools/make_traces.py rewrites every trace of traces/ byte for byte, and writes no other."""
    load_script("make_traces", "tools").main(out=tmp_path)
    written = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert written == sorted(p.name for p in (ROOT / "traces").glob("*.jsonl"))
    for name in written:
        assert (tmp_path / name).read_bytes() == (ROOT / "traces" / name).read_bytes(), f"rerun tools/make_traces.py ({name})"


# --------------------------------------------------------------------------- generated inputs


CPU = torch.device("cpu")

#: sha256 of every smoke case's inputs (spec order, raw bytes; the runner's first check seed),
#: computed on main before the first-occurrence rule of indexer._fill_keys (no smoke case
#: shares a page, so its bytes must not change).
SMOKE_INPUT_SHA256 = {
    ("indexer_smoke", "smoke_passthrough"): "c1bca8a97ee87758505b100ae7f3ba66113d0be8a569de970d508eeabbe6eed5",
    ("indexer_smoke", "smoke_boundary"): "c64a3b69f05fb5192a56ee8bbdf06daffaaef1022392ed65ae31732d95371d48",
    ("indexer_smoke", "smoke_scored"): "b5badb83869f183778a51e43ddd1e746454c16b6cc06f1040023a7fe5758e99a",
    ("indexer_smoke", "smoke_edges"): "3795222e44babcd8f2c7cba668984e371555191abdbd58a8812e75cf9ab4c0c3",
    ("sparse_attention_smoke", "smoke_t1_full"): "522640204551347c48be3329c4656992977be9e11ae74936e7cccd97b6d79c45",
    ("sparse_attention_smoke", "smoke_t3_empty_small"): "a884b7448a193efaadfd0d499a8494a5088cf0cf3efadd2aba7be9cd79f2d857",
    ("sparse_attention_smoke", "smoke_t2_scattered"): "91aa718eae1d84e92c0d878e224434dc545bb58d6b1a1a04125a3b70f3399511",
}


def inputs_sha256(definition, inputs: dict) -> str:
    digest = hashlib.sha256()
    for spec in definition.inputs:
        value = inputs[spec.name]
        digest.update(repr(float(value)).encode() if spec.is_scalar else value.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("workload_name", ["indexer_smoke", "sparse_attention_smoke"])
def test_smoke_inputs_are_the_recorded_bytes(workload_name):
    workload = load_workload(ROOT / "workloads" / f"{workload_name}.yaml")
    for case in workload.cases:
        inputs = build_inputs(workload.definition, case, derive_seed(workload.settings.seed, case.id, "check", 0), CPU)
        assert inputs_sha256(workload.definition, inputs) == SMOKE_INPUT_SHA256[(workload_name, case.id)], case.id


def shared_page_inputs(seed: int, threads: int) -> tuple[dict, dict]:
    """Two long rows whose first 40 pages are the same physical pages (prefix caching), built
    with ``threads`` CPU threads."""
    pages = list(range(5, 85))
    table = torch.tensor([pages, pages[:40] + list(range(100, 140))], dtype=torch.int32)
    axes = idx.DEFINITION.axes({"batch_size": 2, "max_num_pages": 80, "num_pages": 200})
    given = {"seq_lens": torch.tensor([5100, 5000], dtype=torch.int32), "block_table": table}
    assert idx.validate(axes, given, {}) == [], "sharing pages across rows is a legal trace"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return axes, idx.generate(axes, given, {}, InputRng(seed, CPU))
    finally:
        torch.set_num_threads(before)


def test_shared_pages_build_the_same_cache_every_time_and_the_reference_passes():
    axes, first = shared_page_inputs(3, threads=2)
    for threads in (2, 1, 2):
        _, again = shared_page_inputs(3, threads)
        assert torch.equal(again["k_index_cache_fp8"], first["k_index_cache_fp8"]), f"cache differs with {threads} threads"
        assert inputs_sha256(idx.DEFINITION, again) == inputs_sha256(idx.DEFINITION, first)
    # Every token either row reads has a finite key and scale, the shared ones included.
    scales = idx.INDEXER_KEY_PAGE.scales(first["k_index_cache_fp8"])
    for b, n in enumerate(first["seq_lens"].tolist()):
        ids = idx.token_ids(first["block_table"][b], n)
        assert torch.isfinite(scales[ids // 64, ids % 64]).all()
    expected = idx.expect(first)
    result = judge(idx.DEFINITION, axes, first, idx.reference(**first), expected, Tolerance(), CPU)
    assert result.passed, result.message


def test_shared_token_keeps_its_first_rows_key():
    # The same seed without the second row draws row 0's keys first, so the shared tokens must
    # hold exactly those bytes: the first occurrence wins.
    _, shared = shared_page_inputs(3, threads=2)
    axes = idx.DEFINITION.axes({"batch_size": 2, "max_num_pages": 80, "num_pages": 240})
    table = shared["block_table"].clone()
    table[1] = torch.arange(140, 220, dtype=torch.int32)  # row 1 now on pages of its own
    alone = idx.generate(axes, {"seq_lens": shared["seq_lens"], "block_table": table}, {}, InputRng(3, CPU))
    raw_shared = idx.INDEXER_KEY_PAGE.raw_pages(shared["k_index_cache_fp8"])
    raw_alone = idx.INDEXER_KEY_PAGE.raw_pages(alone["k_index_cache_fp8"])
    assert torch.equal(raw_shared[5:85], raw_alone[5:85]), "row 0's pages hold row 0's draws"


def test_attention_tokens_sharing_slots_build_the_same_caches():
    axes = attn.DEFINITION.axes({"num_tokens": 2, "num_pages": 8})
    indices = torch.full((2, attn.TOPK), -1, dtype=torch.int32)
    indices[0, :100] = torch.arange(100)
    indices[1, :100] = torch.arange(50, 150)  # 50 slots in both rows
    builds = []
    for threads in (1, 2):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            builds.append(attn.generate(axes, {"sparse_indices": indices}, {}, InputRng(4, CPU)))
        finally:
            torch.set_num_threads(before)
    for name in ("ckv_cache", "kpe_cache"):
        assert torch.equal(builds[0][name].view(torch.uint8), builds[1][name].view(torch.uint8)), name
