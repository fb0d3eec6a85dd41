"""The roofline of a timed record (docs/roofline.md): each definition's useful FLOPs, the peak table,
placing a latency, and where the figures show (results JSON, tables, compare, export extras, report);
and the host wall time per timed call with the timer fallback beside it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from typer.testing import CliRunner

from dsa_bench.cli import app
from dsa_bench.definitions import all_definitions, builtin_definitions, indexer, mla_decode
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import MATH_PRECISIONS
from dsa_bench.definitions.kv_records import V4, V32, V41
from dsa_bench.definitions.status import Status
from dsa_bench.results.records import CaseRecord, ResultsFile, ResultsHeader, Timing, load_results
from dsa_bench.results.roofline import (
    HOST_EXCESS,
    device_peak,
    floor_ms,
    headroom,
    headroom_table,
    place,
    roofline_markdown,
    roofline_table,
    summarize_roofline,
)
from dsa_bench.results.tables import record_line, records_table
from dsa_bench.workloads import build_inputs, load_workload

CPU = torch.device("cpu")
H200_COPY = 4.24e12  # bytes/s, the copy bandwidth measured on the project's H200


# --------------------------------------------------------------------------- useful FLOPs


def test_indexer_flops_count_scored_rows_only():
    """2·64·128·L per row with L > 2048; passthrough rows (L <= 2048) are not scored: 0."""
    inputs = {"seq_lens": torch.tensor([100, 3000, 2048, 2049, 0], dtype=torch.int32)}
    assert indexer.useful_flops({}, inputs) == 2 * 64 * 128 * (3000 + 2049)
    assert indexer.useful_flops({}, {"seq_lens": torch.tensor([2048, 1], dtype=torch.int32)}) == 0


def test_attention_flops_count_valid_indices():
    """2·16·((512 + 64) + 512) per valid index; -1 padding needs no math."""
    indices = torch.tensor([[0, 5, -1, 7], [-1, -1, -1, -1]], dtype=torch.int32)
    assert attn.useful_flops({}, {"sparse_indices": indices}) == 2 * 16 * 1088 * 3


def test_decode_flops_count_counted_entries():
    """2·h_q·(d_qk + 512) per counted entry: >= 0 and left of topk_length (V4)."""
    v4 = all_definitions()["dsa_mla_decode_v4_fp8"]
    indices = torch.tensor([[[0, 1, -1, 3], [4, 5, 6, 7]]], dtype=torch.int32)  # b 1, s_q 2, topk 4
    inputs = {"indices": indices, "topk_length": torch.tensor([3], dtype=torch.int32)}
    assert v4.useful_flops({"h_q": 2}, inputs) == 2 * 2 * (512 + 512) * (2 + 3)
    v32 = all_definitions()["dsa_mla_decode_v32_fp8"]
    assert v32.useful_flops({"h_q": 2}, {"indices": indices}) == 2 * 2 * (V32.d_qk + 512) * 7


def test_every_definition_declares_its_work():
    """Every shipped definition has a byte floor and a FLOP count; math runs in a known precision
    (bf16 for attention and decode, whose MMAs take bf16; fp8 for the indexer), none for kv_insert."""
    expected = {"dsa_topk_indexer": "fp8", "dsa_sparse_attention": "bf16", "dsa_mla_decode": "bf16", "dsa_kv_insert": None,
                "dsa_decode_step": "bf16"}  # the step counts its FP8 scores as bf16 equivalents
    for name, definition in builtin_definitions().items():  # not a dataset's, which another test may have registered
        assert definition.min_traffic_bytes is not None and definition.useful_flops is not None, name
        assert definition.math_precision in (*MATH_PRECISIONS, None)
        family = next(prefix for prefix in expected if name.startswith(prefix))
        assert definition.math_precision == expected[family], name


def test_kv_insert_does_no_math_on_generated_inputs():
    workload = load_workload(ROOT / "workloads" / "kv_insert_v32_smoke.yaml")
    case = workload.cases[0]
    inputs = build_inputs(workload.definition, case, 7, CPU)
    axes = workload.definition.axes(case.axes)
    assert workload.definition.useful_flops(axes, inputs) == 0
    assert workload.definition.min_traffic_bytes(axes, inputs) > 0


# --------------------------------------------------------------------------- peaks and placing


@pytest.mark.parametrize(
    ("name", "model", "bf16", "fp8"),
    [
        ("NVIDIA H200", "H200 SXM", 989.4, 1978.9),
        ("NVIDIA H200 NVL", "H200 NVL", 835.5, 1670.5),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4, 1978.9),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 1513.0),
        ("NVIDIA H20", "H20", 148.0, 296.0),
        ("NVIDIA H800", "H800 SXM", 989.4, 1978.9),
        ("NVIDIA B200", "B200", 2250.0, 4500.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0, None),
    ],
)
def test_peak_table_by_gpu_model(name, model, bf16, fp8):
    peak = device_peak(name)
    assert peak is not None and (peak.model, peak.tflops("bf16"), peak.tflops("fp8")) == (model, bf16, fp8)
    assert peak.source.startswith("NVIDIA")


def test_unknown_gpu_has_no_peak():
    assert device_peak("NVIDIA GeForce RTX 4090") is None and device_peak(None) is None


def test_place_takes_the_nearer_bound():
    h200 = device_peak("NVIDIA H200")
    # 10 µs moving half of what the copy bandwidth moves in that time, and 80 % of the dense bf16 peak's FLOPs
    r = place(10e-6, H200_COPY * 5e-6, 989.4e12 * 8e-6, "bf16", H200_COPY, h200)
    assert r.bound == "compute" and r.fraction_of_roofline == pytest.approx(0.8)
    assert r.bandwidth_fraction == pytest.approx(0.5) and r.achieved_tflops == pytest.approx(791.52)
    # the same bytes, little math: memory is nearer
    r = place(10e-6, H200_COPY * 5e-6, 1e9, "fp8", H200_COPY, h200)
    assert r.bound == "memory" and r.fraction_of_roofline == pytest.approx(0.5)
    assert r.compute_fraction == pytest.approx(1e9 / 10e-6 / 1978.9e12)


def test_place_without_math_or_peak_uses_the_bandwidth_alone():
    r = place(1e-6, 1e6, 0.0, None, 2e12, device_peak("NVIDIA H200"))
    assert (r.bound, r.compute_fraction, r.peak_tflops) == ("memory", None, None) and "memory only" in r.peak_source
    r = place(1e-6, 1e6, 1e9, "bf16", 2e12, None, "NVIDIA RTX 4090")
    assert r.compute_fraction is None and r.fraction_of_roofline == pytest.approx(0.5) and "RTX 4090" in r.peak_source
    r = place(1e-6, 1e6, 1e9, "fp8", 2e12, device_peak("NVIDIA A100-SXM4-80GB"))
    assert r.compute_fraction is None and "no fp8 tensor cores" in r.peak_source


# --------------------------------------------------------------------------- the runner's part


def test_the_runner_places_a_timed_record_with_the_work_of_its_timed_calls(monkeypatch):
    """The work is averaged over the timed calls' input sets; the peak is that of the device's GPU."""
    from dsa_bench.run import runner
    from dsa_bench.run.case_context import CaseContext, trial_seeds
    from dsa_bench.run.protocol import TimingJob

    workload = load_workload(ROOT / "workloads" / "indexer_smoke.yaml")
    case = next(c for c in workload.cases if c.id == "smoke_scored")
    settings = workload.settings.replace(trials=2, iterations=3, input_sets=2)
    job = TimingJob(case, trial_seeds(settings, case), warmup=1, iterations=3, sample_seed=5)
    ctx = CaseContext(workload, case, CPU, settings.tolerance)
    calls = [s[i % 2] for s in job.trial_seeds for i in range(3)]
    axes = workload.definition.axes(case.axes)
    work = {s: build_inputs(workload.definition, case, s, CPU) for s in set(calls)}
    want_bytes = sum(indexer.min_traffic_bytes(axes, work[s]) for s in calls) / len(calls)
    want_flops = sum(indexer.useful_flops(axes, work[s]) for s in calls) / len(calls)
    assert want_flops > 0

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    options = runner.RunOptions(device=torch.device("cuda", 0), settings=settings, timer="cupti", l2_flush="clean",
                                copy_bytes_per_s=H200_COPY)  # fmt: skip
    timing = Timing(timer="cupti", samples_ms=[[0.01] * 3, [0.01] * 3])
    r = runner.roofline_of(timing, ctx, job, options)
    assert r is not None and r.min_bytes == pytest.approx(want_bytes) and r.flops == pytest.approx(want_flops)
    assert r.math_precision == "fp8" and r.peak_tflops == 1978.9
    assert r.achieved_bandwidth == pytest.approx(want_bytes / 1e-5)
    # no measured bandwidth (a CPU run): no roofline
    assert runner.roofline_of(timing, ctx, job, runner.RunOptions(CPU, settings, None, "clean")) is None


# --------------------------------------------------------------------------- records, tables, compare, export, report


def placed_record(case: str, solution: str, mean_ms: float, host_ms: float | None, fraction: float,
                  fallback: str | None = None) -> CaseRecord:  # fmt: skip
    timing = Timing(timer="cuda_events" if fallback else "cupti", samples_ms=[[mean_ms] * 3, [mean_ms] * 3],
                    host_samples_ms=[[host_ms] * 3, [host_ms] * 3] if host_ms else [], timer_fallback=fallback)  # fmt: skip
    roofline = place(mean_ms / 1e3, fraction * H200_COPY * mean_ms / 1e3, 0.0, None, H200_COPY, device_peak("NVIDIA H200"))
    return CaseRecord(case=case, solution=solution, axes={"batch_size": 1, "max_num_pages": 4}, status=Status.PASSED,
                      timing=timing, roofline=roofline, speedup=1.0)  # fmt: skip


def write_placed(path: Path, records: list[CaseRecord], workload: str = "wl") -> Path:
    header = {
        "workload": {"name": workload, "path": f"workloads/{workload}.yaml", "trace": "t.jsonl", "definition": indexer.NAME},
        "settings": {"seed": 1, "input_sets": 2, "warmup": 1, "iterations": 3, "trials": 2},
        "timer": "cupti", "l2_flush": "clean", "environment": {"gpu": "NVIDIA H200", "device": "cuda:0", "copy_gbps": 4240.0},
        "solutions": {r.solution: {"path": f"solutions/{r.solution}", "content_hash": "abc"} for r in records},
    }  # fmt: skip
    results = ResultsFile(path, ResultsHeader.model_validate(header))
    for record in records:
        results.add(record)
    results.update(complete=True)
    return path


def test_records_round_trip_through_the_results_file(tmp_path):
    record = placed_record("c1", "triton", 0.010, 0.025, 0.79)
    loaded = load_results(write_placed(tmp_path / "r.json", [record]))
    back = loaded.records[0]
    assert back.roofline == record.roofline and back.timing is not None
    assert back.timing.host_samples_ms == record.timing.host_samples_ms and back.timing.host_mean_ms == pytest.approx(0.025)
    data = json.loads((tmp_path / "r.json").read_text())["records"][0]
    assert data["roofline"]["fraction_of_roofline"] == pytest.approx(0.79) and data["roofline"]["bound"] == "memory"
    assert data["timing"]["host_mean_ms"] == pytest.approx(0.025)


def test_a_record_without_roofline_keeps_its_old_shape():
    record = CaseRecord(case="c", solution="s", axes={}, status=Status.PASSED, timing=Timing(timer="cupti", samples_ms=[[1.0]]))
    data = record.model_dump()
    assert "roofline" not in data and "host_samples_ms" not in data["timing"] and "timer_fallback" not in data["timing"]


def test_tables_show_the_roofline_and_the_host_time_only_where_it_exceeds_the_kernel_span():
    records = [placed_record("c1", "triton", 0.010, 0.0115, 0.79), placed_record("c2", "triton", 0.010, 0.030, 0.40)]
    table = records_table(records, ("batch_size",))
    assert "of roofline" in table and "79.0% mem" in table and "40.0% mem" in table
    assert "host µs (> kernel +20%)" in table and "30.0 (+200%)" in table and "11.5" not in table
    line = record_line(records[1], 2, 2)
    assert "40.0% mem of roofline" in line and "host 30.0 µs (+200%)" in line
    assert "host" not in record_line(records[0], 1, 2)
    summary = summarize_roofline(records, "triton")
    assert summary.mean_fraction == pytest.approx(0.595) and (summary.host_bound, summary.host_timed) == (1, 2)
    assert summary.timer == "cupti" and summary.timer_fallback is None
    assert HOST_EXCESS == 0.20


def test_the_floor_is_the_slower_bound_and_a_target_under_it_is_out_of_reach():
    # 10 µs calls at 50 % of the copy bandwidth: a 5 µs memory floor
    memory = placed_record("c1", "triton", 0.010, None, 0.5)
    assert floor_ms(memory.roofline) == pytest.approx(0.005)
    h200 = device_peak("NVIDIA H200")
    compute = place(10e-6, H200_COPY * 1e-6, 989.4e12 * 8e-6, "bf16", H200_COPY, h200)  # 8 µs of math, 1 µs of bytes
    assert floor_ms(compute) == pytest.approx(0.008)
    fast, slow, near = (placed_record(c, "triton", 0.010, None, 0.5) for c in ("fast", "slow", "near"))
    fast.peer, fast.peer_speedup = "peer", 1.5  # the peer takes 15 µs: 12 µs for 1.25x, met at 10
    slow.peer, slow.peer_speedup = "peer", 0.9  # 9 µs: 1.25x needs 7.2 µs, above the 5 µs floor
    near.peer, near.peer_speedup = "peer", 0.6  # 6 µs: 1.25x needs 4.8 µs, under the floor
    alone = placed_record("alone", "triton", 0.010, None, 0.5)  # no peer in the run
    rows = {h.case: h for h in headroom([fast, slow, near, alone], 1.25)}
    assert [rows[c].verdict for c in ("fast", "slow", "near", "alone")] == ["met", "open", "below the floor", "-"]
    assert rows["slow"].target_ms == pytest.approx(0.0072) and rows["near"].peer_ms == pytest.approx(0.006)
    table = headroom_table([fast, slow, near, alone], 1.25)
    assert "over 3 records with a peer: 1 met, 1 open, 1 below the floor" in table
    assert "4.8 (0.96x)" in table and "verdict" not in headroom_table([fast], None)
    failed = placed_record("failed", "triton", 0.010, None, 0.5)
    failed.status = Status.INCORRECT_NUMERICAL
    assert headroom([failed], 1.25) == [] and "no passed record" in headroom_table([failed], 1.25)


def test_results_headroom_judges_the_indexer_target_on_the_recorded_h100_run():
    record = ROOT / "benchmarks" / "h100" / "indexer_long.json"
    result = CliRunner().invoke(app, ["results", "headroom", str(record), "-s", "triton", "-c", "b*", "--target", "1.25"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.startswith(("b1_", "b64_l128k", "b128_l32k"))}
    assert rows["b64_l128k"].endswith("below the floor") and rows["b128_l32k"].endswith("below the floor")
    assert rows["b1_l128k"].endswith("met") and "deepgemm_flashinfer" in rows["b1_l128k"]


def test_a_timer_fallback_is_stated_in_the_summary():
    records = [placed_record("c1", "triton", 0.010, None, 0.5, fallback="CUPTI is unavailable (no module)")]
    table = roofline_table(records)
    assert "cuda_events (FALLBACK)" in table and "timer FALLBACK: CUPTI is unavailable (no module)" in table
    assert "FALLBACK" not in roofline_table([placed_record("c1", "triton", 0.010, None, 0.5)])
    assert roofline_table([CaseRecord(case="c", solution="s", axes={}, status=Status.PASSED)]) == ""


def test_compare_markdown_adds_the_roofline_of_the_new_results(tmp_path):
    from synthetic_results import write_results

    records = [placed_record("c1", "reference", 0.5, None, 0.01), placed_record("c1", "triton", 0.010, 0.03, 0.79)]
    results = write_placed(tmp_path / "r.json", records)
    baseline_source = write_results(tmp_path / "b.json", "wl", {"c1": {"reference": 0.5, "triton": 0.010}})
    baseline = tmp_path / "baseline.json"
    runner = CliRunner()
    assert runner.invoke(app, ["baseline", "update", str(baseline_source), "--baseline", str(baseline)]).exit_code == 0
    out = runner.invoke(app, ["compare", str(results), "--baseline", str(baseline), "--format", "markdown"])
    assert out.exit_code == 0, out.output
    assert "### Roofline: wl on NVIDIA H200" in out.output and "| triton" in out.output and "79.0%" in out.output
    plain = runner.invoke(app, ["compare", str(results), "--baseline", str(baseline)])
    assert "Roofline" not in plain.output
    assert roofline_markdown([load_results(results)]).count("### Roofline") == 1


def test_export_puts_the_roofline_in_correctness_extras(tmp_path):
    from dsa_bench.flashinfer_bench.traces import _log, _timing_extras

    record = placed_record("c1", "triton", 0.010, 0.03, 0.79, fallback="CUPTI is unavailable (x)")
    extras = _timing_extras(record)
    assert extras["dsa_bench_roofline"]["fraction_of_roofline"] == pytest.approx(0.79)
    assert extras["dsa_bench_host_latency_ms"] == pytest.approx(0.03) and extras["dsa_bench_timer"] == "cuda_events"
    assert extras["dsa_bench_timer_fallback"] == "CUPTI is unavailable (x)"
    untimed_host = Timing(timer="cupti", samples_ms=[[1.0]])
    assert _timing_extras(CaseRecord(case="c", solution="s", axes={}, status=Status.PASSED, timing=untimed_host)) == {}
    log = _log(load_results(write_placed(tmp_path / "r.json", [record])), record, "PASSED", [])
    assert "roofline: 79.0% of the memory bound" in log and "host wall time per call: 0.03 ms" in log and "timer fallback" in log


def test_report_plots_the_fraction_of_the_roofline(tmp_path):
    from dsa_bench.results.report import write_report

    records = [placed_record("c1", "reference", 0.5, None, 0.01), placed_record("c1", "triton", 0.010, None, 0.79),
               placed_record("c2", "triton", 0.012, None, 0.70)]  # fmt: skip
    page, pngs = write_report([write_placed(tmp_path / "r.json", records)], tmp_path / "rep.html")
    assert (tmp_path / "rep-wl-roofline.png").read_bytes().startswith(b"\x89PNG")
    assert tmp_path / "rep-wl-roofline.png" in pngs
    assert "Roofline and timer" in page.read_text()


# --------------------------------------------------------------------------- host wall time per timed call


def test_the_worker_records_the_host_time_of_each_timed_call_without_the_flush():
    """Host times cover the call (and its synchronisation), not the flush and re-poisoning before it."""
    from dsa_bench.run.case_context import CaseContext, decode_timing, trial_seeds
    from dsa_bench.run.protocol import TimingJob, parse_reply
    from dsa_bench.run.worker import _CaseRunner
    from dsa_bench.timing.base import Timer

    class FixedSpan(Timer):  # stands in for CUPTI: a kernel span that does not see the host
        name = "cupti"

        def time_iterations(self, call, count, prepare, after):
            for i in range(count):
                prepare(i)
                call(i)
                after(i)
            return [0.001] * count

    def slow_host(q, k, w, s, bt, out):  # outputs are not judged here: only the times
        time.sleep(0.004)
        out.fill_(-1)

    workload = load_workload(ROOT / "workloads" / "indexer_smoke.yaml")
    case = next(c for c in workload.cases if c.id == "smoke_scored")
    settings = workload.settings.replace(trials=2, iterations=3, input_sets=2)
    job = TimingJob(case, trial_seeds(settings, case), warmup=1, iterations=3, sample_seed=3)
    header, blob = _CaseRunner(indexer.DEFINITION, CPU, slow_host, dps=True).time(
        job, FixedSpan().time_iterations, lambda: time.sleep(0.1), lambda: None, "cupti"
    )
    ctx = CaseContext(workload, case, CPU, settings.tolerance)
    result = decode_timing(parse_reply({**header, "notes": ""}, ("timing",)), blob, ctx, job)
    assert [len(s) for s in result.host_samples_ms] == [3, 3]
    assert all(4.0 <= x < 80.0 for s in result.host_samples_ms for x in s), result.host_samples_ms  # the call, not the 100 ms flush


def test_host_times_that_do_not_match_the_calls_are_refused():
    from dsa_bench.run.case_context import CaseContext, decode_timing, trial_seeds
    from dsa_bench.run.protocol import ProtocolError, TimingJob, parse_reply
    from dsa_bench.run.worker import _CaseRunner
    from dsa_bench.timing.events import HostClockTimer

    def honest(q, k, w, s, bt, out):
        out.copy_(indexer.reference(q, k, w, s, bt)["topk_indices"])

    workload = load_workload(ROOT / "workloads" / "indexer_smoke.yaml")
    case = next(c for c in workload.cases if c.id == "smoke_scored")
    settings = workload.settings.replace(trials=1, iterations=2, input_sets=2)
    job = TimingJob(case, trial_seeds(settings, case), warmup=1, iterations=2, sample_seed=3)
    timer = HostClockTimer()
    header, blob = _CaseRunner(indexer.DEFINITION, CPU, honest, dps=True).time(job, timer.time_iterations, lambda: None, lambda: None,
                                                                                 timer.name)  # fmt: skip
    ctx = CaseContext(workload, case, CPU, settings.tolerance)
    for bad, message in (([[1.0]], "host times per trial"), ([[1.0, float("nan")]], "not a positive finite time")):
        with pytest.raises(ProtocolError, match=message):
            decode_timing(parse_reply({**header, "host_samples_ms": bad, "notes": ""}, ("timing",)), blob, ctx, job)


def test_mla_decode_format_table_is_consistent():
    """The FLOP count uses each format's own d_qk (V3.2 512 + 64 RoPE dims, V4/V4.1 512)."""
    assert {mla_decode.FORMAT_OF[d.name].d_qk for d in mla_decode.DEFINITIONS} == {V32.d_qk, V4.d_qk}
    assert V32.d_qk == 512 + 64 and V4.d_qk == V41.d_qk == 512


