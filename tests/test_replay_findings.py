"""The replay of hostile and careless inputs (issue 47): each finding refused with one clear line
and exit 2, or recorded honestly, instead of a traceback, a hang, lost data or a wrong exit code."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, cli
from synthetic_results import write_results

from dsa_bench.definitions.status import Status
from dsa_bench.results.records import CaseRecord, ResultsFile, ResultsHeader


def _one_line_refusal(proc, fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr


@pytest.mark.parametrize("count", ["100000", "1" + "0" * 30])
def test_a_device_count_beyond_the_machine_is_refused_at_once(count):
    _one_line_refusal(cli("run", "-w", "indexer_smoke", "--gpus", count, "--no-save"), "--gpus")


def test_a_ray_address_where_nothing_listens_is_refused_within_the_connect_timeout():
    proc = cli("run", "-w", "indexer_smoke", "--executor", "ray", "--ray-address", "127.0.0.1:1", "--no-save")
    _one_line_refusal(proc, "--ray-address 127.0.0.1:1: no Ray cluster answers there within 10 s")


def test_save_and_no_save_together_are_refused(tmp_path):
    proc = cli("run", "-w", "indexer_smoke", "--save", str(tmp_path / "r.json"), "--no-save")
    _one_line_refusal(proc, "contradict each other")


def test_a_workload_folder_and_an_unknown_definition_are_named(tmp_path):
    _one_line_refusal(cli("run", "-w", str(tmp_path), "--no-save"), "is a folder")
    workload = tmp_path / "mine.yaml"
    workload.write_text("definition: dsa_topk_indexer_h64\ntrace: t.jsonl\n")
    proc = cli("run", "-w", str(workload), "--no-save")
    _one_line_refusal(proc, f"{workload}: field 'definition': unknown definition 'dsa_topk_indexer_h64' (closest: ")
    assert "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64" in proc.stderr and len(proc.stderr) < 400, proc.stderr


@pytest.mark.parametrize("args", [["--layers", "1000000000"], ["--indexer-alignment", "0"], ["--indexer-alignment", "-16"],
                                  ["--indexer-alignment", "3"], ["--block-size", "0"]])  # fmt: skip
def test_layout_ranges_are_checked(args):
    _one_line_refusal(cli("layout", "--with-indexer", *args), args[0])


def test_layout_accepts_the_formats_own_alignments():
    from dsa_bench.definitions.kv_records import V4  # its alignment is no power of two

    assert cli("layout", "V41", "--with-indexer", "--indexer-alignment", str(V4.page_alignment), "--layers", "5").returncode == 0


def test_compare_of_a_file_without_records_is_refused(tmp_path):
    full = write_results(tmp_path / "full.json", "indexer_h64", {"c0": {"reference": 1.0, "triton": 0.5}})
    header = {k: v for k, v in json.loads(full.read_text()).items() if k not in ("records", "complete", "finished", "created", "format")}
    empty = tmp_path / "interrupted.json"
    ResultsFile(empty, ResultsHeader.model_validate(header)).update(complete=False)
    proc = cli("compare", str(empty), "--baseline", str(ROOT / "baselines" / "h200.json"))
    _one_line_refusal(proc, "holds no records (an interrupted run): nothing to compare")


def test_merge_of_an_interrupted_part_is_incomplete_and_no_baseline(tmp_path):
    part = write_results(tmp_path / "part.json", "indexer_h64", {"c0": {"reference": 1.0, "triton": 0.5}, "c1": {"reference": 1.0}})
    doc = json.loads(part.read_text())
    doc.update(complete=False, cases=["c0", "c1"])  # stopped before triton ran c1
    part.write_text(json.dumps(doc))
    merged = tmp_path / "merged.json"
    assert cli("results", "merge", str(part), "-o", str(merged)).returncode == 0
    assert json.loads(merged.read_text())["complete"] is False
    proc = cli("baseline", "update", str(merged), "--baseline", str(tmp_path / "baseline.json"))
    _one_line_refusal(proc, "incomplete")
    assert not (tmp_path / "baseline.json").exists()


def test_resume_of_a_file_with_a_case_the_workload_lacks_is_refused(tmp_path):
    from dsa_bench.run.plan import plan_run
    from dsa_bench.run.request import RunRequest

    save = tmp_path / "run.json"
    plan = plan_run(RunRequest(workload="indexer_smoke", solutions=["reference"], cases=["smoke_scored"], device="cpu", save=save), ROOT)
    ghost = CaseRecord(case="ghost_case", solution="reference", axes={"batch_size": 1}, status=Status.PASSED)
    ResultsFile(save, plan.header(), [ghost]).update(complete=False)
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-c", "smoke_scored", "--device", "cpu", "--resume", str(save))
    _one_line_refusal(proc, "records[0] holds case 'ghost_case', which this run does not have")


def test_export_never_overwrites_a_dataset_workload_file(tmp_path):
    from test_dataset_isolation import _dataset

    from dsa_bench.dataset import load_dataset_workload

    root = _dataset(tmp_path / "dataset", "def run(hidden_states, weight, eps):\n    return hidden_states\n")
    lines = root / "workloads" / "rmsnorm_h64.jsonl"
    rows = [{**json.loads(line), "evaluation": None} for line in lines.read_text().splitlines()]  # as the ecosystem writes them
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = lines.read_bytes()
    workload = load_dataset_workload(root, "rmsnorm_h64")
    full = write_results(tmp_path / "shape.json", "x", {"r0": {"reference": 1.0}}, timed=False)
    header = {k: v for k, v in json.loads(full.read_text()).items() if k not in ("records", "complete", "finished", "created", "format")}
    header["workload"] = {"name": "rmsnorm_h64", "path": str(lines), "trace": str(lines), "definition": workload.definition.name,
                          "dataset": str(root)}  # fmt: skip
    header["solutions"] = {"reference": {"path": "solutions/reference", "content_hash": "aa"}}
    results = tmp_path / "results.json"
    record = CaseRecord(case="r0", solution="reference", axes={"batch_size": 2}, status=Status.PASSED)
    ResultsFile(results, ResultsHeader.model_validate(header), [record]).update(complete=True)
    proc = cli("export", str(results), "-o", str(lines))
    _one_line_refusal(proc, "--output")
    assert lines.read_bytes() == before
    assert cli("export", str(results), "-o", str(tmp_path / "traces.jsonl")).returncode == 0  # the same export elsewhere is fine
