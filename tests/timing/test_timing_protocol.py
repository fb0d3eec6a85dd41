"""The timing protocol's logic, exercised on the CPU with a host-clock timer standing in for the GPU one.

Rotation, redrawn queries, re-poisoned outputs and the check of a sampled timed call are all
harness code; only the clock differs on a GPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import ROOT

from dsa_bench.definitions import indexer
from dsa_bench.run.case_context import CaseContext, decode_timing, trial_seeds
from dsa_bench.run.protocol import TimingJob, parse_reply
from dsa_bench.run.worker import GraphCaptureFailed, GraphMode, _CaseRunner
from dsa_bench.timing.events import HostClockTimer
from dsa_bench.workloads import load_workload

CPU = torch.device("cpu")


class NoFlush:
    calls = 0

    def flush(self) -> None:
        NoFlush.calls += 1


def reference_kernel(q, k, w, s, bt, out):
    out.copy_(indexer.reference(q, k, w, s, bt)["topk_indices"])


def time_with(fn, trials: int = 2, iterations: int = 6, graph: GraphMode | None = None):
    workload = load_workload(ROOT / "workloads" / "indexer_smoke.yaml")
    case = next(c for c in workload.cases if c.id == "smoke_scored")
    settings = workload.settings.replace(trials=trials, iterations=iterations, input_sets=2)
    job = TimingJob(case, trial_seeds(settings, case), warmup=2, iterations=iterations, sample_seed=11)
    runner = _CaseRunner(indexer.DEFINITION, CPU, fn, dps=True)
    timer = HostClockTimer()
    header, blob = runner.time(job, timer.time_iterations, NoFlush().flush, lambda: None, timer.name, None, graph)
    # through the same validation and decoding as a reply from a worker process
    ctx = CaseContext(workload, case, CPU, settings.tolerance)
    result = decode_timing(parse_reply({**header, "notes": ""}, ("timing",)), blob, ctx, job)
    checks = [ctx.check(c.seed, c.outputs, c.redrawn_inputs) for c in result.checked]
    return result, checks


def test_protocol_shapes_and_sampled_calls_pass_for_an_honest_solution():
    before = NoFlush.calls
    result, checks = time_with(reference_kernel)
    assert result.timer == "host_clock"
    assert [len(s) for s in result.samples_ms] == [6, 6]
    assert all(x > 0 for s in result.samples_ms for x in s)
    assert NoFlush.calls - before == 2 * (2 + 6), "the L2 is flushed before every warm-up and timed call"
    assert len(result.checked) == 2 and all(c.passed for c in checks)
    assert set(result.checked[0].redrawn_inputs) == {"q_index_fp8", "weights"}


def test_redrawn_queries_expose_a_solution_that_replays_answers_per_buffer():
    memo = {}

    def replay(q, k, w, s, bt, out):
        key = q.data_ptr()
        if key not in memo:
            memo[key] = indexer.reference(q, k, w, s, bt)["topk_indices"].clone()
        out.copy_(memo[key])

    _, checks = time_with(replay)
    assert not any(c.passed for c in checks), "every timed call after the first replays a stale answer"


def test_outputs_are_repoisoned_before_every_timed_call():
    calls = []

    def writes_once(q, k, w, s, bt, out):
        if not calls:  # only the very first call writes anything
            out.copy_(indexer.reference(q, k, w, s, bt)["topk_indices"])
        calls.append(1)

    _, checks = time_with(writes_once, trials=1)
    assert not checks[0].passed and "neither -1 nor a token id" in checks[0].message


# --------------------------------------------------------------------------- run --cuda-graph, with graphs of Python steps


class StepGraph:
    """Stands in for a CUDA graph: the solution adds the device work of a captured call (a Python step that
    reads the tensors' current values, as a kernel does), and a replay runs exactly those steps again."""

    capturing: StepGraph | None = None

    def __init__(self) -> None:
        self.steps: list = []
        self.replays = 0


@contextlib.contextmanager
def step_capture(graph: StepGraph, pool: object = None, stream: object = None):
    StepGraph.capturing = graph
    try:
        yield
    finally:
        StepGraph.capturing = None


def replay_steps(graph: StepGraph) -> None:
    graph.replays += 1
    for step in graph.steps:
        step()


STEP_GRAPHS = GraphMode(stream=None, on_stream=lambda stream: contextlib.nullcontext(), new_graph=StepGraph, capture=step_capture,
                        replay=replay_steps, new_pool=lambda: None)  # fmt: skip


def device_work(step) -> None:
    """Run ``step`` now, and during a capture also record it as the captured graph's work."""
    step()
    if StepGraph.capturing is not None:
        StepGraph.capturing.steps.append(step)


def test_graph_mode_times_replays_and_checks_what_they_produced():
    calls, graphs = [], []

    def kernel(q, k, w, s, bt, out):
        calls.append(StepGraph.capturing is not None)
        if StepGraph.capturing is not None:
            graphs.append(StepGraph.capturing)
        device_work(lambda: out.copy_(indexer.reference(q, k, w, s, bt)["topk_indices"]))

    result, checks = time_with(kernel, trials=2, iterations=6, graph=STEP_GRAPHS)
    # per trial: one eager warm-up call per input set (warmup 2), then one capture per input set
    assert calls == [False, False, True, True] * 2
    assert len(graphs) == 4 and [g.replays for g in graphs] == [1 + 3] * 4, "one untimed first launch, then 6 timed replays over 2 sets"
    assert [len(s) for s in result.samples_ms] == [6, 6] and len(result.checked) == 2 and all(c.passed for c in checks)


def test_graph_mode_checks_expose_a_replay_of_host_side_state():
    """Eagerly right, replayed wrong: the answer is remembered per (input tensors, version counter), which the
    harness's in-place redraw bumps, so an eager call recomputes; the capture finds a hit and records only the
    copy of the remembered answer, so every replay writes a stale one."""
    memo: dict = {}

    def kernel(q, k, w, s, bt, out):
        key = tuple((id(t), t._version) for t in (q, k, w, s, bt))
        if key not in memo:
            memo[key] = ((q, k, w, s, bt), indexer.reference(q, k, w, s, bt)["topk_indices"].clone())
        device_work(lambda answer=memo[key][1]: out.copy_(answer))

    _, eager_checks = time_with(kernel)
    assert all(c.passed for c in eager_checks)
    _, graph_checks = time_with(kernel, graph=STEP_GRAPHS)
    assert not any(c.passed for c in graph_checks)


def test_graph_mode_a_capture_that_fails_is_the_cases_plain_message():
    def kernel(q, k, w, s, bt, out):
        out.copy_(indexer.reference(q, k, w, s, bt)["topk_indices"])
        if StepGraph.capturing is not None:  # what .item() raises inside a capture
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors might be ...")

    with pytest.raises(GraphCaptureFailed) as failed:
        time_with(kernel, graph=STEP_GRAPHS)
    assert str(failed.value) == (
        "--cuda-graph: the call could not be captured in a CUDA graph (RuntimeError: CUDA error: operation not permitted when "
        "stream is capturing); the solution must not synchronize with the host inside a call, or run without --cuda-graph"
    )


def test_timer_choice_falls_back_to_events_loudly(monkeypatch):
    """Without cupti-python a GPU run times with CUDA events and says so; forcing CUPTI is an error."""
    import dsa_bench.timing.cupti as cupti_timer
    from dsa_bench.errors import DsaBenchError
    from dsa_bench.timing import choose_timer

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(cupti_timer, "cupti_problem", lambda: "the cupti-python module does not load")
    name, warning = choose_timer("auto", gpu)
    assert name == "events" and "timing with CUDA events instead" in warning and "cuda_events" in warning
    with pytest.raises(DsaBenchError, match="CUPTI timing was requested but is unavailable"):
        choose_timer("cupti", gpu)
    assert choose_timer("events", gpu) == ("events", None)
    with pytest.raises(DsaBenchError, match="CUPTI timing was requested"):
        choose_timer("cupti_api", gpu)
    monkeypatch.setattr(cupti_timer, "cupti_problem", lambda: None)
    assert choose_timer("auto", gpu) == ("cupti", None)
    assert choose_timer("cupti_api", gpu) == ("cupti_api", None)
    assert choose_timer("auto", torch.device("cpu")) == (None, None)


@pytest.mark.gpu
def test_l2_flush_modes_on_the_gpu():
    """Both flushes empty the L2 (a read after them is slower than a warm one), and only the dirty
    one leaves lines the timed call must write back (the same read is slower after it)."""
    import statistics

    from dsa_bench.errors import DsaBenchError
    from dsa_bench.timing import make_timer
    from dsa_bench.timing.flush import L2Flusher

    gpu = torch.device("cuda")
    data = torch.ones((8192, 1024), dtype=torch.float32, device=gpu)  # 32 MB: inside the L2
    row_sums = torch.empty(8192, dtype=torch.float32, device=gpu)
    timer = make_timer("cupti")

    def median_us(prepare) -> float:
        call = lambda i: torch.sum(data, 1, out=row_sums)  # noqa: E731 (a bandwidth-bound read; its output is 32 KB)
        for i in range(3):
            call(i)
        return statistics.median(timer.time_iterations(call, 30, prepare, lambda i: None)) * 1000

    clean, dirty = L2Flusher(gpu, "clean"), L2Flusher(gpu, "dirty")
    warm_us = median_us(lambda i: None)
    clean_us = median_us(lambda i: clean.flush())
    dirty_us = median_us(lambda i: dirty.flush())
    assert clean_us > 1.15 * warm_us, (warm_us, clean_us)
    assert dirty_us > 1.15 * clean_us, (clean_us, dirty_us)
    assert bool((row_sums == 1024).all())
    with pytest.raises(DsaBenchError, match="unknown L2 flush mode 'warm'"):
        L2Flusher(gpu, "warm")


def test_the_reference_is_timed_with_the_light_protocol_unless_asked_for_the_full_one():
    import dataclasses

    from conftest import ROOT

    from dsa_bench.run.runner import timing_job
    from dsa_bench.workloads import REFERENCE_LIGHT, RunSettings, load_workload

    case = load_workload(ROOT / "workloads" / "indexer_smoke.yaml").cases[0]
    settings = RunSettings(warmup=10, iterations=50, trials=3)
    reference, solution = timing_job(settings, case, True), timing_job(settings, case, False)
    assert (reference.warmup, reference.iterations, len(reference.trial_seeds)) == REFERENCE_LIGHT
    assert (solution.warmup, solution.iterations, len(solution.trial_seeds)) == (10, 50, 3)
    assert reference.trial_seeds[0] == solution.trial_seeds[0], "the same input sets, fewer of them"
    full = timing_job(dataclasses.replace(settings, reference_protocol="full"), case, True)
    assert (full.warmup, full.iterations, full.trial_seeds) == (10, 50, solution.trial_seeds)
    tiny = timing_job(RunSettings(warmup=1, iterations=3, trials=1), case, True)
    assert (tiny.warmup, tiny.iterations) == (1, 3), "never more than the run's own settings"


def test_cuda_graph_runs_check_an_uncapturable_reference_without_timing_it():
    # The KV writers' references drop -1 slots by a boolean mask (a host sync): with --cuda-graph they
    # are checked but not timed, and the log line says why; every other pairing is timed as before.
    from dsa_bench.definitions import get_definition
    from dsa_bench.definitions.status import Status
    from dsa_bench.results.records import CaseRecord
    from dsa_bench.results.tables import record_line
    from dsa_bench.run.runner import RunOptions, untimed_reason
    from dsa_bench.workloads import RunSettings

    def options(cuda_graph: bool) -> RunOptions:
        return RunOptions(device=torch.device("cuda"), settings=RunSettings(), timer="cupti", l2_flush="clean", cuda_graph=cuda_graph)

    step = load_workload(ROOT / "workloads" / "decode_step_v32_smoke.yaml").definition
    insert = get_definition("dsa_kv_insert_v32_fp8")
    scorer = load_workload(ROOT / "workloads" / "indexer_smoke.yaml").definition
    assert step.reference_uncapturable and insert.reference_uncapturable and scorer.reference_uncapturable is None
    reason = untimed_reason("reference", step, options(True))
    assert reason is not None and reason.startswith("not timed: --cuda-graph cannot capture this definition's reference (")
    assert untimed_reason("reference", step, options(False)) is None
    assert untimed_reason("triton", step, options(True)) is None
    assert untimed_reason("reference", scorer, options(True)) is None
    record = CaseRecord.new(case="smoke_b1", solution="reference", axes={}, status=Status.PASSED, seeds={})
    record.message, record.wall_s = reason, 1.0
    assert record_line(record, 1, 2) == f"[1/2] smoke_b1 reference: PASSED, correctness only ({reason}), 1.0 s"
