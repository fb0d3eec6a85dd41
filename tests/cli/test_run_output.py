"""What `dsa-bench run` prints in a log (stdout not a terminal), with --quiet and --json-lines,
and the wall-time breakdown it records and prints."""

from __future__ import annotations

import json
import re

import pytest
from conftest import FIXTURES, cli

WRITES_NOTHING = str(FIXTURES / "adversarial" / "writes_nothing")
LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+) (\S+): ([A-Z_]+), (.*)$")


@pytest.fixture(scope="module")
def log_run(tmp_path_factory):
    """One run as a log shows it: the reference passes, writes_nothing fails every case."""
    save = tmp_path_factory.mktemp("log") / "run.json"
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-s", WRITES_NOTHING, "--save", str(save), "--breakdown")
    return proc, json.loads(save.read_text())


def test_a_log_has_one_line_per_record_and_a_summary(log_run):
    proc, doc = log_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [m for m in map(LINE.match, proc.stdout.splitlines()) if m]
    assert [(m[1], m[2]) for m in lines] == [(str(i), "8") for i in range(1, 9)], proc.stdout
    assert [(m[3], m[4], m[5]) for m in lines] == [(r["case"], r["solution"], r["status"]) for r in doc["records"]]
    for m in lines:
        if m[4] == "reference":
            assert m[5] == "PASSED" and m[6].startswith("correctness only, ")
        else:  # a failure's line carries its message
            assert m[5] == "INCORRECT_INDICES" and "neither -1 nor a token id" in m[6]
    assert "max abs err" not in proc.stdout, "a log does not repeat every record in a table"
    summary = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.startswith(("reference ", "writes_nothing "))}
    assert summary["reference"][1] == "4/4" and summary["writes_nothing"][1] == "0/4"
    wall = sum(r["wall_s"] for r in doc["records"] if r["solution"] == "reference")
    assert summary["reference"][-1] == f"{wall:.1f}", "the summary gives each solution's wall time"
    assert "results: " in proc.stdout


def test_the_breakdown_accounts_for_the_wall_time(log_run):
    from dsa_bench.run.breakdown import PHASES

    proc, doc = log_run
    breakdown = doc["wall_breakdown"]
    phases = breakdown["phases_s"]
    assert list(phases) == list(PHASES) and breakdown["sittings"] == 1
    assert sum(phases.values()) == pytest.approx(breakdown["wall_s"], rel=1e-9)
    assert phases["other"] < 0.2 * breakdown["wall_s"], f"the phases cover the run: {phases}"
    for name in ("planning", "worker_start", "worker_inputs", "correctness_calls", "traffic", "harness_inputs", "expectations", "checks",
                 "results_writes", "worker_stop"):  # fmt: skip
        assert phases[name] > 0, name
    assert phases["warmup"] == phases["timed_calls"] == 0, "nothing is timed on a CPU"
    by_solution = breakdown["by_solution"]
    assert set(by_solution) == {"reference", "writes_nothing"}
    assert by_solution["reference"]["correctness_calls"] > 0 and by_solution["writes_nothing"]["worker_start"] > 0
    assert "harness_inputs" not in by_solution["reference"], "the harness's own work is nobody's solution's"
    table = proc.stdout[proc.stdout.index("wall time ") :]
    assert re.search(r"^worker_start +\d+\.\d\d +\d+\.\d%", table, re.M) and re.search(r"^total +\d+\.\d\d +100\.0%", table, re.M)


def test_quiet_prints_only_the_summary(tmp_path):
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-c", "smoke_passthrough", "--no-save", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(LINE.match(line) for line in proc.stdout.splitlines())
    assert "cases x" not in proc.stdout and "workers run as" not in proc.stdout
    assert re.search(r"^reference +1/1 ", proc.stdout, re.M) and "wall time " in proc.stdout


def test_json_lines_are_the_records_then_a_summary(tmp_path):
    save = tmp_path / "run.json"
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-s", WRITES_NOTHING, "-c", "smoke_passthrough", "--save", str(save),
               "--json-lines")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    objects = [json.loads(line) for line in proc.stdout.splitlines()]  # nothing but JSON on stdout
    doc = json.loads(save.read_text())
    assert objects[:-1] == doc["records"]
    summary = objects[-1]["summary"]
    assert summary["complete"] is True and summary["interrupted_by"] is None and summary["results"] == str(save)
    assert [(s["solution"], s["passed"], s["total"]) for s in summary["solutions"]] == [("reference", 1, 1), ("writes_nothing", 0, 1)]
    assert summary["wall_breakdown"] == doc["wall_breakdown"]
    assert "indexer_smoke: 1 cases x 2 solutions" in proc.stderr, "human text goes to stderr"
    assert "smoke_passthrough [writes_nothing] INCORRECT_INDICES" in proc.stderr


