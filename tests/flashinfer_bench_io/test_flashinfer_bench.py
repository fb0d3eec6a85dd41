"""dsa-bench as a flashinfer-bench citizen: packed solutions imported as flashinfer-bench imports them,
results exported as traces its own models accept, the statuses and fields its schema cannot hold.

Where flashinfer-bench's package is installed (``make test`` adds it without its GPU
dependencies), its own ``Solution`` and ``Trace`` models and its Python/Triton builders are the
judges; CI sets DSA_BENCH_REQUIRE_FLASHINFER_BENCH so that these checks cannot be skipped there.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, cli, relative_copy
from dataset_files import definition_json

from dsa_bench.definitions import get_definition
from dsa_bench.definitions.status import Status
from dsa_bench.flashinfer_bench.packed import flashinfer_hash, import_problems, materialize, package_name
from dsa_bench.flashinfer_bench.traces import FLASHINFER_STATUS
from dsa_bench.pack.pack import pack_solution
from dsa_bench.results.records import CaseRecord, ResultsFile, ResultsHeader, Timing
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
ATTENTION = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
MULTI = FIXTURES / "pack" / "multi_file"


def flashinfer_bench():
    """flashinfer-bench's data models (skipped where it is not installed, except in CI)."""
    if os.environ.get("DSA_BENCH_REQUIRE_FLASHINFER_BENCH"):
        import flashinfer_bench.data

        return flashinfer_bench.data
    return pytest.importorskip("flashinfer_bench.data")


def _fib_definition(name: str, op_type: str):
    return flashinfer_bench().Definition.model_validate(definition_json(get_definition(name), op_type))


def _has_uint8(definition) -> bool:
    import torch

    return any(s.dtype == torch.uint8 for s in [*definition.inputs, *definition.outputs])


def _forget_package(package: str, folder: Path) -> None:
    """Undo an import of a packed solution in this test process."""
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[module]
    if str(folder) in sys.path:
        sys.path.remove(str(folder))


# --------------------------------------------------------------------------- imports


def test_absolute_sibling_imports_are_named_with_file_line_and_the_relative_form(tmp_path):
    packed = {p.definition: p for p in pack_solution(MULTI, tmp_path)}
    (indexer_problem,) = import_problems(packed[INDEXER].document, "x.json")
    assert indexer_problem.startswith("x.json: indexer_kernel.py:4: `from common import constants` imports the packed module 'common'")
    assert f"as the package {package_name(packed[INDEXER].document)}, without the solution folder on sys.path" in indexer_problem
    assert indexer_problem.endswith("make it relative: `from .common import constants`")
    (attention_problem,) = import_problems(packed[ATTENTION].document, "y.json")
    assert "attn/entry.py:3: `from common.constants import PAGE_SIZE`" in attention_problem
    assert attention_problem.endswith("`from ..common.constants import PAGE_SIZE`")  # attn/ is one folder down

    document = dict(packed[INDEXER].document)
    document["sources"] = [
        {"path": "k.py", "content": "import torch\nimport helpers.select\nfrom . import helpers\nimport importlib\n"
                                    "m = importlib.import_module('helpers')\nn = importlib.import_module('.helpers', __package__)\n"},
        {"path": "helpers/select.py", "content": "x = 1\n"},
    ]  # fmt: skip
    document["spec"] = {**document["spec"], "entry_point": "k.py::kernel"}
    problems = import_problems(document, "z.json")
    assert [p.split(" imports ")[0] for p in problems] == [
        "z.json: k.py:2: `import helpers.select`", "z.json: k.py:5: `import_module('helpers')`",
    ]  # fmt: skip
    assert "`from . import select`" not in problems[0] and problems[0].endswith("`from .helpers import select`")
    assert import_problems(relative_pack(tmp_path)[INDEXER].document, "ok.json") == []


def relative_pack(tmp_path: Path) -> dict:
    return {p.definition: p for p in pack_solution(relative_copy(tmp_path / "multi_file"), tmp_path / "relative")}


