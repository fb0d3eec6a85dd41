"""examples/flashinfer_dataset: the tiny flashinfer-bench dataset docs/flashinfer_bench.md runs."""

from __future__ import annotations

import json
import types

from conftest import ROOT, cli, load_script
from test_flashinfer_bench import flashinfer_bench

EXAMPLE = ROOT / "examples" / "flashinfer_dataset"
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def make_example_dataset() -> types.ModuleType:
    return load_script("make_example_dataset", "tools")


def test_the_tool_writes_the_shipped_example_byte_for_byte(tmp_path):
    make_example_dataset().write_dataset(tmp_path)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*") if p.is_file())
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (EXAMPLE / rel).read_bytes(), f"{rel} differs: rerun tools/make_example_dataset.py"


def test_run_the_example_dataset_as_the_docs_show(tmp_path):
    save = tmp_path / "example.json"
    proc = cli("run", "--dataset", str(EXAMPLE), "-w", INDEXER, "--dataset-solutions", "all", "-s", "reference", "--save", str(save))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(save.read_text())["records"]
    assert sorted({r["solution"] for r in records}) == [f"calls_reference_{INDEXER}", "reference"]
    assert [r["case"] for r in records if r["solution"] == "reference"] == ["example_short", "example_2048", "example_2049"]
    assert all(r["status"] == "PASSED" for r in records), records


def test_flashinfer_bench_reads_the_example():
    data = flashinfer_bench()
    data.Definition.model_validate_json((EXAMPLE / "definitions" / "dsa_paged" / f"{INDEXER}.json").read_text())
    for line in (EXAMPLE / "workloads" / "dsa_paged" / f"{INDEXER}.jsonl").read_text().splitlines():
        data.Trace.model_validate_json(line)
    for path in (EXAMPLE / "solutions").rglob("*.json"):
        data.Solution.model_validate_json(path.read_text())
