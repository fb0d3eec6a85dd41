"""`dsa-bench compare` and `baseline update` on synthetic results: verdicts, exit codes, file format."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from conftest import FIXTURES, cli
from synthetic_results import write_results

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.results.baseline import BASELINE_FORMAT, CaseMeasure, load_baseline, update_baseline
from dsa_bench.results.compare import Verdict, classify, compare_results, render_comparison
from dsa_bench.results.records import load_results

WORKLOAD = "indexer_h64"


def latencies(scale: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Four cases; the triton solution is ~10x faster than the reference, 'other' ~2x."""
    scale = scale or {}
    cases = {}
    for i, case in enumerate(["b1_p10", "b4_p36", "b16_p40", "b31_p91"]):
        ref = 0.6 + 0.25 * i
        cases[case] = {
            "reference": ref,
            "triton": ref / 10 * scale.get(case, 1.0),
            "other": ref / 2,
        }
    return cases


@pytest.fixture
def baseline(tmp_path):
    path = tmp_path / "baselines" / "h200.json"
    update_baseline(path, [write_results(tmp_path / "base.json", WORKLOAD, latencies())])
    return path


def _compare(tmp_path, baseline, name="new.json", **kwargs):
    results = load_results(write_results(tmp_path / name, WORKLOAD, **kwargs))
    return compare_results([results], load_baseline(baseline))


def test_classification_rule():
    def measure(speedup, spread=0.01, status="PASSED"):
        return CaseMeasure(status=status, speedup=speedup, spread=spread, reference_spread=spread)

    key = (WORKLOAD, "c", "triton")
    assert classify(key, measure(10), measure(10 / 1.10), 0.05).verdict is Verdict.SLOWER  # a 10 % slowdown
    assert classify(key, measure(10), measure(9.6), 0.05).verdict is Verdict.SAME  # 4 %: inside the threshold
    assert classify(key, measure(10), measure(11), 0.05).verdict is Verdict.FASTER
    # noisy trials widen the band: ½ · (4 × 8 %) = 16 % covers a 10 % change
    noisy = classify(key, measure(10, 0.08), measure(9, 0.08), 0.05)
    assert noisy.verdict is Verdict.SAME and noisy.band == pytest.approx(0.16)
    assert classify(key, measure(10), measure(None, status="TIMEOUT"), 0.05).newly_failing
    still = classify(key, measure(None, status="INCORRECT_INDICES"), measure(None, status="TIMEOUT"), 0.05)
    assert still.verdict is Verdict.FAILED and not still.newly_failing
    assert classify(key, measure(None, status="TIMEOUT"), measure(5), 0.05).verdict is Verdict.FIXED
    assert classify(key, measure(None), measure(None), 0.05).verdict is Verdict.UNTIMED


def test_unchanged_improved_regressed_failed(tmp_path, baseline):
    same = _compare(tmp_path, baseline, latencies=latencies())
    assert same.ok and {c.verdict for c in same.cases} == {Verdict.SAME} and len(same.cases) == 12

    noise = _compare(tmp_path, baseline, latencies=latencies({"b1_p10": 1.02, "b4_p36": 0.98}))
    assert noise.ok and not noise.slower

    improved = _compare(tmp_path, baseline, latencies=latencies({"b16_p40": 0.8}))
    assert improved.ok
    assert [(c.key[1], c.key[2]) for c in improved.cases if c.verdict is Verdict.FASTER] == [("b16_p40", "triton")]

    regressed = _compare(tmp_path, baseline, latencies=latencies({"b31_p91": 1.10}))  # planted 10 % slowdown
    assert not regressed.ok
    (slow,) = regressed.slower
    assert slow.key == (WORKLOAD, "b31_p91", "triton") and slow.ratio == pytest.approx(1 / 1.1)

    failed = _compare(tmp_path, baseline, latencies=latencies(), failures={("b4_p36", "other"): Status.INCORRECT_NUMERICAL})
    assert not failed.ok and [c.key[1:] for c in failed.newly_failing] == [("b4_p36", "other")]

    noisy = _compare(
        tmp_path, baseline, latencies=latencies({"b31_p91": 1.10}), spreads={("b31_p91", "triton"): 0.3, ("b31_p91", "reference"): 0.3}
    )
    assert noisy.ok  # the same slowdown inside a run's recorded noise is not a regression

    partial = _compare(tmp_path, baseline, latencies={k: v for k, v in latencies().items() if k != "b1_p10"})
    assert partial.ok and len(partial.only_in_baseline) == 3


