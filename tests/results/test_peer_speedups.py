"""Speedups over the best peer of the same run (issue 22, part 3): assigned per case, shown by run, compare and report."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, ROOT, cli
from synthetic_results import timing, write_results

from dsa_bench.definitions.status import Status
from dsa_bench.results.baseline import load_baseline, update_baseline
from dsa_bench.results.compare import compare_results, render_comparison
from dsa_bench.results.records import CaseRecord, load_results
from dsa_bench.results.report import build_figures, write_report
from dsa_bench.results.tables import records_table, summarize, summary_table
from dsa_bench.run.runner import assign_peer_speedups

PEERS = ("deepgemm_sglang", "deepgemm_flashinfer")
#: per case, ms: triton beats both peers on the first case, loses to deepgemm_sglang on the second
LATENCIES = {
    "b1_p33": {"reference": 3.0, "triton": 0.008, "deepgemm_sglang": 0.010, "deepgemm_flashinfer": 0.012},
    "b31_p91": {"reference": 9.0, "triton": 0.018, "deepgemm_sglang": 0.016, "deepgemm_flashinfer": 0.020},
}


def _record(solution: str, ms: float | None, status: Status = Status.PASSED) -> CaseRecord:
    record = CaseRecord(case="c", solution=solution, axes={}, status=status)
    record.timing = timing(ms, 0.0) if ms is not None and status is Status.PASSED else None
    return record


def test_the_fastest_passing_peer_is_the_comparison():
    records = [_record("reference", 3.0), _record("triton", 0.008), _record("sglang", 0.010), _record("flashinfer", 0.004, Status.TIMEOUT),
               _record("other", 0.012)]  # fmt: skip
    assign_peer_speedups(records, {"sglang", "flashinfer", "other"}, None)
    by_name = {r.solution: r for r in records}
    assert {r.peer for r in records} == {"sglang"}, "a failed peer is never the comparison, however fast it claims to be"
    assert by_name["triton"].peer_speedup == pytest.approx(1.25)
    assert by_name["sglang"].peer_speedup == pytest.approx(1.0) and by_name["other"].peer_speedup == pytest.approx(10 / 12)
    assert by_name["flashinfer"].peer_speedup is None and by_name["reference"].peer_speedup == pytest.approx(0.010 / 3.0)


def test_speedup_over_names_the_comparison_and_no_timed_peer_means_none():
    records = [_record("reference", 3.0), _record("triton", 0.008), _record("sglang", 0.010)]
    assign_peer_speedups(records, {"sglang"}, "reference")
    assert [r.peer_speedup for r in records] == pytest.approx([1.0, 375.0, 300.0]) and {r.peer for r in records} == {"reference"}
    untimed = [_record("reference", None), _record("triton", None), _record("sglang", None, Status.SKIPPED)]
    assign_peer_speedups(untimed, {"sglang"}, None)
    assert all(r.peer is None and r.peer_speedup is None for r in untimed)


def test_run_tables_show_both_speedups(tmp_path):
    results = load_results(write_results(tmp_path / "r.json", "indexer_h64", LATENCIES, peers=PEERS))
    table = records_table(results.records, ("batch_size",))
    assert "vs peer" in table.splitlines()[0]
    line = next(row for row in table.splitlines() if row.startswith("b31_p91") and " triton " in row)
    assert "500.00x" in line and "0.89x" in line and "deepgemm_sglang" in line  # 9 / 0.018 and 0.016 / 0.018
    triton = summarize(results.records, "triton")
    assert triton.mean_peer_speedup == pytest.approx((1.25 + 0.016 / 0.018) / 2)
    summary = summary_table(results.records)
    assert "mean vs peer" in summary and "geomean vs peer" in summary


def test_files_without_peer_speedups_still_load_and_show_one_speedup(tmp_path):
    old = load_results(FIXTURES / "results" / "h200_spread_run1.json")  # written before peer speedups
    assert old.records and all(r.peer is None and r.peer_speedup is None for r in old.records)
    assert "vs peer" not in summary_table(old.records) and "vs peer" not in records_table(old.records, ())
    baseline = load_baseline(ROOT / "baselines" / "h200.json")  # a stored baseline without peer fields
    assert baseline["workloads"]


def test_compare_and_report_show_the_speedup_over_the_peer(tmp_path):
    base = tmp_path / "baseline.json"
    update_baseline(base, [write_results(tmp_path / "old.json", "indexer_h64", LATENCIES)])  # a baseline from before peers
    new = write_results(tmp_path / "new.json", "indexer_h64", LATENCIES, peers=PEERS)
    comparison = compare_results([load_results(new)], load_baseline(base))
    assert comparison.ok, "peer speedups are shown, never judged"
    text = render_comparison(comparison, "table", show_all=True)
    assert "vs peer, now" in text and "0.89x (deepgemm_sglang)" in text
    proc = cli("compare", str(new), "--baseline", str(base), "--all")
    assert proc.returncode == 0 and "vs peer, baseline" in proc.stdout

    figures = {f.name: f for f in build_figures([load_results(new)])}
    assert "indexer_h64-peer-speedup" in figures
    page, pngs = write_report([new], tmp_path / "report.html")
    html = page.read_text()
    assert "geomean vs peer" in html and "triton vs peer" in html and "1.25x (deepgemm_sglang)" in html
    assert any(p.name.endswith("peer-speedup.png") for p in pngs)


def test_speedup_over_must_name_a_solution_of_the_run():
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "--speedup-over", "triton", "--no-save")
    assert proc.returncode == 2
    assert "--speedup-over 'triton' is not a solution of this run (it runs reference)" in proc.stderr
