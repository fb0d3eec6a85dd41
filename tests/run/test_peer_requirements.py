"""Peer solutions: a solution whose ``requires`` do not hold here is SKIPPED with its reason, never a failure."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES, cli, run_cli

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.run import runner
from dsa_bench.run.requirements import unmet
from dsa_bench.solution import Requirements, load_solution

PEERS = FIXTURES / "solutions"


@pytest.mark.slow  # a harness run with skipped peers (~8 s on two cores)
def test_missing_module_and_missing_gpu_are_skipped_and_the_run_passes(tmp_path):
    out = tmp_path / "results.json"
    proc = run_cli(
        "run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-s", "reference",
        "-s", str(PEERS / "peer_missing_module"), "-s", str(PEERS / "peer_needs_gpu"), "-s", str(PEERS / "peer_available"),
        "--save", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["solution"]: r for r in json.loads(out.read_text())["records"]}
    missing, gpu, available = records["peer_missing_module"], records["peer_needs_gpu"], records["peer_available"]
    assert missing["status"] == "SKIPPED"
    assert "a_peer_module_that_is_not_installed cannot be imported" in missing["message"]
    assert "pip install a-peer-package==1.2.3" in missing["message"]
    assert gpu["status"] == "SKIPPED" and "needs a CUDA GPU (sm_90)" in gpu["message"]
    assert available["status"] == "PASSED" and records["reference"]["status"] == "PASSED"
    document = json.loads(out.read_text())
    assert set(document["solution_packages"]["peer_available"]) == {"pyyaml"}
    assert "peer_missing_module: 1 case(s) skipped: a_peer_module_that_is_not_installed" in proc.stdout
    assert "SKIPPED" not in proc.stderr  # not listed among failures


def test_unmet_requirements_name_the_missing_piece():
    cpu = torch.device("cpu")
    assert unmet(Requirements(), cpu) is None
    assert unmet(Requirements({"yaml": "pyyaml>=5"}), cpu) is None
    wrong_version = unmet(Requirements({"yaml": "pyyaml<1"}), cpu)
    assert wrong_version is not None and "needs pyyaml<1, found pyyaml" in wrong_version
    not_provided = unmet(Requirements({"yaml": "some-other-dist==1"}), cpu)
    assert not_provided is not None and "no installed distribution 'some-other-dist'" in not_provided
    assert "needs a CUDA GPU (sm_90 or sm_100)" in (unmet(Requirements(cuda_capabilities=("sm_90", "sm_100")), cpu) or "")


@pytest.mark.parametrize(
    ("requires", "fragment"),
    [
        ("{modules: {flash_mla: 'not a requirement!!'}}", "requires.modules.flash_mla is not a pip requirement"),
        ("{modules: {'flash-mla': 'sgl-flash-mla'}}", "must be an importable module name"),
        ("{cuda_capabilities: [hopper]}", "cuda_capabilities[0] must name a CUDA compute capability such as 'sm_90', got 'hopper'"),
        ("{gpus: [sm_90]}", "requires.gpus"),
    ],
)
def test_bad_requires_are_named(tmp_path, requires, fragment):
    folder = tmp_path / "peer"
    folder.mkdir()
    (folder / "kernel.py").write_text("def kernel(*a):\n    pass\n")
    (folder / "solution.yaml").write_text(
        f"requires: {requires}\nentries:\n  d:\n    entry_point: kernel.py::kernel\n    language: python\n"
    )
    with pytest.raises(DsaBenchError) as err:
        load_solution(folder)
    assert fragment in str(err.value)
    proc = cli("pack", str(folder), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and fragment in proc.stderr


def test_a_remembered_skip_is_raised_fresh_for_every_case():
    """A solution skipped (or failed to build) once is failed on every later case with a new
    exception: re-raising the remembered object grew its traceback by each case's frames, which
    kept every case's inputs and expected outputs alive (the harness reached 23 GB on CPU)."""
    handle = object.__new__(runner.WorkerHandle)  # no worker needed: the failure is already known
    handle.compile_failure = runner.WorkerFailure(Status.SKIPPED, "skipped: needs a CUDA GPU (sm_90)")
    caught = []
    for _ in range(3):
        try:
            handle.ensure_started()
        except runner.WorkerFailure as exc:
            caught.append(exc)
    assert len({id(exc) for exc in caught}) == 3
    assert all(exc.status is Status.SKIPPED and exc.message == "skipped: needs a CUDA GPU (sm_90)" for exc in caught)

    def depth(exc):
        tb, n = exc.__traceback__, 0
        while tb is not None:
            tb, n = tb.tb_next, n + 1
        return n

    assert depth(caught[2]) == depth(caught[0])