def test_compare_cli_exit_codes_and_formats(tmp_path, baseline):
    unchanged = write_results(tmp_path / "rerun.json", WORKLOAD, latencies(), hashes={"triton": "hash-triton"})
    proc = cli("compare", str(unchanged), "--baseline", str(baseline))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 12 cases compared" in proc.stdout

    slower = write_results(tmp_path / "slower.json", WORKLOAD, latencies({"b4_p36": 1.10}), hashes={"triton": "changed"})
    proc = cli("compare", str(slower), "--baseline", str(baseline), "--format", "markdown")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "### Speedup vs baseline (threshold 5.0%)" in proc.stdout
    assert re.search(r"\| indexer_h64 +\| b4_p36 +\| triton +\| slower ", proc.stdout), proc.stdout
    assert "-9.1%" in proc.stdout and "**REGRESSION: 1 case(s) slower" in proc.stdout

    failing = write_results(tmp_path / "failing.json", WORKLOAD, latencies(), failures={("b1_p10", "triton"): Status.RUNTIME_ERROR})
    proc = cli("compare", str(failing), "--baseline", str(baseline), "--threshold", "0.2")
    assert proc.returncode == 1 and "failed (new)" in proc.stdout

    for args, message in [
        ([str(unchanged), "--baseline", str(tmp_path / "none.json")], "baseline file does not exist"),
        (
            [str(write_results(tmp_path / "x.json", "other_workload", latencies())), "--baseline", str(baseline)],
            "the baseline has no workload 'other_workload'",
        ),
        ([str(baseline), "--baseline", str(baseline)], "not a dsa-bench results file"),
    ]:
        proc = cli("compare", *args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_baseline_update_file_format(tmp_path, baseline):
    document = json.loads(baseline.read_text())
    assert document["format"] == BASELINE_FORMAT and document["version"] == 1
    block = document["workloads"][WORKLOAD]
    assert block["environment"]["gpu"] == "NVIDIA H200" and block["timer"] == "cupti"
    assert block["solutions"]["triton"] == {"content_hash": "hash-triton"}
    entry = next(c for c in block["cases"] if (c["case"], c["solution"]) == ("b1_p10", "triton"))
    assert entry["status"] == "PASSED" and entry["speedup"] == pytest.approx(10.0)
    assert entry["latency_ms"] == pytest.approx(0.06) and entry["spread"] == pytest.approx(0.01)
    assert entry["reference_latency_ms"] == pytest.approx(0.6) and entry["reference_spread"] == pytest.approx(0.01)

    # another workload is added; re-running one replaces only its own entry
    other = write_results(tmp_path / "attn.json", "sparse_attention_h16", latencies())
    proc = cli("baseline", "update", str(other), "--baseline", str(baseline))
    assert proc.returncode == 0, proc.stderr
    assert sorted(load_baseline(baseline)["workloads"]) == ["indexer_h64", "sparse_attention_h16"]
    update_baseline(baseline, [write_results(tmp_path / "faster.json", WORKLOAD, latencies({"b1_p10": 0.5}))])
    block = load_baseline(baseline)["workloads"][WORKLOAD]
    assert next(c for c in block["cases"] if (c["case"], c["solution"]) == ("b1_p10", "triton"))["speedup"] == pytest.approx(20.0)

    incomplete = write_results(tmp_path / "partial.json", WORKLOAD, latencies())
    incomplete.write_text(incomplete.read_text().replace('"complete": true', '"complete": false'))
    with pytest.raises(DsaBenchError, match="incomplete"):
        update_baseline(baseline, [incomplete])


def test_untimed_results_compare_statuses_only_and_say_nothing_was_timed(tmp_path, baseline):
    path = tmp_path / "cpu.json"
    update_baseline(path, [write_results(tmp_path / "cpu-base.json", WORKLOAD, latencies(), timed=False)])
    comparison = _compare(tmp_path, path, latencies=latencies(), timed=False)
    assert comparison.nothing_timed and {c.verdict for c in comparison.cases} == {Verdict.UNTIMED}
    assert "NOTHING TIMED" in render_comparison(comparison) and "OK:" not in render_comparison(comparison)
    broken = _compare(tmp_path, path, latencies=latencies(), timed=False, failures={("b1_p10", "reference"): Status.TIMEOUT})
    assert not broken.ok
    # a CPU run against a GPU baseline: no speed was compared, so no OK and exit 2
    cpu_run = write_results(tmp_path / "cpu-run.json", WORKLOAD, latencies(), timed=False)
    proc = cli("compare", str(cpu_run), "--baseline", str(baseline))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "NOTHING TIMED" in proc.stdout and "the results hold no timing" in proc.stdout and "OK:" not in proc.stdout
    assert "Cases that changed" not in proc.stdout, "an untimed case with the same status is no change"


def test_skipped_and_unmatched_cases_are_one_line_per_solution(tmp_path, baseline):
    """A peer skipped on every case, or a solution the baseline lacks, is listed once, not case by case."""
    more = {case: {**per, "peer": per["reference"]} for case, per in latencies().items()}
    results = write_results(tmp_path / "skips.json", WORKLOAD, more, failures={(c, "other"): Status.SKIPPED for c in more})
    text = render_comparison(compare_results([load_results(results)], load_baseline(baseline)))
    assert "Skipped (a solution that cannot run where one side ran: nothing to compare):\n  indexer_h64 [other]: 4 case(s): " in text
    assert "Not in the baseline (4):\n  indexer_h64 [peer]: 4 case(s): b1_p10, b4_p36, b16_p40, ..." in text
    assert not re.search(r"indexer_h64 +b1_p10 +other +untimed", text), "no row per skipped case"


def test_changed_code_is_named_in_a_warning(tmp_path, baseline):
    comparison = _compare(tmp_path, baseline, latencies=latencies(), hashes={"triton": "0123456789abcdef"})
    assert f"{WORKLOAD}: solution 'triton' is not the baseline's code (content hash hash-triton there, 0123456789ab now)" in " ".join(
        comparison.warnings
    )


def test_solution_wide_slowdown_is_caught_through_a_noisy_reference(tmp_path):
    """The H200 reference's trials disagree by ~26 % (median), so each case's speedup band is wide.
    Across GPU models (only speedups compare) the geomean over many cases is not, and a uniform
    10 % slowdown must still fail; on the same GPU model the solution's own latency catches it
    case by case."""
    cases = [f"c{i:03d}" for i in range(96)]
    jitter = random.Random(0)

    def run(name: str, triton_scale: float, noise: float, gpu: str = "NVIDIA H200") -> Path:
        lat = {c: {"reference": 1.0 * (1 + jitter.uniform(-noise, noise)), "triton": 0.05 * triton_scale} for c in cases}
        spreads = {(c, "reference"): 0.26 for c in cases} | {(c, "triton"): 0.02 for c in cases}
        return write_results(tmp_path / name, WORKLOAD, lat, spreads=spreads, gpu=gpu)

    path = tmp_path / "noisy.json"
    update_baseline(path, [run("base.json", 1.0, 0.1, gpu="NVIDIA H100")])
    baseline = load_baseline(path)

    rerun = compare_results([load_results(run("rerun.json", 1.0, 0.1))], baseline)
    assert rerun.ok, render_comparison(rerun)  # per-case reference noise of ±10 % averages out

    slowed = compare_results([load_results(run("slowed.json", 1.10, 0.1))], baseline)
    triton = next(s for s in slowed.solutions if s.solution == "triton")
    assert triton.metric == "speedup"
    assert not slowed.slower  # no single case's change is outside its own band ...
    assert triton.verdict is Verdict.SLOWER and triton.band == pytest.approx(0.05)  # ... but the geomean's is
    assert not slowed.ok and "solutions slower overall: indexer_h64/triton" in render_comparison(slowed)

    same_gpu = tmp_path / "same_gpu.json"
    update_baseline(same_gpu, [run("base_h200.json", 1.0, 0.1)])
    slowed = compare_results([load_results(run("slowed_h200.json", 1.10, 0.1))], load_baseline(same_gpu))
    assert [c.key[2] for c in slowed.slower] == ["triton"] * len(cases)
    assert next(s for s in slowed.solutions if s.solution == "triton").metric == "latency"


def test_reference_drift_alone_is_not_a_regression_on_the_same_gpu():
    """The host-bound reference got 20 % faster on another machine: the speedup fell, the
    solution's own latency did not move, so on the same GPU model the case is 'same'."""
    base = CaseMeasure("PASSED", speedup=50.0, latency_ms=0.010, spread=0.01, reference_latency_ms=0.5, reference_spread=0.01)
    drifted = CaseMeasure("PASSED", speedup=40.0, latency_ms=0.010, spread=0.01, reference_latency_ms=0.4, reference_spread=0.01)
    key = (WORKLOAD, "b1", "triton")
    assert classify(key, base, drifted, 0.05, same_gpu=True).verdict is Verdict.SAME
    # Across GPU models only the ratio exists, and a 20 % drop in it is a regression.
    assert classify(key, base, drifted, 0.05, same_gpu=False).verdict is Verdict.SLOWER
    # A real slowdown moves both: still caught on the same GPU.
    slower = CaseMeasure("PASSED", speedup=40.0, latency_ms=0.0125, spread=0.01, reference_latency_ms=0.5, reference_spread=0.01)
    assert classify(key, base, slower, 0.05, same_gpu=True).verdict is Verdict.SLOWER


H200_SPREAD = FIXTURES / "results"


def test_recorded_h200_rerun_passes_and_a_planted_slowdown_fails(tmp_path):
    """Real data: two H200 runs of sparse_attention_h16 on different machines (the reference
    drifted by ~13 % between them); the rerun must pass against a baseline of the first, and
    the rerun with the triton solution made 10 % slower must fail."""
    baseline = tmp_path / "h200.json"
    update_baseline(baseline, [H200_SPREAD / "h200_spread_run1.json"])
    rerun = load_results(H200_SPREAD / "h200_spread_run2.json")
    assert compare_results([rerun], load_baseline(baseline)).ok
    doc = json.loads((H200_SPREAD / "h200_spread_run2.json").read_text())
    for record in doc["records"]:
        if record["solution"] == "triton":
            record["timing"]["samples_ms"] = [[x * 1.10 for x in trial] for trial in record["timing"]["samples_ms"]]
            record["timing"]["mean_ms"] *= 1.10
            record["speedup"] /= 1.10
    slowed = tmp_path / "slowed.json"
    slowed.write_text(json.dumps(doc))
    comparison = compare_results([load_results(slowed)], load_baseline(baseline))
    assert not comparison.ok
    assert [s.solution for s in comparison.slower_solutions] == ["triton"]


def test_l2_flush_mismatch_is_a_warning(tmp_path):
    """Latencies after a dirty flush also pay the flush's write-backs: comparing across flush modes
    says so. Files from before the modes existed were all flushed dirty."""
    path = tmp_path / "flush-base.json"
    update_baseline(path, [write_results(tmp_path / "base.json", WORKLOAD, latencies(), l2_flush="dirty")])
    assert load_baseline(path)["workloads"][WORKLOAD]["l2_flush"] == "dirty"
    clean = _compare(tmp_path, path, latencies=latencies(), l2_flush="clean")
    assert any("baseline L2 flush 'dirty', results L2 flush 'clean'" in w for w in clean.warnings), clean.warnings
    legacy = _compare(tmp_path, path, name="legacy.json", latencies=latencies(), l2_flush=None)
    assert not any("L2 flush" in w for w in legacy.warnings), legacy.warnings
    assert load_results(write_results(tmp_path / "cpu.json", WORKLOAD, latencies(), timed=False, l2_flush=None)).l2_flush is None


def test_launch_mode_mismatch_is_a_warning(tmp_path):
    """CUDA-graph replays (run --cuda-graph) leave out the launch gaps eager calls pay for: comparing
    across launch modes says so. Results and baselines from before the mode existed timed eager calls."""
    path = tmp_path / "launch-base.json"
    update_baseline(path, [write_results(tmp_path / "base.json", WORKLOAD, latencies(), launch="eager")])
    assert load_baseline(path)["workloads"][WORKLOAD]["launch"] == "eager"
    graph = _compare(tmp_path, path, latencies=latencies(), launch="cuda_graph")
    assert any("baseline launch 'eager', results launch 'cuda_graph'" in w for w in graph.warnings), graph.warnings
    legacy = _compare(tmp_path, path, name="legacy.json", latencies=latencies())  # no launch field: eager
    assert not any("launch" in w for w in legacy.warnings), legacy.warnings
    document = json.loads(path.read_text())  # a baseline block from before the field: eager
    del document["workloads"][WORKLOAD]["launch"]
    path.write_text(json.dumps(document))
    assert not any("launch" in w for w in _compare(tmp_path, path, name="again.json", latencies=latencies()).warnings)
    assert any("launch" in w for w in _compare(tmp_path, path, name="graph2.json", latencies=latencies(), launch="cuda_graph").warnings)


def test_results_header_records_the_launch_mode(tmp_path):
    """The header's launch field round-trips; a file without it reads as eager when timed, None when untimed."""
    graph = load_results(write_results(tmp_path / "graph.json", WORKLOAD, latencies(), launch="cuda_graph"))
    assert graph.launch == "cuda_graph" and json.loads(graph.path.read_text())["launch"] == "cuda_graph"
    older = write_results(tmp_path / "older.json", WORKLOAD, latencies())
    document = json.loads(older.read_text())
    del document["launch"]  # as a file from before run --cuda-graph holds it
    older.write_text(json.dumps(document))
    assert load_results(older).launch == "eager"
    untimed = write_results(tmp_path / "cpu.json", WORKLOAD, latencies(), timed=False)
    assert "launch" not in json.loads(untimed.read_text()) and load_results(untimed).launch is None
    bad = document | {"launch": "lazy"}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(DsaBenchError, match="launch"):
        load_results(tmp_path / "bad.json")


def _with_tolerance(path: Path, **tolerance: float) -> Path:
    document = json.loads(path.read_text())
    document["settings"]["tolerance"] = {"atol": 0.01, "rtol": 0.01, "lse_atol": 0.00025, "score_rtol": 0.0001, **tolerance}
    path.write_text(json.dumps(document))
    return path


def test_a_tolerance_mismatch_is_a_warning(tmp_path):
    """Results judged with other tolerances (run --atol ...) than the baseline's say so, as other settings do."""
    path = tmp_path / "tol-base.json"
    update_baseline(path, [_with_tolerance(write_results(tmp_path / "base.json", WORKLOAD, latencies()))])
    same = _with_tolerance(write_results(tmp_path / "same.json", WORKLOAD, latencies()))
    assert not any("tolerance" in w for w in compare_results([load_results(same)], load_baseline(path)).warnings)
    loose = _with_tolerance(write_results(tmp_path / "loose.json", WORKLOAD, latencies()), atol=0.05, score_rtol=0.001)
    comparison = compare_results([load_results(loose)], load_baseline(path))
    assert [w for w in comparison.warnings if "tolerance" in w] == [  # atol cannot change an indexer status: no warning
        f"{WORKLOAD}: tolerance score_rtol was 0.0001 in the baseline, 0.001 now; statuses are judged differently "
        "(run --atol/--rtol/--lse-atol/--score-rtol set them)",
    ]
    assert "warning: indexer_h64: tolerance score_rtol was 0.0001 in the baseline" in render_comparison(comparison)

    from dsa_bench.results.report import _environment_rows

    rows = dict(_environment_rows(load_results(loose)))
    assert rows["setting: tolerance"] == "atol=0.05, rtol=0.01, lse_atol=0.00025, score_rtol=0.001"
