"""Spreading a run over several devices (``--gpus N``) and over a Ray cluster (``--executor ray``).

On a CPU machine N "devices" are N parallel correctness-only workers, and Ray runs locally with
logical GPUs: the statuses and seeds must be those of a plain one-device run, and adversarial
solutions (one crashing, one hanging) must get their statuses without stopping the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT, cli, run_cli

ADVERSARIAL = FIXTURES / "adversarial"
CASES = ["-c", "smoke_boundary", "-c", "smoke_scored", "-c", "smoke_edges"]


def _records(path) -> dict[tuple[str, str], dict]:
    return {(r["case"], r["solution"]): r for r in json.loads(path.read_text())["records"]}


def _same_statuses_and_seeds(plain: dict, spread: dict) -> None:
    assert plain.keys() == spread.keys()
    for key, record in plain.items():
        assert spread[key]["status"] == record["status"], key
        assert spread[key]["seeds"] == record["seeds"], key


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain") / "results.json"
    proc = run_cli("run", "-w", "indexer_smoke", *CASES, "-s", "reference", "-s", "triton", "--save", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _records(out)


@pytest.mark.slow  # a run over two CPU devices beside a plain one (~13 s on two cores)
def test_two_cpu_devices_give_the_plain_run_statuses_and_seeds(tmp_path, plain_run):
    out = tmp_path / "results.json"
    proc = run_cli("run", "-w", "indexer_smoke", *CASES, "-s", "reference", "-s", "triton", "--gpus", "2", "--save", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 2 devices (cpu, cpu)" in proc.stdout
    spread = _records(out)
    _same_statuses_and_seeds(plain_run, spread)
    document = json.loads(out.read_text())
    assert [g["index"] for g in document["environment"]["gpus"]] == [0, 1]
    assert {r["gpu"] for r in spread.values()} <= {0, 1}
    for case in ("smoke_boundary", "smoke_scored", "smoke_edges"):  # a case's solutions share one device
        assert spread[(case, "reference")]["gpu"] == spread[(case, "triton")]["gpu"]
    assert [(r["case"], r["solution"]) for r in document["records"]] == list(plain_run), "records in the plain run's order"


@pytest.mark.slow  # over 10 s on 2 CPU cores: make test-all (make test stays under 5 min)
def test_adversaries_on_two_devices_get_their_statuses_and_the_run_goes_on(tmp_path):
    out = tmp_path / "results.json"
    proc = run_cli(
        "run", "-w", "indexer_smoke", *CASES, "-s", "reference", "-s", str(ADVERSARIAL / "kills_itself"),
        "-s", str(ADVERSARIAL / "sleeps"), "--gpus", "2", "--case-timeout", "6", "--save", str(out),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    records = _records(out)
    for case in ("smoke_boundary", "smoke_scored", "smoke_edges"):
        assert records[(case, "reference")]["status"] == "PASSED"
        assert records[(case, "kills_itself")]["status"] == "RUNTIME_ERROR"
        assert records[(case, "sleeps")]["status"] == "TIMEOUT"
    assert "worker process died (exit code -9)" in records[("smoke_scored", "kills_itself")]["message"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--gpus", "0"], "--gpus '0': expected a count >= 1 or 'all'"),
        (["--gpus", "two"], "--gpus 'two': expected a count >= 1 or 'all'"),
        (["--gpus", "2", "--device", "cuda:1"], "--gpus takes the devices itself; --device 'cuda:1' names one"),
        (["--executor", "slurm"], "--executor 'slurm': expected one of local, ray"),
        (["--ray-address", "10.0.0.1:6379"], "--ray-address needs --executor ray"),
    ],
)
def test_bad_device_options_are_refused(args, fragment):
    proc = cli("run", "-w", "indexer_smoke", "--no-save", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_ray_executor_without_ray_is_a_clear_error():
    blocked = "import sys; sys.modules['ray'] = None; from dsa_bench.cli import main; sys.argv[0] = 'dsa-bench'; main()"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", blocked, "run", "-w", "indexer_smoke", "--executor", "ray", "--no-save"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--executor ray needs Ray, which is not installed here: pip install 'dsa-bench[ray]'" in proc.stderr


@pytest.fixture(scope="module")
def ray_cluster():
    if os.environ.get("CI") and not _has_ray():
        pytest.fail("Ray is required in CI (make test installs the ray extra) but is not installed")
    ray = pytest.importorskip("ray")
    # address "local": this test's own cluster, never one another run left on the machine
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
def test_ray_local_cluster_runs_the_smoke_workload_with_adversaries(tmp_path, ray_cluster, plain_run):
    out = tmp_path / "results.json"
    proc = cli(
        "run", "-w", "indexer_smoke", *CASES, "-s", "reference", "-s", "triton", "-s", str(ADVERSARIAL / "kills_itself"),
        "-s", str(ADVERSARIAL / "sleeps"), "--executor", "ray", "--case-timeout", "6", "--save", str(out),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the adversaries fail; nothing else does
    records = _records(out)
    _same_statuses_and_seeds(plain_run, {k: v for k, v in records.items() if k[1] in ("reference", "triton")})
    for case in ("smoke_boundary", "smoke_scored", "smoke_edges"):
        assert records[(case, "kills_itself")]["status"] == "RUNTIME_ERROR"
        assert records[(case, "sleeps")]["status"] == "TIMEOUT"
    document = json.loads(out.read_text())
    assert len(document["environment"]["gpus"]) == 2, "one actor per logical GPU"
    assert {r["gpu"] for r in records.values()} == {0, 1}
    assert document["complete"] is True


@pytest.mark.slow
def test_ray_on_cpu_starts_a_local_cluster_without_gpus_and_keeps_rays_notices_out(tmp_path, plain_run):
    """`--executor ray --device cpu` with no cluster running: a local Ray with CPU actors, the plain
    run's statuses and seeds, and none of Ray's own notices in the output."""
    if os.environ.get("CI") and not _has_ray():
        pytest.fail("Ray is required in CI (make test installs the ray extra) but is not installed")
    pytest.importorskip("ray")
    out = tmp_path / "results.json"
    proc = run_cli("run", "-w", "indexer_smoke", *CASES, "-s", "reference", "-s", "triton", "--executor", "ray", "--device", "cpu",
                   "--gpus", "2", "--save", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 2 Ray CPU actor(s), correctness only" in proc.stdout
    _same_statuses_and_seeds(plain_run, _records(out))
    assert "Token authentication" not in proc.stdout + proc.stderr and "Ray" not in proc.stderr, proc.stderr
