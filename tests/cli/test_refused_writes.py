"""Outputs never land where a run reads: inside a solution folder (any, not only the run's own:
a new file changes the folder's content hash) or under the project's workloads/ and traces/."""

from __future__ import annotations

import shutil

import pytest
from conftest import ROOT, cli


@pytest.mark.parametrize(
    ("args", "target", "fragment"),
    [
        (["run", "-w", "indexer_smoke", "-s", "reference", "--save", "solutions/triton/out.json"], "solutions/triton/out.json",
         "--save: lies inside"),
        (["run", "-w", "indexer_smoke", "-s", "reference", "--save", "workloads/out.json"], "workloads/out.json", "workloads/ folder"),
        (["run", "-w", "indexer_smoke", "-s", "reference", "--save", "traces/sub/out.json"], "traces/sub", "traces/ folder"),
        (["pack", "solutions/reference", "--out", "workloads"], "workloads/reference_dsa_topk_indexer_fp8_h64_d128_topk2048_ps64.json",
         "--out: lies inside"),
        (["pack", "solutions/reference", "--out", "traces"], "traces/reference_dsa_topk_indexer_fp8_h64_d128_topk2048_ps64.json",
         "traces/ folder"),
        (["pack", "solutions/reference", "--out", "solutions/triton/packed"], "solutions/triton/packed", "a solution folder"),
    ],
)
def test_outputs_inside_solution_workload_and_trace_folders_are_refused(args, target, fragment):
    proc = cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (ROOT / target).exists(), f"{target} was written"


def test_a_solution_folder_outside_the_project_is_protected_too(tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(ROOT / "solutions" / "reference", mine)
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "--save", str(mine / "deep" / "out.json"))
    assert proc.returncode == 2 and f"lies inside {mine}, a solution folder" in proc.stderr, proc.stderr
    assert not (mine / "deep").exists()
