"""A flashinfer-bench dataset's ``reference`` source is the dataset's code: loading the dataset
runs none of it, and the harness gets its expectations from an isolated worker under
``--case-timeout``, so a reference that never returns ends as TIMEOUT instead of a hang."""

from __future__ import annotations

import builtins
import json

import pytest
from conftest import run_cli
from dataset_files import RMSNORM, RMSNORM_SOLUTION, _dataset

from dsa_bench.flashinfer_bench.dataset import load_dataset_workload


def test_loading_a_dataset_runs_none_of_its_reference(tmp_path):
    source = (
        "import builtins\nbuiltins.DSA_BENCH_TEST_REFERENCE_RAN = True\n\ndef run(hidden_states, weight, eps):\n    return hidden_states\n"
    )
    workload = load_dataset_workload(_dataset(tmp_path / "dataset", source), RMSNORM)
    assert workload.definition.name == RMSNORM
    assert not hasattr(builtins, "DSA_BENCH_TEST_REFERENCE_RAN"), "the dataset's reference ran in the harness"


@pytest.mark.slow
@pytest.mark.parametrize(
    "reference",
    [
        "def run(hidden_states, weight, eps):\n    while True:\n        pass\n",  # run() never returns
        "while True:\n    pass\n\ndef run(hidden_states, weight, eps):\n    return hidden_states\n",  # loops when loaded
    ],
    ids=["run_never_returns", "loops_when_loaded"],
)
def test_a_reference_that_never_returns_is_a_timeout(tmp_path, reference):
    dataset = _dataset(tmp_path / "dataset", reference)
    solution = tmp_path / "rms_user"
    solution.mkdir()
    for rel, text in RMSNORM_SOLUTION.items():
        (solution / rel).write_text(text)
    save = tmp_path / "results.json"
    proc = run_cli("run", "--dataset", str(dataset), "-w", RMSNORM, "-s", str(solution), "--case-timeout", "3", "--save", str(save),
                   timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (record,) = json.loads(save.read_text())["records"]
    assert record["solution"] == "rms_user" and record["status"] == "TIMEOUT", record
    assert "the dataset's reference failed: no answer within 3 s while computing the dataset reference's expectation" in record["message"]
