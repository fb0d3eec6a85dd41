"""Workload and trace loading: the shipped traces follow the published mix; bad files get clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, load_script
from safetensors.torch import save_file

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import indexer as idx
from dsa_bench.errors import DsaBenchError
from dsa_bench.project import resolve_solution, resolve_workload
from dsa_bench.workloads import build_inputs, load_trace, load_workload

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
