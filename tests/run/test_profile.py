"""``dsa-bench profile`` on a CPU: the refusal without a profiler, the profiler command lines, the
parsing of Nsight Compute's raw page and Nsight Systems' kernel summary (fixtures in
tests/fixtures/profile/ written in the CSV format the tools print), and the whole path with a
stand-in profiler that runs the target process itself."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT
from typer.testing import CliRunner

from dsa_bench.cli import app
from dsa_bench.run import profile
from dsa_bench.run.profile import (
    NCU_SECTIONS,
    kernels_table,
    ncu_command,
    ncu_import_command,
    nsys_command,
    nsys_stats_command,
    parse_ncu_raw,
    parse_nsys_kern_sum,
    timeline_table,
)

PROFILE_FIXTURES = FIXTURES / "profile"
TARGET = [sys.executable, "-m", "dsa_bench.run.profile_target", "job.pkl"]


@pytest.mark.parametrize(("flags", "tool"), [([], "ncu"), (["--nsys"], "nsys")])
def test_profile_refuses_in_one_line_without_the_profiler(tmp_path, flags, tool):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = CliRunner().invoke(app, ["profile", "-w", "indexer_smoke", "-s", "reference", "-c", "smoke_scored", *flags],
                                env={"PATH": str(empty)})  # fmt: skip
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and f"`{tool}` is not on PATH" in message and "Traceback" not in result.output


def test_ncu_command_profiles_only_the_window_and_leaves_the_clocks_alone():
    command = ncu_command("ncu", Path("results/profile/wl-c-s"), TARGET)
    assert command[0] == "ncu" and command[-len(TARGET) :] == TARGET
    joined = " ".join(command)
    for flag in ("--target-processes all", "--clock-control none", "--profile-from-start off", "-o results/profile/wl-c-s"):
        assert flag in joined
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--section"] == list(NCU_SECTIONS)
    metrics = command[command.index("--metrics") + 1].split(",")
    assert "gpu__time_duration.sum" in metrics and "sm__warps_active.avg.pct_of_peak_sustained_active" in metrics
    read = ncu_import_command("ncu", Path("r.ncu-rep"))
    assert read == ["ncu", "--import", "r.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]


def test_nsys_command_captures_the_profiler_api_window():
    command = nsys_command("nsys", Path("results/profile/wl-c-s"), TARGET)
    assert command[:2] == ["nsys", "profile"] and command[-len(TARGET) :] == TARGET
    joined = " ".join(command)
    assert "--capture-range=cudaProfilerApi" in joined and "--capture-range-end=stop" in joined and "--trace=cuda,nvtx" in joined
    stats = nsys_stats_command("nsys", Path("r.nsys-rep"))
    assert stats == ["nsys", "stats", "--report=cuda_gpu_kern_sum", "--format=csv", "--force-export=true", "r.nsys-rep"]


def test_ncu_raw_page_is_read_per_kernel():
    kernels = parse_ncu_raw((PROFILE_FIXTURES / "ncu_raw.csv").read_text())
    assert [k.name for k in kernels] == ["void (anonymous namespace)::decode_kernel<0>(DecodeArgs)",
                                         "void (anonymous namespace)::combine_kernel(CombineArgs)"]  # fmt: skip
    decode, combine = kernels
    assert decode.duration_us == pytest.approx(535.232) and combine.duration_us == pytest.approx(6.144)  # "535,232" nsecond
    assert (decode.dram_pct, decode.sm_pct, decode.occupancy_pct) == (17.80, 37.38, 23.41)
    # the per-issue family wins over the sampled counts; "selected" is not a stall
    assert decode.stalls == [("long_scoreboard", 3.87), ("short_scoreboard", 2.14), ("wait", 1.66)]
    assert combine.stalls == [("long_scoreboard", 9.42), ("wait", 0.55), ("short_scoreboard", 0.31)]
    table = kernels_table(kernels)
    assert "535.23" in table and "long_scoreboard 3.87, short_scoreboard 2.14, wait 1.66" in table and "541.38 µs in all" in table


def test_ncu_scaled_units_and_sampled_stalls_are_read_too():
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",'
        '"gpu__time_duration.sum","smsp__pcsamp_warps_issue_stalled_long_scoreboard","smsp__pcsamp_warps_issue_stalled_long_scoreboard_not_issued",'
        '"smsp__pcsamp_warps_issue_stalled_selected","smsp__pcsamp_warps_issue_stalled_wait"',
        '"","","","","","","","","","","","usecond","","","",""',
        '"0","1","python","h","k","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0","4.30","120","99","500","30"',
    ])  # fmt: skip
    (kernel,) = parse_ncu_raw(text)
    assert kernel.duration_us == pytest.approx(4.30) and kernel.dram_pct is None
    assert kernel.stalls == [("long_scoreboard", 120.0), ("wait", 30.0)]


def test_a_csv_that_is_no_raw_page_is_refused():
    from dsa_bench.errors import DsaBenchError

    with pytest.raises(DsaBenchError, match="no CSV table"):
        parse_ncu_raw("==ERROR== the report could not be opened\n")
    with pytest.raises(DsaBenchError, match="Kernel Name"):
        parse_ncu_raw('"ID","Metric"\n"0","1"\n')


def test_nsys_kernel_summary_is_read_after_its_progress_lines():
    kernels = parse_nsys_kern_sum((PROFILE_FIXTURES / "nsys_kern_sum.csv").read_text())
    assert [(k.name, k.instances) for k in kernels] == [("void (anonymous namespace)::decode_kernel<0>(DecodeArgs)", 1),
                                                         ("void (anonymous namespace)::combine_kernel(CombineArgs)", 1)]  # fmt: skip
    assert kernels[0].total_us == pytest.approx(429.216) and kernels[1].avg_us == pytest.approx(5.664)
    assert kernels[0].time_pct == 98.7
    assert "2 kernel launch(es) in the profiled call" in timeline_table(kernels)


FAKE_NCU = """#!{python}
# Stands in for ncu: runs the profiled command itself (no profiling), writes a report file,
# and prints the recorded raw page for --import.
import json, os, subprocess, sys
args = sys.argv[1:]
if "--import" in args:
    sys.stdout.write(open({fixture!r}).read())
    sys.exit(0)
