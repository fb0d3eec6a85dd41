"""Per-kernel times of a timed call: CUPTI activity attributed to its call window, summarised per trial."""

from __future__ import annotations

import pytest

from dsa_bench.errors import DsaBenchError
from dsa_bench.run.protocol import MAX_KERNEL_NAMES
from dsa_bench.run.worker import kernel_medians_ms
from dsa_bench.timing.cupti import attribute_activity

WINDOWS = [(1_000, 2_000), (3_000, 4_000)]


def test_activity_is_charged_to_its_window_and_name() -> None:
    gpu = [
        (1_100, 1_300, 1, "insert"), (1_300, 1_800, 2, "score"), (1_800, 1_900, 3, "score"),  # call 0: score twice
        (2_500, 2_600, 4, "flush"),  # between the windows: counts nowhere
        (3_200, 3_700, 5, "score"),  # call 1 has no insert
    ]  # fmt: skip
    latencies, busy = attribute_activity(gpu, {}, WINDOWS)
    assert latencies == pytest.approx([800 / 1e6, 500 / 1e6])
    assert set(busy) == {"insert", "score"}
    assert busy["score"] == pytest.approx([600 / 1e6, 500 / 1e6])
    assert busy["insert"] == pytest.approx([200 / 1e6, 0.0])


def test_a_kernel_launched_inside_a_window_belongs_to_it_even_when_it_starts_after() -> None:
    # With API correlation a kernel that starts after its window closed still belongs to the call that launched it.
    gpu = [(1_100, 1_200, 1, "a"), (2_100, 2_400, 2, "b"), (3_100, 3_200, 3, "a")]
    latencies, busy = attribute_activity(gpu, {2: 1_900}, WINDOWS)
    assert latencies[0] == pytest.approx(1_300 / 1e6)
    assert busy["b"] == pytest.approx([300 / 1e6, 0.0])


def test_a_call_without_gpu_work_is_refused() -> None:
    with pytest.raises(DsaBenchError, match="timed call 1"):
        attribute_activity([(1_100, 1_200, 1, "a")], {}, WINDOWS)


def test_trial_summary_keeps_the_busiest_names_and_sums_the_rest() -> None:
    per_call = {f"k{i}": [float(i), float(i) + 2, float(i) + 1] for i in range(MAX_KERNEL_NAMES + 3)}
    per_call["x" * 300] = [0.5, 0.5, 0.5]
    summary = kernel_medians_ms(per_call)
    assert len(summary) == MAX_KERNEL_NAMES + 1
    busiest = MAX_KERNEL_NAMES + 2
    assert summary[f"k{busiest}"] == busiest + 1  # the median of i, i + 2, i + 1
    assert summary["[other]"] == pytest.approx(1 + 2 + 3 + 0.5)  # k0, k1, k2 and the long name: the four least busy
    assert all(len(name) <= 200 for name in summary)


def test_a_record_keeps_its_kernel_times_and_results_kernels_prints_them(tmp_path) -> None:
    import json

    from conftest import cli
    from synthetic_results import write_results

    from dsa_bench.results.records import Timing, load_results

    path = write_results(tmp_path / "run.json", "indexer_h64", {"c0": {"reference": 1.0, "triton": 0.05}})
    timing = Timing.model_construct(timer="cupti", samples_ms=[[0.05, 0.06], [0.05, 0.05]], clocks=[], host_samples_ms=[],
                                    kernel_ms=[{"score_kernel": 0.03, "topk": 0.02}, {"score_kernel": 0.03}])  # fmt: skip
    written = json.loads(json.dumps(timing.model_dump()))
    assert written["kernels_mean_ms"] == pytest.approx({"score_kernel": 0.03, "topk": 0.01})  # 0 in the trial without it
    document = json.loads(path.read_text())
    [record] = [r for r in document["records"] if r["solution"] == "triton"]
    record["timing"] = written
    path.write_text(json.dumps(document))
    loaded = next(r for r in load_results(path).records if r.solution == "triton")
    assert loaded.timing is not None and loaded.timing.kernel_ms == timing.kernel_ms
    proc = cli("results", "kernels", str(path), "-s", "triton")
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert ["c0", "triton", "score_kernel", "30.0"] == lines[2][:4] and ["c0", "triton", "topk", "10.0"] == lines[3][:4], proc.stdout
    record["timing"]["kernel_ms"] = [{"k": -1.0}, {}]  # a negative time is refused on load, naming the field
    path.write_text(json.dumps(document))
    proc = cli("results", "kernels", str(path))
    assert proc.returncode == 2 and "kernel_ms" in proc.stderr + proc.stdout, proc.stdout + proc.stderr