def test_shipped_triton_solution_imports_as_flashinfer_bench_imports_it(tmp_path, monkeypatch):
    packed = pack_solution(ROOT / "solutions" / "triton", tmp_path / "out")
    for item in packed:
        assert import_problems(item.document, str(item.path)) == []
    data = flashinfer_bench()
    from flashinfer_bench.compile.builders.triton_builder import TritonBuilder

    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib_cache"))
    assert len(packed) == len(load_solution(ROOT / "solutions" / "triton").entries)
    # flashinfer-bench's Definition has no uint8 dtype, so the KV-insert, MLA-decode and decode-step definitions
    # (uint8 caches) cannot be described to its builder; their packed solutions are still checked
    # for imports above
    expressible = [p for p in packed if not _has_uint8(get_definition(p.definition))]
    assert {p.definition for p in packed} - {p.definition for p in expressible} == {
        "dsa_kv_insert_v32_fp8", "dsa_kv_insert_v4_fp8", "dsa_kv_insert_v41_fp8",
        "dsa_mla_decode_v32_fp8", "dsa_mla_decode_v4_fp8", "dsa_mla_decode_v41_fp8",
        "dsa_decode_step_v32", "dsa_decode_step_v4", "dsa_decode_step_v4_topk512", "dsa_decode_step_v4_topk1024",
    }
    for item in expressible:
        op_type = item.definition.split("_fp8")[0]  # dsa_topk_indexer, dsa_sparse_attention
        solution = data.Solution.model_validate(item.document)
        assert solution.hash() == flashinfer_hash(item.document)
        runnable = TritonBuilder().build(_fib_definition(item.definition, op_type), solution)
        try:
            assert runnable.metadata.misc["module_name"].startswith(package_name(item.document) + ".")
        finally:
            runnable.cleanup()


def test_the_loader_imports_a_packed_json_as_flashinfer_bench_does(tmp_path, monkeypatch):
    """The same package name, the same failure on an absolute sibling import, the same success on relative ones."""
    data = flashinfer_bench()
    from flashinfer_bench.compile.builder import BuildError
    from flashinfer_bench.compile.builders.python_builder import PythonBuilder

    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib_cache"))
    # as in a fresh flashinfer-bench process: no solution folder an earlier test imported (the
    # harness's loader puts one on sys.path) lends its `common` package to the absolute import
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not Path(p).is_relative_to(ROOT / "solutions")])
    for name in [m for m in sys.modules if m == "common" or m.startswith("common.")]:
        monkeypatch.delitem(sys.modules, name)
    definition = _fib_definition(INDEXER, "dsa_topk_indexer")
    absolute = pack_solution(MULTI, tmp_path / "absolute")[0]
    relative = relative_pack(tmp_path)[INDEXER]
    assert absolute.definition == INDEXER

    with pytest.raises(BuildError, match="No module named 'common'"):
        PythonBuilder().build(definition, data.Solution.model_validate(absolute.document))
    mine = materialize(absolute.path, tmp_path / "cache")
    try:
        with pytest.raises(ModuleNotFoundError, match="No module named 'common'"):
            import_entry(mine, INDEXER)
    finally:
        _forget_package(mine.path.name, mine.path.parent)

    runnable = PythonBuilder().build(definition, data.Solution.model_validate(relative.document))
    theirs = runnable.metadata.misc["module_name"]
    runnable.cleanup()
    mine = materialize(relative.path, tmp_path / "cache")
    assert mine.path.name == package_name(relative.document) == theirs.split(".")[0]
    assert mine.name == relative.document["name"] and mine.packed_from == relative.path.resolve()
    try:
        function, module = import_entry(mine, INDEXER)
        assert module is not None and module.__name__ == theirs == f"{mine.path.name}.indexer_kernel"
        assert function.__name__ == "kernel"
    finally:
        _forget_package(mine.path.name, mine.path.parent)
    assert materialize(relative.path, tmp_path / "cache").path == mine.path  # laid out once, then reused


# --------------------------------------------------------------------------- export


def _results(tmp_path: Path, records: list[CaseRecord], timer: str | None = "cupti") -> Path:
    header = {
        "workload": {"name": "indexer_smoke", "path": "workloads/indexer_smoke.yaml", "trace": "traces/indexer_smoke.jsonl",
                     "definition": INDEXER},
        "settings": {"seed": 7, "input_sets": 2, "warmup": 3, "iterations": 10, "trials": 2,
                     "tolerance": {"atol": 0.01, "rtol": 0.01, "lse_atol": 0.00025, "score_rtol": 0.5}},
        "timer": timer, "l2_flush": "clean" if timer else None,
        "environment": {"dsa_bench": "0.1.0", "torch": "2.13.0", "triton": "3.5.0", "cuda": "13.0", "driver": "580.1",
                        "gpu": "NVIDIA H200" if timer else None},
        "solutions": {"reference": {"path": "solutions/reference", "content_hash": "aa"},
                      "triton": {"path": "solutions/triton", "content_hash": "bb"},
                      f"mine_{INDEXER}": {"path": ".cache/x", "content_hash": "cc", "packed": "dist/mine.json"}},
    }  # fmt: skip
    path = tmp_path / "results.json"
    results = ResultsFile(path, ResultsHeader.model_validate(header))
    for record in records:
        results.add(record)
    results.update(complete=True)
    return path