out = args[args.index("-o") + 1]
target = args[args.index("-o") + 2:]
open(out + ".args.json", "w").write(json.dumps({{"args": args, "home": os.environ.get("HOME")}}))
rc = subprocess.call(target)
open(out + ".ncu-rep", "w").write("fake report")
sys.exit(rc)
"""


def _project_with_a_fake_ncu(tmp_path: Path, monkeypatch, shared: tuple[str, ...]) -> Path:
    """A project root linking ``shared`` folders of this one, a stand-in ``ncu`` first on PATH, and
    the CPU as the profiled device (profile refuses a CPU, so the device choice is replaced)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable, fixture=str(PROFILE_FIXTURES / "ncu_raw.csv")))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    project = tmp_path / "project"
    project.mkdir()
    for folder in shared:
        (project / folder).symlink_to(ROOT / folder)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DSA_BENCH_ROOT", str(project))
    monkeypatch.setattr(profile, "profile_device", lambda name: torch.device("cpu"))
    return project


@pytest.mark.slow
def test_profile_runs_the_case_in_its_own_process_and_prints_each_kernel(tmp_path, monkeypatch):
    """The whole path with a stand-in ncu: the target process builds the case's inputs and calls the
    solution (on the CPU here; profile refuses a CPU, so the device choice is replaced)."""
    project = _project_with_a_fake_ncu(tmp_path, monkeypatch, ("workloads", "traces", "solutions"))
    result = CliRunner().invoke(app, ["profile", "-w", "indexer_smoke", "-s", "reference", "-c", "smoke_scored", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert "decode_kernel" in result.output and "long_scoreboard 3.87" in result.output
    base = project / "results" / "profile" / "indexer_smoke-smoke_scored-reference"
    assert Path(f"{base}.ncu-rep").is_file() and Path(f"{base}.raw.csv").read_text().startswith("==PROF==")
    seen = json.loads(Path(f"{base}.args.json").read_text())
    assert "--clock-control" in seen["args"] and seen["home"].endswith("home/reference")  # the worker's environment
    assert not Path(f"{base}.job.pkl").exists() and not Path(f"{base}.status.json").exists()


@pytest.mark.slow
def test_a_failing_solution_fails_the_profile_with_its_error(tmp_path, monkeypatch):
    project = _project_with_a_fake_ncu(tmp_path, monkeypatch, ("workloads", "traces"))
    broken = project / "solutions" / "broken"
    broken.mkdir(parents=True)
    (broken / "solution.yaml").write_text(
        "name: broken\nentries:\n  dsa_topk_indexer_fp8_h64_d128_topk2048_ps64:\n    entry_point: kernel.py::run\n    language: python\n"
    )
    (broken / "kernel.py").write_text("def run(*args):\n    raise RuntimeError('kernel exploded')\n")
    result = CliRunner().invoke(app, ["profile", "-w", "indexer_smoke", "-s", "broken", "-c", "smoke_scored", "--warmup", "0"])
    assert result.exit_code == 1, result.output
    assert "profile failed" in result.stderr and "kernel exploded" in result.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("shutil").which("ncu"), reason="needs Nsight Compute (ncu) on PATH")
def test_profile_under_nsight_compute_on_a_gpu():
    """The real thing: the attention's smoke case under ncu, each kernel with a duration."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "dsa_bench", "profile", "-w", "sparse_attention_smoke", "-s", "triton", "-c",
                           "smoke_t3_empty_small"], cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernel launch(es)" in proc.stdout and "report: " in proc.stdout
    kernels = parse_ncu_raw(Path(proc.stdout.split("(parsed: ")[1].split(")")[0]).read_text())
    assert kernels and all(k.duration_us and k.duration_us > 0 for k in kernels)
    assert all(k.sm_pct is not None and k.occupancy_pct is not None for k in kernels)
