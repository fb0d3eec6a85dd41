"""benchmarks/baseline_h200.sh: which workloads it runs with which solutions, what it skips and
resumes, the update it ends with, and its refusals. The dsa-bench command and nvidia-smi are
stand-ins that record their arguments (no GPU, no runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "baseline_h200.sh"
CPU_SETS = ("smoke", "mix", "edges")

#: records each call as one JSON line; `run` writes a finished results file where --save or --resume says
STAND_IN = """
import json, os, sys
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[0] == "run":
    path = args[args.index("--save") + 1] if "--save" in args else args[args.index("--resume") + 1]
    with open(path, "w") as f:
        json.dump({"complete": True}, f)
"""


def gpu_workloads() -> set[str]:
    return {p.stem for p in (ROOT / "workloads").glob("*.yaml") if not any(p.stem.endswith(s) for s in CPU_SETS)}


def run_script(tmp_path: Path, *args: str, gpu: str = "NVIDIA H200", **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{gpu}'\n")
    smi.chmod(0o755)
    stand_in = tmp_path / "dsa_bench_stand_in.py"
    stand_in.write_text(STAND_IN)
    calls = tmp_path / "calls.jsonl"
    environ = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DSA_BENCH": f"{sys.executable} {stand_in}",
        "CALLS": str(calls),
        "BASELINE": str(tmp_path / "h200.json"),
        **env,
    }
    done = subprocess.run(["bash", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=120)
    logged = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return done, logged


def test_it_runs_every_shipped_gpu_workload_once_and_updates_the_baseline_with_all(tmp_path):
    out = tmp_path / "runs"
    done, calls = run_script(tmp_path, str(out))
    assert done.returncode == 0, done.stderr
    runs = [c for c in calls if c[0] == "run"]
    ran = [c[c.index("-w") + 1] for c in runs]
    # every workload meant for the GPU (the CPU sets are smoke, mix and edges), each once
    assert sorted(ran) == sorted(gpu_workloads()) and len(ran) == len(set(ran))
    for c in runs:
        solutions = [c[i + 1] for i, a in enumerate(c) if a == "-s"]
        workload = c[c.index("-w") + 1]
        want = ["reference", "flashmla", "triton"] if workload.startswith("mla_decode") else ["reference", "triton"]
        assert solutions == want, c
        assert c[c.index("--save") + 1] == str(out / f"{workload}.json")
    update = calls[-1]
    assert update[:2] == ["baseline", "update"] and update[-2:] == ["--baseline", str(tmp_path / "h200.json")]
    assert sorted(Path(p).stem for p in update[2:-2]) == sorted(gpu_workloads())


def test_a_finished_file_is_kept_an_interrupted_one_resumed_and_a_group_runs_alone(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "mla_decode_v32_tp8.json").write_text(json.dumps({"complete": True}))
    (out / "mla_decode_v4_tp8.json").write_text(json.dumps({"complete": False}))
    done, calls = run_script(tmp_path, str(out), "decode")
    assert done.returncode == 0, done.stderr
    ran = [c[c.index("-w") + 1] for c in calls if c[0] == "run" and "-w" in c]
    assert "mla_decode_v32_tp8" not in ran and "mla_decode_v4_tp8" not in ran
    assert all(w.startswith("mla_decode") for w in ran) and len(ran) == 8
    assert ["run", "--resume", str(out / "mla_decode_v4_tp8.json"), "-q"] in calls
    assert "mla_decode_v32_tp8: complete" in done.stdout


@pytest.mark.parametrize(
    ("args", "gpu", "message"),
    [
        ((), "NVIDIA H100 80GB HBM3", "not an H200"),
        (("runs", "decode", "everything"), "NVIDIA H200", "unknown group 'everything'"),
    ],
)
def test_refusals_exit_2_with_one_line_and_run_nothing(tmp_path, args, gpu, message):
    done, calls = run_script(tmp_path, *[str(tmp_path / a) if a == "runs" else a for a in args], gpu=gpu)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert calls == []


def test_force_takes_another_gpu(tmp_path):
    done, calls = run_script(tmp_path, str(tmp_path / "runs"), "insert", gpu="NVIDIA H100 80GB HBM3", FORCE="1")
    assert done.returncode == 0, done.stderr
    assert {c[c.index("-w") + 1] for c in calls if c[0] == "run"} == {w for w in gpu_workloads() if w.startswith("kv_insert")}