def _record(case: str, solution: str, status: Status, ms: float | None = None, **fields) -> CaseRecord:
    axes = {"smoke_passthrough": {"batch_size": 1, "max_num_pages": 4, "num_pages": 512},
            "smoke_boundary": {"batch_size": 3, "max_num_pages": 36, "num_pages": 512}}[case]  # fmt: skip
    timing = Timing(timer="cupti", samples_ms=[[ms] * 3, [ms * 1.02] * 3]) if ms is not None else None
    return CaseRecord(case=case, solution=solution, axes=axes, status=status, timing=timing, seeds={"correctness": [1, 2]}, **fields)


def test_export_writes_traces_flashinfer_bench_validates_and_maps_what_it_cannot_hold(tmp_path):
    records = [
        _record("smoke_passthrough", "reference", Status.PASSED, 2.0, speedup=1.0, max_abs_error=0.0),
        _record("smoke_passthrough", "triton", Status.PASSED, 0.5, speedup=4.0, max_abs_error=0.0),
        _record("smoke_boundary", "reference", Status.PASSED, 3.0, speedup=1.0),
        _record("smoke_boundary", "triton", Status.INCORRECT_INDICES, message="row 1: token 9 is not among the top-k"),
        _record("smoke_boundary", f"mine_{INDEXER}", Status.TIMING_SUSPECT, message="below the physical floor"),
        _record("smoke_passthrough", f"mine_{INDEXER}", Status.INCORRECT_NUMERICAL, max_abs_error=float("nan"), max_rel_error=float("inf")),
    ]
    results = _results(tmp_path, records)
    proc = cli("export", str(results), "--format", "flashinfer-bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "results.traces.jsonl"
    assert f"wrote {out}: 6 flashinfer-bench traces" in proc.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6

    passed = lines[1]
    assert passed["definition"] == INDEXER and passed["solution"] == f"triton_{INDEXER}"  # the name `pack` gives its JSON
    assert passed["workload"]["uuid"] == "smoke_passthrough"
    assert passed["workload"]["axes"] == {"batch_size": 1, "max_num_pages": 4, "num_pages": 512}
    assert "seq_lens" not in passed["workload"]["inputs"] and passed["workload"]["inputs"]["weights"] == {"type": "random"}
    evaluation = passed["evaluation"]
    assert evaluation["status"] == "PASSED"
    performance = {"latency_ms": pytest.approx(0.505), "reference_latency_ms": pytest.approx(2.02), "speedup_factor": 4.0}
    assert evaluation["performance"] == performance
    libs = {"dsa_bench": "0.1.0", "torch": "2.13.0", "triton": "3.5.0", "cuda": "13.0", "driver": "580.1"}
    assert evaluation["environment"] == {"hardware": "NVIDIA H200", "libs": libs}
    log = evaluation["log"]
    for line in (
        "dsa-bench status: PASSED", "timer: cupti, L2 flush: clean, launch: eager",
        "settings: seed=7 input_sets=2 warmup=3 iterations=10 trials=2",
        "tolerance: atol=0.01 rtol=0.01 lse_atol=0.00025 score_rtol=0.5", 'seeds: {"correctness": [1, 2]}',
        "solution: triton (solutions/triton, sha256 bb)", "inputs flashinfer-bench cannot describe: seq_lens holds explicit values",
    ):  # fmt: skip
        assert line in log, log
    assert "latency: 0.505 ms, the mean of 2 trial medians [0.5, 0.51] ms" in log

    indices = lines[3]["evaluation"]
    assert indices["status"] == "INCORRECT_NUMERICAL" and "performance" not in indices
    assert indices["correctness"] == {"max_relative_error": "NaN", "max_absolute_error": "NaN",
                                      "extra": {"dsa_bench_status": "INCORRECT_INDICES", "errors_measured": False}}  # fmt: skip
    assert "dsa-bench status: INCORRECT_INDICES (flashinfer-bench has no such status: reported as INCORRECT_NUMERICAL)" in indices["log"]
    assert "message: row 1: token 9 is not among the top-k" in indices["log"]
    suspect = lines[4]
    assert suspect["solution"] == f"mine_{INDEXER}"  # run from a packed JSON: that JSON's name
    assert suspect["evaluation"]["status"] == "RUNTIME_ERROR" and "correctness" not in suspect["evaluation"]
    assert "dsa-bench status: TIMING_SUSPECT" in suspect["evaluation"]["log"]
    assert lines[5]["evaluation"]["correctness"] == {"max_relative_error": "Infinity", "max_absolute_error": "NaN"}

    # again over its own output: allowed; over the results file or a foreign file: refused
    assert cli("export", str(results), "-o", str(out)).returncode == 0
    proc = cli("export", str(results), "-o", str(results))
    assert proc.returncode == 2 and "an input of the command" in proc.stderr
    (tmp_path / "notes.jsonl").write_text('{"my": "notes"}\n')
    proc = cli("export", str(results), "-o", str(tmp_path / "notes.jsonl"))
    assert proc.returncode == 2 and "is not a flashinfer-bench traces file" in proc.stderr
    assert cli("export", str(results), "--format", "csv").returncode == 2

    data = flashinfer_bench()
    traces = [data.Trace.model_validate_json(line) for line in out.read_text().splitlines()]
    assert [t.evaluation.status.value for t in traces] == [
        "PASSED", "PASSED", "PASSED", "INCORRECT_NUMERICAL", "RUNTIME_ERROR", "INCORRECT_NUMERICAL",
    ]  # fmt: skip
    assert traces[1].evaluation.performance.speedup_factor == 4.0 and traces[1].is_successful()


def test_export_of_a_run_without_cuda_and_of_a_changed_trace(tmp_path):
    results = _results(tmp_path, [_record("smoke_passthrough", "triton", Status.PASSED)], timer=None)
    assert cli("export", str(results), "-o", str(tmp_path / "t.jsonl")).returncode == 0
    (line,) = (tmp_path / "t.jsonl").read_text().splitlines()
    evaluation = json.loads(line)["evaluation"]
    assert evaluation["performance"] == {"latency_ms": 0.0, "reference_latency_ms": 0.0, "speedup_factor": 0.0}
    assert evaluation["environment"]["hardware"] == "cpu" and "timer: none" in evaluation["log"]
    assert evaluation["correctness"]["extra"] == {"errors_measured": False}

    moved = _record("smoke_passthrough", "triton", Status.PASSED)
    moved.axes = {**moved.axes, "batch_size": 2}
    proc = cli("export", str(_results(tmp_path, [moved])))
    assert proc.returncode == 2 and "records[0]: case 'smoke_passthrough' has axes" in proc.stderr and "Traceback" not in proc.stderr


def test_every_status_has_a_flashinfer_bench_status():
    assert {s.value for s in Status} <= set(FLASHINFER_STATUS)
    data = flashinfer_bench()
    assert {v for v in FLASHINFER_STATUS.values() if v is not None} <= {s.value for s in data.EvaluationStatus}


# --------------------------------------------------------------------------- what dsa-bench cannot run


def test_unpack_and_run_refuse_a_tvm_ffi_cuda_solution_and_a_wrong_json(tmp_path):
    cuda = {
        "name": "topk_cuda", "definition": INDEXER, "author": "someone",
        "spec": {"language": "cuda", "target_hardware": ["cuda"], "entry_point": "topk.cu::run"},
        "sources": [{"path": "topk.cu", "content": "// TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);\n"}],
    }  # fmt: skip
    for binding, said in ((None, "has no spec.binding, which flashinfer-bench reads as 'tvm-ffi' (its default)"),
                          ("tvm-ffi", "has spec.binding 'tvm-ffi'")):  # fmt: skip
        path = tmp_path / f"{binding}.json"
        path.write_text(json.dumps({**cuda, "spec": {**cuda["spec"], **({"binding": binding} if binding else {})}}))
        proc = cli("unpack", str(path), str(tmp_path / "restored"))
        assert proc.returncode == 2, proc.stdout
        assert f"{path}: this CUDA solution {said}: flashinfer-bench builds it through TVM-FFI" in proc.stderr
        assert 'only "binding": "torch" solutions can be unpacked or run' in proc.stderr
        proc = cli("run", "-w", "indexer_smoke", "-s", str(path), "--no-save", "--device", "cpu")
        assert proc.returncode == 2 and "builds it through TVM-FFI" in proc.stderr
    assert not (tmp_path / "restored").exists()

    (attention,) = [p for p in pack_solution(ROOT / "solutions" / "triton", tmp_path / "out") if p.definition == ATTENTION]
    proc = cli("run", "-w", "indexer_smoke", "-s", str(attention.path), "--no-save", "--device", "cpu")
    assert proc.returncode == 2 and f"implements {ATTENTION!r}, but the workload runs {INDEXER!r}" in proc.stderr
    proc = cli("run", "-w", "indexer_smoke", "-s", str(tmp_path / "missing.json"), "--no-save", "--device", "cpu")
    assert proc.returncode == 2 and "missing.json: packed solution file does not exist" in proc.stderr


def test_export_warns_once_per_skipped_solution(tmp_path):
    """A peer skipped on every case is one warning, not one per case."""
    records = [_record(case, name, status) for case in ("smoke_passthrough", "smoke_boundary")
               for name, status in (("reference", Status.PASSED), ("triton", Status.SKIPPED))]  # fmt: skip
    proc = cli("export", str(_results(tmp_path, records, timer=None)), "-o", str(tmp_path / "t.jsonl"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: no trace for 2 cases (smoke_passthrough, ...) [triton]: SKIPPED, not run, so there is no evaluation"]
