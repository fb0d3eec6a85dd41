"""`dsa-bench run`, `list` and `validate` end to end, as a user runs them."""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES, ROOT, cli, run_cli

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def test_run_smoke_workloads_with_reference(tmp_path):
    for workload, n_cases in (("indexer_smoke", 4), ("sparse_attention_smoke", 3)):
        save = tmp_path / f"{workload}.json"
        proc = run_cli("run", "--workload", workload, "--solution", "reference", "--save", str(save))
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "correctness only" in proc.stdout
        assert f"{n_cases}/{n_cases}" in proc.stdout
        doc = json.loads(save.read_text())
        assert doc["format"] == "dsa-bench-results" and doc["version"] == 1 and doc["complete"] is True
        assert doc["environment"]["torch"] and doc["solutions"]["reference"]["content_hash"]
        assert [r["status"] for r in doc["records"]] == ["PASSED"] * n_cases
        assert all(len(r["seeds"]["correctness"]) == 2 for r in doc["records"])


def test_command_line_settings_are_the_ones_used(tmp_path):
    # --seed and --input-sets must reach the runner, not only the results file's header: the
    # records' seeds are derived from them (the same holds for the timing protocol on a GPU).
    from dsa_bench.workloads import derive_seed

    save = tmp_path / "run.json"
    proc = run_cli("run", "-w", "indexer_smoke", "-s", "reference", "-c", "smoke_passthrough*", "--seed", "77", "--input-sets", "3",
                   "--warmup", "1", "--iterations", "4", "--trials", "2", "--save", str(save))  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(save.read_text())
    assert doc["settings"]["seed"] == 77 and doc["settings"]["iterations"] == 4
    (record,) = doc["records"]
    assert record["seeds"]["correctness"] == [derive_seed(77, record["case"], "check", s) for s in range(3)]


@pytest.mark.slow  # harness runs of failing fixtures (~11 s on two cores)
def test_failing_solution_marks_cases_and_run_goes_on(tmp_path):
    save = tmp_path / "r.json"
    proc = run_cli(
        "run", "-w", "indexer_smoke", "-s", "reference", "-s", str(FIXTURES / "solutions" / "raises"), "--save", str(save)
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout
    doc = json.loads(save.read_text())
    by_solution = {}
    for r in doc["records"]:
        by_solution.setdefault(r["solution"], []).append(r["status"])
    assert by_solution["reference"] == ["PASSED"] * 4
    assert by_solution["raises"] == ["RUNTIME_ERROR"] * 4
    assert "deliberate failure inside the solution" in doc["records"][1]["message"]


def test_entry_point_that_fails_to_import(tmp_path):
    proc = run_cli("run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-s", str(FIXTURES / "solutions" / "bad_import"), "--no-save")
    assert proc.returncode == 1
    assert "COMPILE_ERROR" in proc.stdout
    assert "a_module_that_does_not_exist" in proc.stderr


def test_bad_input_gives_clear_errors_without_traceback(tmp_path):
    cases = [
        (["run", "-w", "no_such_workload"], "unknown workload 'no_such_workload'"),
        (["run", "-w", "indexer_smoke", "-s", "no_such_solution"], "unknown solution 'no_such_solution'"),
        (["run", "-w", "indexer_smoke", "-s", str(FIXTURES / "solutions" / "no_entry_point")], "entry_point must look like"),
        (["run", "-w", "indexer_smoke", "-c", "nothing*"], "no case of workload 'indexer_smoke' matches"),
        (["run", "-w", "indexer_smoke", "--timer", "cupti"], "needs a CUDA device"),
        (["run", "-w", "indexer_smoke", "--device", "cpu", "--cuda-graph"], "--cuda-graph needs a CUDA device: it times CUDA-graph"),
        (["run", "-w", "indexer_smoke", "--l2-flush", "warm"], "unknown L2 flush mode 'warm'; expected one of clean, dirty"),
        (["run", "-w", "sparse_attention_smoke", "-s", str(FIXTURES / "solutions" / "raises")], "has no entry for definition"),
    ]
    for args, fragment in cases:
        proc = run_cli(*args, "--no-save")
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert fragment in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_list_and_validate():
    proc = cli("list")
    assert proc.returncode == 0
    for name in ("indexer_h64", "sparse_attention_h16", INDEXER, "reference"):
        assert name in proc.stdout
    proc = cli("validate", "workloads/indexer_h64.yaml", "traces/sparse_attention_h16.jsonl", "solutions/reference")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok ") == 3
    proc = cli("validate", str(FIXTURES / "solutions" / "no_entry_point"), "workloads/indexer_smoke.yaml")
    assert proc.returncode == 2
    assert "entry_point" in proc.stderr and "ok " in proc.stdout


@pytest.mark.slow
def test_results_kept_when_interrupted(tmp_path):
    """A run stopped by a signal leaves a valid results file with the records it finished."""
    import os
    import signal
    import subprocess
    import sys
    import time

    save = tmp_path / "partial.json"
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsa_bench", "run", "-w", "sparse_attention_h16", "-s", "reference", "--save", str(save)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if save.exists() and json.loads(save.read_text())["records"]:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    doc = json.loads(save.read_text())
    assert doc["complete"] is False
    assert 1 <= len(doc["records"]) < 23
    assert all(r["status"] == "PASSED" for r in doc["records"])
    assert "interrupted" in err