def test_a_reply_with_bad_kernel_times_is_refused() -> None:
    from dsa_bench.run.protocol import ProtocolError, parse_reply

    reply = {"type": "timing", "notes": "", "timer": "cupti", "samples_ms": [[1.0]], "phase_s": {}, "checked": [],
             "clocks": [{"after_warmup": None, "after_timing": None}], "host_samples_ms": [[1.0]]}  # fmt: skip
    assert parse_reply({**reply, "kernel_ms": [{"a": 0.5}]}, ("timing",)).kernel_ms == [{"a": 0.5}]
    too_many = {f"k{i}": 0.1 for i in range(MAX_KERNEL_NAMES + 2)}
    for bad in ([{"a": float("nan")}], [{"a": -1.0}], [too_many], [{"x" * 201: 1.0}]):
        with pytest.raises(ProtocolError, match="kernel_ms"):
            parse_reply({**reply, "kernel_ms": bad}, ("timing",))


def test_results_kernels_sum_leaves_out_matching_kernels_and_compares_the_rest(tmp_path) -> None:
    import json

    from conftest import cli
    from synthetic_results import write_results

    from dsa_bench.results.records import Timing

    path = write_results(tmp_path / "run.json", "indexer_h64", {"c0": {"reference": 1.0, "triton": 0.05, "production": 0.2}})
    document = json.loads(path.read_text())
    kernels = {"triton": {"kv_insert_kernel": 0.004, "score": 0.03, "topk": 0.016},
               "production": {"_ZN2at6native_where": 0.1, "[memcpy]": 0.02, "logits": 0.05, "topk": 0.03}}  # fmt: skip
    for record in document["records"]:
        if record["solution"] in kernels:
            timing = Timing.model_construct(timer="cupti", samples_ms=[[0.05]], clocks=[], host_samples_ms=[],
                                            kernel_ms=[kernels[record["solution"]]])  # fmt: skip
            record["timing"] = json.loads(json.dumps(timing.model_dump()))
    path.write_text(json.dumps(document))
    proc = cli("results", "kernels", str(path), "--sum", "-x", "^_ZN2at", "-x", r"\[memcpy\]", "-x", "insert", "--against", "production")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines()[2:]}
    assert rows["production"][3:7] == ["200.0", "120.0", "80.0", "1.00x"], proc.stdout
    assert rows["triton"][3:7] == ["50.0", "4.0", "46.0", "1.74x"], proc.stdout  # 80 / 46
    assert "reference" not in rows  # untimed per kernel: no line
    proc = cli("results", "kernels", str(path), "-s", "triton", "--sum", "--against", "production")  # the peer is read too
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines()[2:]}
    assert set(rows) == {"triton", "production"} and rows["triton"][6] == "4.00x", proc.stdout  # nothing excluded: 200 / 50
    for bad, says in ((["--sum", "-x", "(unclosed"], "not a regular expression"), (["-x", "at"], "go with --sum")):
        proc = cli("results", "kernels", str(path), *bad)
        assert proc.returncode == 2 and says in proc.stderr + proc.stdout and "Traceback" not in proc.stderr, proc.stderr