def test_a_run_that_falls_back_from_cupti_records_why(monkeypatch, tmp_path):
    """plan_run keeps choose_timer's fallback reason for every record (RunOptions.timer_fallback)."""
    from dsa_bench.run import plan
    from dsa_bench.run.request import RunRequest

    reason = "CUPTI is unavailable (the cupti-python module does not load); timing with CUDA events instead"
    monkeypatch.setattr(plan, "pick_devices", lambda name, count: [torch.device("cuda", 0)])
    monkeypatch.setattr(plan, "choose_timer", lambda requested, device: ("events", reason))
    monkeypatch.setattr(plan, "measure_copy_bandwidth", lambda device: H200_COPY)
    request = RunRequest(workload="indexer_smoke", solutions=["reference"], no_save=True)
    planned = plan.plan_run(request, ROOT)
    assert planned.options.timer == "events" and planned.options.timer_fallback == reason
    assert all(o.timer_fallback == reason for o in planned.device_options)
    assert reason in planned.warnings
    monkeypatch.setattr(plan, "choose_timer", lambda requested, device: ("cupti", None))
    assert plan.plan_run(request, ROOT).options.timer_fallback is None


@pytest.mark.gpu
def test_a_gpu_run_places_every_timed_record_and_times_the_host(tmp_path):
    """On a GPU: every passed timed record has a roofline within the physical bounds and host times
    of every timed call, at least the CUPTI kernel span (the host window holds the span)."""
    import subprocess
    import sys

    save = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "dsa_bench", "run", "-w", "sparse_attention_smoke", "-s", "triton", "--save", str(save)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "of roofline" in proc.stdout and "mean of roofline" in proc.stdout
    results = load_results(save)
    timed = [r for r in results.records if r.timing is not None]
    assert timed and all(r.roofline is not None for r in timed)
    for r in timed:
        assert 0 < r.roofline.fraction_of_roofline < 2.0 and r.roofline.math_precision == "bf16"
        assert [len(s) for s in r.timing.host_samples_ms] == [len(s) for s in r.timing.samples_ms]
        if r.timing.timer == "cupti":
            assert r.timing.host_mean_ms >= 0.95 * r.timing.mean_ms, (r.case, r.solution, r.timing.host_mean_ms, r.timing.mean_ms)