def test_a_phase_clock_charges_the_innermost_phase(monkeypatch):
    from dsa_bench.results.records import WallBreakdown
    from dsa_bench.run import breakdown

    ticks = iter(range(0, 1000, 1))
    monkeypatch.setattr(breakdown, "_now", lambda: float(next(ticks)))
    earlier = WallBreakdown(wall_s=10.0, sittings=1, phases_s={"checks": 4.0, "other": 6.0}, by_solution={"a": {"checks": 4.0}})
    clock = breakdown.PhaseClock(planning_s=2.0, previous=earlier)
    # the clock started at tick 0
    with clock.phase("checks", "a"):  # enters at 1
        with clock.phase("expectations"):  # 2 .. 5
            next(ticks), next(ticks)
        # back in checks at 5; leaves at 6
    with clock.phase("traffic", "a") as request:  # 7 .. 12
        for _ in range(4):
            next(ticks)
    assert request.seconds == 5
    clock.reassign({"calls": 3.0, "build_inputs": 4.0, "nonsense": 9.0}, "a", request.seconds)  # capped at the 5 s round trip
    result = clock.breakdown()  # at tick 13
    assert result.wall_s == 2.0 + 13 + 10.0 and result.sittings == 2
    phases = result.phases_s
    assert phases["checks"] == 2 + 4.0 and phases["expectations"] == 3
    assert phases["correctness_calls"] == pytest.approx(5 * 3 / 7) and phases["worker_inputs"] == pytest.approx(5 * 4 / 7)
    assert phases["traffic"] == pytest.approx(0.0, abs=1e-12)
    assert phases["planning"] == 2.0 and phases["other"] == 3 + 6.0  # this sitting's 15 s less the 12 s its phases hold, and the earlier
    assert sum(phases.values()) == pytest.approx(result.wall_s)
    assert result.by_solution["a"]["checks"] == 6.0 and "expectations" not in result.by_solution["a"]


@pytest.mark.gpu
def test_a_timed_log_and_its_breakdown(tmp_path):
    """On a GPU: latency and speedup in the log lines, and the timing phases of both the
    reference and the solution in the breakdown."""
    save = tmp_path / "run.json"
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-s", "triton", "--warmup", "1", "--iterations", "3", "--trials", "2",
               "--save", str(save))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [m for m in map(LINE.match, proc.stdout.splitlines()) if m]
    assert len(lines) == 8
    assert all(re.match(r"\d+\.\d µs", m[6]) for m in lines), proc.stdout
    assert all(re.match(r"\d+\.\d µs \(\d+\.\d\dx\)", m[6]) for m in lines if m[4] == "triton"), proc.stdout
    breakdown = json.loads(save.read_text())["wall_breakdown"]
    for solution in ("reference", "triton"):
        mine = breakdown["by_solution"][solution]
        assert mine["warmup"] > 0 and mine["timed_calls"] > 0 and mine["encode"] > 0 and mine["decode"] > 0, mine
    assert sum(breakdown["phases_s"].values()) == pytest.approx(breakdown["wall_s"], rel=1e-9)


def test_a_skipped_peer_is_one_line_in_a_log_and_one_row_in_the_table(tmp_path):
    """On CPU a peer is skipped on every case: one log line (and a note) for it, not one per case."""
    from dsa_bench.definitions.status import Status
    from dsa_bench.results.records import CaseRecord
    from dsa_bench.results.tables import records_table

    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-s", "deepgemm_sglang", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [m for m in map(LINE.match, proc.stdout.splitlines()) if m]
    assert [m[5] for m in lines if m[4] == "deepgemm_sglang"] == ["SKIPPED"], proc.stdout
    assert len([m for m in lines if m[4] == "reference"]) == 4
    assert "the other cases of deepgemm_sglang are skipped for the same reason and not listed" in proc.stdout
    skipped = [
        CaseRecord(case=f"c{i}", solution="peer", axes={"L": i}, status=Status.SKIPPED, message="needs an SM90 GPU") for i in range(5)
    ]
    passed = CaseRecord(case="c0", solution="reference", axes={"L": 0}, status=Status.PASSED)
    table = records_table([passed, *skipped], ("L",))
    assert len(table.splitlines()) == 4 and "(5 cases)" in table, table


def test_a_long_log_says_how_far_it_is_and_how_long_the_rest_takes():
    from dsa_bench.results.tables import progress_every, progress_line

    assert progress_every(8) == 10 and progress_every(512) == 52
    assert progress_line(52, 512, 130.0) == "progress: 52/512 records in 2 min 10 s; about 19 min 10 s left at this pace"


def test_a_root_harness_says_what_unisolated_workers_mean(monkeypatch):
    from dsa_bench.cli import _unisolated
    from dsa_bench.run.isolation import WorkerIdentity

    monkeypatch.setattr("os.geteuid", lambda: 0)
    fallback = WorkerIdentity(None, None, "the harness's user: an unprivileged worker could not read /root (mode drwx------)")
    assert _unisolated(fallback) == " (so solutions run as root, not isolated from the harness: docs/trust.md)"
    assert _unisolated(WorkerIdentity(None, None, "the harness's user (--worker-user harness)")) == ""  # asked for
    assert _unisolated(WorkerIdentity(61234, 61234, "unprivileged uid/gid 61234")) == ""
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert _unisolated(fallback) == ""
