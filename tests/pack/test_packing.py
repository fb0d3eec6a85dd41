"""`dsa-bench pack` / `unpack`: dependency following, the Solution JSON schema, round trips, --verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, cli, relative_copy, run_cli

from dsa_bench.errors import DsaBenchError
from dsa_bench.pack.document import check_solution_document, read_solution_document
from dsa_bench.pack.pack import pack_solution, unpack_solutions

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
ATTENTION = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
MULTI = FIXTURES / "pack" / "multi_file"


def _write(folder: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def test_pack_holds_exactly_the_files_each_entry_needs(tmp_path):
    packed = {p.definition: p for p in pack_solution(MULTI, tmp_path)}
    indexer, attention = packed[INDEXER], packed[ATTENTION]
    assert [s["path"] for s in indexer.document["sources"]] == [
        "indexer_kernel.py",  # the entry file comes first
        "common/__init__.py",
        "common/constants.py",
        "csrc/topk.cu",
        "csrc/topk_common.cuh",
        "cuda_loader.py",
        "helpers/__init__.py",
        "helpers/select.py",
    ]
    assert indexer.reasons["csrc/topk.cu"].startswith("named in cuda_loader.py")
    assert indexer.reasons["csrc/topk_common.cuh"] == "#include in csrc/topk.cu"
    assert indexer.reasons["helpers/__init__.py"] == "package of helpers/select.py"
    assert {"unused.py", "csrc/unused.cu", "attn/entry.py"} <= set(indexer.left_out)
    assert indexer.external_modules == ["dsa_bench", "torch"]  # stdlib modules are not listed
    assert indexer.empty_files == ["common/__init__.py"]
    # a namespace package (attn/ has no __init__.py), a relative and a dotted absolute import
    assert sorted(s["path"] for s in attention.document["sources"]) == [
        "attn/entry.py", "attn/softmax.py", "common/__init__.py", "common/constants.py",
    ]  # fmt: skip

    doc = json.loads((tmp_path / f"multi_file_{INDEXER}.json").read_text())
    assert doc == indexer.document
    assert set(doc) == {"name", "definition", "author", "description", "spec", "sources"}
    assert doc["spec"] == {
        "language": "python",
        "target_hardware": ["cpu", "cuda"],
        "entry_point": "indexer_kernel.py::kernel",
        "dependencies": ["torch"],
        "destination_passing_style": True,
    }
    assert attention.document["spec"]["destination_passing_style"] is False
    for source in doc["sources"]:
        original = (MULTI / source["path"]).read_text()
        assert source["content"] == (original or "\n")


def test_the_shipped_solution_packs_without_dsa_bench(tmp_path):
    """Every packed entry of solutions/triton runs where dsa-bench is not installed: no packed
    module imports it, and no entry declares it (the record descriptors are vendored)."""
    for item in pack_solution(ROOT / "solutions" / "triton", tmp_path):
        assert "dsa_bench" not in item.external_modules, (item.definition, item.external_modules)
        assert "dsa-bench" not in item.document["spec"]["dependencies"], item.definition
        paths = [s["path"] for s in item.document["sources"]]
        if item.definition.startswith(("dsa_kv_insert", "dsa_mla_decode", "dsa_decode_step")):
            assert "common/kv_records.py" in paths, (item.definition, paths)


def test_cuda_entry_follows_includes_and_records_torch_binding(tmp_path):
    folder = _write(
        tmp_path / "cuda_solution",
        {
            "solution.yaml": (
                "name: cu\nauthor: me\ntarget_hardware: [cuda]\nentries:\n"
                f"  {INDEXER}:\n    entry_point: src/topk.cu::topk\n    language: cuda\n    sources: [src/extra.cpp]\n"
            ),
            "src/topk.cu": '#include "common.cuh"\n#include <torch/extension.h>\nint topk() { return kValue; }\n',
            "src/common.cuh": '#pragma once\n#include "include/deep.h"\nconstexpr int kValue = 1;\n',
            "include/deep.h": "// reached through an include path (-I): found by its path suffix\n",
            "src/extra.cpp": '#include "common.cuh"\n',
            "src/stray.cuh": "// not included\n",
        },
    )
    (item,) = pack_solution(folder, tmp_path / "out")
    assert item.document["spec"]["binding"] == "torch"
    assert sorted(s["path"] for s in item.document["sources"]) == ["include/deep.h", "src/common.cuh", "src/extra.cpp", "src/topk.cu"]
    restored = unpack_solutions([item.path], tmp_path / "restored")
    manifest = (restored / "solution.yaml").read_text()
    assert "src/extra.cpp" in manifest and "common.cuh" not in manifest  # headers are not compiled on their own


def test_unpack_restores_the_folder_and_rejects_bad_documents(tmp_path):
    packed = pack_solution(MULTI, tmp_path / "out")
    restored = unpack_solutions([p.path for p in packed], tmp_path / "restored")
    for item in packed:
        for source in item.document["sources"]:
            assert (restored / source["path"]).read_text() == source["content"]
    assert not (restored / "unused.py").exists()
    repacked = pack_solution(restored, tmp_path / "again")  # the round trip is stable
    assert [p.document for p in repacked] == [p.document for p in packed]

    with pytest.raises(DsaBenchError, match="not empty"):
        unpack_solutions([packed[0].path], restored)
    doc = json.loads(packed[0].path.read_text())
    bad_cases = [
        ({"sources": doc["sources"][1:]}, "entry file 'indexer_kernel.py'"),
        ({"sources": doc["sources"] + [{"path": "../escape.py", "content": "x = 1\n"}]}, "no '..'"),
        ({"sources": doc["sources"] + [doc["sources"][1]]}, "duplicate path"),
        ({"sources": [{**doc["sources"][0], "content": "def broken(:\n"}]}, "not valid Python"),
        ({"author": ""}, "'author' must be a non-empty string"),
        ({"spec": {**doc["spec"], "target_hardware": []}}, "target_hardware"),
        ({"spec": {**doc["spec"], "entry_point": "indexer_kernel.py"}}, "file::function"),
    ]
    for change, message in bad_cases:
        with pytest.raises(DsaBenchError, match=message):
            check_solution_document({**doc, **change}, "x.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(DsaBenchError, match="invalid JSON"):
        read_solution_document(broken)


def test_bad_solution_folders_give_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DsaBenchError, match="no solution.yaml"):
        pack_solution(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(DsaBenchError, match="lies outside the solution folder"):
        pack_solution(FIXTURES / "pack" / "outside", tmp_path / "out")
    missing = _write(
        tmp_path / "missing",
        {
            "solution.yaml": f"name: m\nauthor: me\ntarget_hardware: [cuda]\n"
            f"entries:\n  {INDEXER}:\n    entry_point: nope.py::kernel\n    language: python\n"
        },
    )
    with pytest.raises(DsaBenchError, match="file 'nope.py' does not exist"):
        pack_solution(missing, tmp_path / "out")
    include_outside = _write(
        tmp_path / "inc" / "sol",
        {
            "solution.yaml": f"name: i\nauthor: me\ntarget_hardware: [cuda]\nentries:\n  {INDEXER}:\n    entry_point: k.cu::f\n"
            "    language: cuda\n",
            "k.cu": '#include "../shared.cuh"\n',
            "../shared.cuh": "// outside the solution folder\n",
        },
    )
    with pytest.raises(DsaBenchError, match="lies outside the solution folder"):
        pack_solution(include_outside, tmp_path / "out")
    bad_relative = _write(
        tmp_path / "rel",
        {
            "solution.yaml": f"name: r\nauthor: me\ntarget_hardware: [cuda]\nentries:\n  {INDEXER}:\n    entry_point: k.py::f\n"
            "    language: python\n",
            "k.py": "from .missing_module import f\n",
        },
    )
    with pytest.raises(DsaBenchError, match=r"k.py:1: relative import .missing_module names no module"):
        pack_solution(bad_relative, tmp_path / "out")
    no_hardware = _write(
        tmp_path / "nohw",
        {"solution.yaml": f"name: n\nauthor: me\nentries:\n  {INDEXER}:\n    entry_point: k.py::f\n    language: python\n", "k.py": ""},
    )
    with pytest.raises(DsaBenchError, match="target_hardware"):
        pack_solution(no_hardware, tmp_path / "out")
    proc = cli("pack", str(FIXTURES / "pack" / "outside"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "lies outside the solution folder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # over 10 s on 2 CPU cores: make test-all (make test stays under 5 min)
def test_pack_verify_unpack_run_round_trip(tmp_path):
    out = tmp_path / "packed"
    proc = cli("pack", str(MULTI), "--out", str(out), "--verify", "--device", "cpu")
    # absolute sibling imports: dsa-bench's folder loader resolves them, flashinfer-bench's does not
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "indexer_kernel.py:4: `from common import constants` imports the packed module 'common'" in proc.stderr
    assert "attn/entry.py:3: `from common.constants import PAGE_SIZE`" in proc.stderr
    assert "make it relative: `from ..common.constants import PAGE_SIZE`" in proc.stderr

    folder = relative_copy(tmp_path / "multi_file")
    proc = run_cli("pack", str(folder), "--out", str(out), "--verify", "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left out (not needed by this entry): attn/entry.py, attn/softmax.py, csrc/unused.cu, unused.py" in proc.stdout
    assert "warning" not in proc.stderr
    assert f"verified multi_file_{INDEXER}.json on indexer_smoke: every case passed" in proc.stdout
    assert f"verified multi_file_{ATTENTION}.json on sparse_attention_smoke: every case passed" in proc.stdout
    progress = [line for line in proc.stdout.splitlines() if " verifying " in line]  # a line before each run
    assert [line.split(" (")[0] for line in progress] == [
        f"[1/2] verifying multi_file_{INDEXER}.json on indexer_smoke",
        f"[2/2] verifying multi_file_{ATTENTION}.json on sparse_attention_smoke",
    ], proc.stdout

    folder = tmp_path / "restored"
    proc = cli("unpack", str(out / f"multi_file_{INDEXER}.json"), str(out / f"multi_file_{ATTENTION}.json"), str(folder))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("run", "-w", "indexer_smoke", "-s", str(folder), "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "multi_file" in proc.stdout and "4/4" in proc.stdout


@pytest.mark.slow  # over 10 s on 2 CPU cores: make test-all (make test stays under 5 min)
def test_verify_fails_when_the_packed_solution_misses_a_file(tmp_path):
    folder = shutil.copytree(FIXTURES / "pack" / "dynamic_import", tmp_path / "dynamic_import")
    proc = run_cli("pack", str(folder), "--out", str(tmp_path / "out"), "--verify", "--device", "cpu")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "verification FAILED" in proc.stderr and "COMPILE_ERROR" in proc.stderr and "hidden_helper" in proc.stderr
    # the escape hatch: list what imports cannot show in the manifest's sources
    manifest = folder / "solution.yaml"
    manifest.write_text(manifest.read_text() + "    sources: [hidden_helper.py]\n")
    (item,) = pack_solution(folder, tmp_path / "out2")
    assert item.reasons["hidden_helper.py"] == "listed in solution.yaml"
    proc = run_cli("pack", str(folder), "--out", str(tmp_path / "out2"), "--verify", "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_solution_document_model_messages():
    doc = {
        "name": "n",
        "definition": INDEXER,
        "author": "me",
        "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "k.py::run"},
        "sources": [{"path": "k.py", "content": "def run():\n    pass\n"}],
        "schema_version": 2,  # the ecosystem's models ignore fields they do not know; so does dsa-bench
    }
    check_solution_document(doc, "x.json")

    def refused(change: dict) -> str:
        with pytest.raises(DsaBenchError) as info:
            check_solution_document({**doc, **change}, "x.json")
        return str(info.value).removeprefix("x.json: ")

    languages = "'python', 'triton', 'cpp', 'cuda' or 'tilelang'"
    assert refused({"spec": {**doc["spec"], "language": "rust"}}).startswith(f"spec.language: expected one of {languages}")
    assert (
        refused({"spec": {**doc["spec"], "entry_point": "k.cu::run"}}) == "spec.entry_point: a python entry must be a .py file, got 'k.cu'"
    )
    assert refused({"spec": {**doc["spec"], "dependencies": [""]}}) == "spec.dependencies[0]: expected a non-empty string, got ''"
    assert (
        refused({"sources": [*doc["sources"], {"path": "x\udc80.h", "content": "x"}]})
        == "sources[1].path 'x\\udc80.h': expected valid Unicode text (it holds a lone surrogate)"
    )
    assert (
        refused({"sources": [*doc["sources"], {"path": "x.h", "content": ""}]}) == "sources[1].content: expected a non-empty string, got ''"
    )
    assert refused({"definition": None}) == "field 'definition' must be a non-empty string, got None"
