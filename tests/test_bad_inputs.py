"""Bad input gets one clear message (the file, line, field or case and what was expected), the
documented exit code, no traceback, and no data loss.

- Malformed input through every command: every file byte-identical afterwards, no temporary file
  left. ``CORPUS`` is the table to extend: each entry writes its files into a fresh folder, runs one
  command in process (``CliRunner`` on the real app, whose group maps DsaBenchError to exit 2
  exactly as for a user), and names a fragment the message must hold.
- Names, paths, settings and traces chosen to break the harness.
- The replay of hostile and careless inputs (issue 47): each finding refused with one clear line
  and exit 2, or recorded honestly, instead of a traceback, a hang, lost data or a wrong exit code.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, cli, run_cli
from safetensors.torch import save_file
from synthetic_results import write_results
from typer.testing import CliRunner

from dsa_bench.cli import EXIT_BAD_INPUT, app
from dsa_bench.definitions import get_definition
from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import MAX_TEXT_BYTES
from dsa_bench.flashinfer_bench.dataset import load_dataset_workload
from dsa_bench.pack.pack import pack_solution, unpack_solutions
from dsa_bench.paths import MAX_FILE_NAME, safe_file_name
from dsa_bench.project import check_run_solutions
from dsa_bench.results.baseline import BaselineCaseModel, CaseMeasure, baseline_block, load_baseline
from dsa_bench.results.records import (
    CaseRecord,
    LoadedResults,
    ResultsDocument,
    ResultsFile,
    ResultsHeader,
    Timing,
    check_results_path,
    load_results,
)
from dsa_bench.solution import load_solution
from dsa_bench.workloads import build_inputs, load_workload

# --------------------------------------------------------------------------- malformed input through every command


INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
TRACE_LINE = '{"id":"c1","axes":{"batch_size":1,"max_num_pages":4,"num_pages":512},"inputs":{"seq_lens":{"type":"explicit","values":[200]}}}\n'
WORKLOAD = f"name: wl\ndefinition: {INDEXER}\ntrace: trace.jsonl\nsettings:\n  seed: 1\n"
MANIFEST = f"name: mine\nauthor: tests\ntarget_hardware: [cpu]\nentries:\n  {INDEXER}:\n    entry_point: k.py::run\n    language: python\n"
KERNEL = "def run(*args):\n    return None\n"
#: a YAML "billion laughs": nine levels of nine aliases each, 9**9 strings for whoever walks it
ALIAS_BOMB = (
    'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))
    + "description: *i\n"
)
DEEP_YAML = "settings: " + "[" * 150 + "]" * 150 + "\n"
DEEP_JSON = "[" * 50_000 + "]" * 50_000
LONG_NAME = "n" * 300  # longer than a file name may be (255 bytes)


def results_document(case: str = "c1", solution: str = "reference") -> dict:
    """A small timed results document, as dsa-bench's own writer produces it."""
    results = ResultsFile(
        None,
        ResultsHeader.model_validate({
            "workload": {"name": "wl", "path": "wl.yaml", "trace": "trace.jsonl", "definition": INDEXER},
            "settings": {"seed": 1, "input_sets": 2, "warmup": 1, "iterations": 3, "trials": 2},
            "timer": "cupti",
            "l2_flush": "clean",
            "environment": {"gpu": "NVIDIA H200", "device": "cuda:0"},
            "solutions": {solution: {"path": f"solutions/{solution}", "content_hash": "abc"}},
        }),
    )
    timing = Timing(timer="cupti", samples_ms=[[0.5, 0.6, 0.55], [0.52, 0.58, 0.54]])
    results.add(CaseRecord(case=case, solution=solution, axes={"batch_size": 1}, status=Status.PASSED, timing=timing, speedup=1.0))
    results.update(complete=True)
    return results.document


def baseline_document() -> dict:
    doc = results_document()
    parsed = ResultsDocument.model_validate(doc)
    block = baseline_block(LoadedResults(Path("r.json"), parsed, parsed.records))
    return {"format": "dsa-bench-baseline", "version": 1, "updated": "now", "workloads": {"wl": block}}


def mutated(make: Callable[[], dict], change: Callable[[dict], object]) -> str:
    doc = copy.deepcopy(make())
    change(doc)
    return json.dumps(doc)


RESULTS = json.dumps(results_document())
BASELINE = json.dumps(baseline_document())


def packed(sources: list[dict]) -> str:
    return json.dumps(
        {
            "name": "mine_x",
            "definition": INDEXER,
            "author": "tests",
            "description": "",
            "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "k.py::run", "dependencies": [], "destination_passing_style": True},
            "sources": [{"path": "k.py", "content": KERNEL}, *sources],
        }
    )


#: The files most entries start from: a workload with its trace, a solution folder, results and a baseline.
BASE_FILES: dict[str, str | bytes] = {
    "wl.yaml": WORKLOAD,
    "trace.jsonl": TRACE_LINE,
    "sol/solution.yaml": MANIFEST,
    "sol/k.py": KERNEL,
    "r.json": RESULTS,
    "baseline.json": BASELINE,
}


@dataclass(frozen=True)
class BadInput:
    name: str
    args: tuple[str, ...]  # "{tmp}" stands for the entry's folder
    expect: str  # a fragment of the output
    files: dict[str, str | bytes | int] = field(default_factory=dict)  # added to (or replacing) BASE_FILES; int: a sparse file of that size
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)
    max_seconds: float = 20.0


def run_(*args: str, save: str = "{tmp}/out.json") -> tuple[str, ...]:
    return ("run", "-w", "{tmp}/wl.yaml", "-s", "reference", "--device", "cpu", "--save", save, *args)


CORPUS: list[BadInput] = [
    # run --save never replaces anything but an earlier results file (checked before the first case)
    BadInput("run-save-over-workload", run_(save="{tmp}/wl.yaml"), "--save: this is an input of the command"),
    BadInput("run-save-over-trace", run_(save="{tmp}/trace.jsonl"), "--save: this is an input of the command"),
    BadInput("run-save-over-baseline", run_(save="{tmp}/baseline.json"), "exists and is not a dsa-bench results file"),
    BadInput("run-save-over-other-file", run_(save="{tmp}/notes.txt"), "exists and is not a dsa-bench results file", {"notes.txt": "mine\n"}),
    BadInput("run-save-to-folder", run_(save="{tmp}/sol"), "expected a dsa-bench results file path, got a folder"),
    BadInput("run-save-under-file", run_(save="{tmp}/wl.yaml/out.json"), "is a file, so nothing can be written under it"),
    BadInput("run-save-long-name", run_(save="{tmp}/" + LONG_NAME + ".json"), "--save: cannot use this path: File name too long"),
    BadInput("run-save-inside-solution", run_("-s", "{tmp}/sol", save="{tmp}/sol/out.json"), "an input folder of the command"),
    # run: malformed workload YAML and trace
    BadInput("run-workload-not-utf8", run_(), "wl.yaml:6: not UTF-8 text: byte 0xff at byte offset 117", {"wl.yaml": WORKLOAD.encode() + b"description: \xff\n"}),
    BadInput("run-workload-deep", run_(), "wl.yaml:4: malformed YAML: YAML nested deeper than 100 levels", {"wl.yaml": WORKLOAD.replace("settings:\n  seed: 1\n", DEEP_YAML)}),
    BadInput("run-workload-alias-bomb", run_(), "wl.yaml:10: malformed YAML: YAML aliases expand this node to more than", {"wl.yaml": WORKLOAD.replace("name: wl\n", "") + ALIAS_BOMB}, max_seconds=2.0),
    BadInput("run-workload-nul-byte", run_(), "wl.yaml:1: malformed YAML: character #x0000", {"wl.yaml": "name: w\x00l\n" + WORKLOAD}),
    BadInput("run-workload-duplicate-key", run_(), "wl.yaml:6: malformed YAML: key 'name' appears twice", {"wl.yaml": WORKLOAD + "name: again\n"}),
    BadInput("run-workload-bad-date", run_(), "wl.yaml:6: malformed YAML: cannot read value '2024-13-01'", {"wl.yaml": WORKLOAD + "description: 2024-13-01\n"}),
    BadInput("run-trace-not-utf8", run_(), "trace.jsonl:2: not UTF-8 text", {"trace.jsonl": TRACE_LINE.encode() + b'{"id": "\xc3("}\n'}),
    BadInput("run-trace-deep", run_(), "trace.jsonl:2: JSON nested deeper than 100 levels", {"trace.jsonl": TRACE_LINE + DEEP_JSON + "\n"}),
    BadInput("run-trace-huge-integer", run_(), "trace.jsonl:1: invalid JSON: Exceeds the limit", {"trace.jsonl": TRACE_LINE.replace("200", "1" * 5000)}),
    BadInput("run-trace-duplicate-key", run_(), "trace.jsonl:1: invalid JSON: key 'id' appears twice", {"trace.jsonl": TRACE_LINE.replace('{"id":"c1",', '{"id":"c1","id":"c2",')}),
    # run --dataset with a malformed dataset
    BadInput("dataset-definition-not-utf8", ("run", "--dataset", "{tmp}/ds", "-w", INDEXER, "--no-save"), "ds/definitions/x.json:1: not UTF-8 text", {"ds/definitions/x.json": b'{"name": "\xff"}'}),
    BadInput("dataset-definition-deep", ("run", "--dataset", "{tmp}/ds", "-w", INDEXER, "--no-save"), "x.json:1: JSON nested deeper than 100 levels", {"ds/definitions/x.json": DEEP_JSON}),
    BadInput("dataset-workloads-deep", ("run", "--dataset", "{tmp}/ds", "-w", "{tmp}/ds/workloads/w.jsonl", "--no-save"), "w.jsonl:1: JSON nested deeper than 100 levels", {"ds/definitions/x.json": '{"name": "x"}', "ds/workloads/w.jsonl": DEEP_JSON + "\n"}),
    # list and validate
    BadInput("list-broken-workload", ("list", "workloads"), "INVALID", {"root/workloads/bad.yaml": ALIAS_BOMB}, code=0, env={"DSA_BENCH_ROOT": "{tmp}/root"}),
    BadInput("list-broken-manifest", ("list", "solutions"), "solution.yaml:1: malformed YAML: YAML nested deeper", {"root/workloads/.keep": "", "root/solutions/s/solution.yaml": DEEP_YAML}, env={"DSA_BENCH_ROOT": "{tmp}/root"}),
    BadInput("validate-workload-not-utf8", ("validate", "{tmp}/wl.yaml"), "not UTF-8 text", {"wl.yaml": b"name: \xfe\n"}),
    BadInput("validate-manifest-alias-bomb", ("validate", "{tmp}/sol"), "YAML aliases expand this node", {"sol/solution.yaml": ALIAS_BOMB}, max_seconds=2.0),
    BadInput("validate-trace-deep", ("validate", "{tmp}/wl.yaml"), "trace.jsonl:1: JSON nested deeper", {"trace.jsonl": DEEP_JSON + "\n"}),
    # pack
    BadInput("pack-source-not-utf8", ("pack", "{tmp}/sol", "-o", "{tmp}/out"), "k.py:3: not UTF-8 text", {"sol/k.py": KERNEL.encode() + b"# \xff\n"}),
    BadInput("pack-out-inside-solution", ("pack", "{tmp}/sol", "-o", "{tmp}/sol/packed"), "an input folder of the command"),
    BadInput("pack-out-is-solution", ("pack", "{tmp}/sol", "-o", "{tmp}/sol"), "an input folder of the command"),
    BadInput("pack-out-over-foreign-file", ("pack", "{tmp}/sol", "-o", "{tmp}/out"), "exists and is not a packed Solution JSON file", {f"out/mine_{INDEXER}.json": "my notes\n"}),
    BadInput("pack-out-under-file", ("pack", "{tmp}/sol", "-o", "{tmp}/wl.yaml/out"), "is a file, so nothing can be written under it"),
    # unpack: nothing is written unless everything can be
    BadInput("unpack-nul-in-path", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "expected no control characters", {"p.json": packed([{"path": "a\x00b.py", "content": "x = 1\n"}])}),
    BadInput("unpack-long-name", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "at most 255 bytes per name", {"p.json": packed([{"path": "d/" + "n" * 300 + ".py", "content": "x = 1\n"}])}),
    BadInput("unpack-file-where-folder-goes", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "is a file, but other sources lie inside it", {"p.json": packed([{"path": "lib", "content": "x\n"}, {"path": "lib/x.py", "content": "x = 1\n"}])}),
    BadInput("unpack-unnormalised-path", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "expected a normalised path", {"p.json": packed([{"path": "./k.py", "content": KERNEL}])}),
    BadInput("unpack-lone-surrogate", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "not valid Unicode text", {"p.json": packed([{"path": "a.py", "content": "x = '\udc80'\n"}])}),
    BadInput("unpack-force-file-in-the-way", ("unpack", "{tmp}/p.json", "{tmp}/dest", "--force"), "must go inside it as a folder", {"p.json": packed([{"path": "lib/x.py", "content": "x = 1\n"}]), "dest/lib": "a file of mine\n"}),
    BadInput("unpack-force-folder-in-the-way", ("unpack", "{tmp}/p.json", "{tmp}/dest", "--force"), "is a folder (or a link)", {"p.json": packed([]), "dest/k.py/keep": "mine\n"}),
    BadInput("unpack-dest-under-file", ("unpack", "{tmp}/p.json", "{tmp}/wl.yaml/dest"), "which is a file", {"p.json": packed([])}),
    BadInput("unpack-dest-long-name", ("unpack", "{tmp}/p.json", "{tmp}/" + LONG_NAME), "cannot use this destination: File name too long", {"p.json": packed([])}),
    BadInput("unpack-not-utf8", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "p.json:1: not UTF-8 text", {"p.json": b'{"name": "\xff"}'}),
    BadInput("unpack-deep", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "p.json:1: JSON nested deeper", {"p.json": DEEP_JSON}),
    BadInput("unpack-deep-python", ("unpack", "{tmp}/p.json", "{tmp}/dest"), "Python nested too deeply to parse", {"p.json": packed([{"path": "a.py", "content": "x = " + "-" * 200_000 + "1\n"}])}),
    # compare: malformed results and baselines, field by field
    BadInput("compare-sample-not-a-number", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "bad.json: records[0].timing.samples_ms[1][2]: expected a number, got 'x'", {"bad.json": mutated(results_document, lambda d: d["records"][0]["timing"]["samples_ms"][1].__setitem__(2, "x"))}),
    BadInput("compare-sample-nan", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "records[0].timing.samples_ms[0][0]: expected a finite number, got nan", {"bad.json": RESULTS.replace("[[0.5, ", "[[NaN, ")}),
    BadInput("compare-no-samples", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "records[0].timing.samples_ms: expected at least 1 item(s)", {"bad.json": mutated(results_document, lambda d: d["records"][0]["timing"].__setitem__("samples_ms", []))}),
    BadInput("compare-unknown-status", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "records[0].status: expected one of 'PASSED'", {"bad.json": mutated(results_document, lambda d: d["records"][0].__setitem__("status", "GREAT"))}),
    BadInput("compare-negative-speedup", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "records[0].speedup: expected a number >= 0", {"bad.json": mutated(results_document, lambda d: d["records"][0].__setitem__("speedup", -2.0))}),
    BadInput("compare-record-not-object", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "records[1]: expected an object, got 7", {"bad.json": mutated(results_document, lambda d: d["records"].append(7))}),
    BadInput("compare-duplicate-record", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "records[1]: case 'c1' of solution 'reference' is already records[0]", {"bad.json": mutated(results_document, lambda d: d["records"].append(d["records"][0]))}),
    BadInput("compare-no-records", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "bad.json: records: missing", {"bad.json": mutated(results_document, lambda d: d.pop("records"))}),
    BadInput("compare-workload-name", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "workload.name: expected a string, got 3", {"bad.json": mutated(results_document, lambda d: d["workload"].__setitem__("name", 3))}),
    BadInput("compare-results-not-utf8", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "bad.json:1: not UTF-8 text", {"bad.json": b"\xff{}"}),
    BadInput("compare-results-deep", ("compare", "{tmp}/bad.json", "-b", "{tmp}/baseline.json"), "bad.json:1: JSON nested deeper", {"bad.json": DEEP_JSON}),
    BadInput("compare-results-is-yaml", ("compare", "{tmp}/wl.yaml", "-b", "{tmp}/baseline.json"), "wl.yaml:1: invalid JSON"),
    BadInput("compare-results-too-large", ("compare", "{tmp}/big.json", "-b", "{tmp}/baseline.json"), f"big.json: results file is {MAX_TEXT_BYTES + 1} bytes; dsa-bench reads at most", {"big.json": MAX_TEXT_BYTES + 1}),
    BadInput("compare-results-is-folder", ("compare", "{tmp}/sol", "-b", "{tmp}/baseline.json"), "cannot read results file: it is a folder"),
    BadInput("compare-baseline-speedup-text", ("compare", "{tmp}/r.json", "-b", "{tmp}/bad.json"), "bad.json: workloads.wl.cases[0].speedup: expected a number, got 'fast'", {"bad.json": mutated(baseline_document, lambda d: d["workloads"]["wl"]["cases"][0].__setitem__("speedup", "fast"))}),
    BadInput("compare-baseline-is-results", ("compare", "{tmp}/r.json", "-b", "{tmp}/r.json"), 'not a dsa-bench baseline file (expected "format": "dsa-bench-baseline")'),
    BadInput("compare-baseline-cases-object", ("compare", "{tmp}/r.json", "-b", "{tmp}/bad.json"), "workloads.wl.cases: expected a list, got an object", {"bad.json": mutated(baseline_document, lambda d: d["workloads"]["wl"].__setitem__("cases", {}))}),
    # baseline update replaces only a baseline file
    BadInput("baseline-over-results-input", ("baseline", "update", "{tmp}/r.json", "-b", "{tmp}/r.json"), "--baseline: this is an input of the command"),
    BadInput("baseline-over-workload", ("baseline", "update", "{tmp}/r.json", "-b", "{tmp}/wl.yaml"), "--baseline: exists and is not a dsa-bench baseline file"),
    BadInput("baseline-replace-over-workload", ("baseline", "update", "{tmp}/r.json", "-b", "{tmp}/wl.yaml", "--replace"), "--baseline: exists and is not a dsa-bench baseline file"),
    BadInput("baseline-to-folder", ("baseline", "update", "{tmp}/r.json", "-b", "{tmp}/sol"), "got a folder"),
    BadInput("baseline-malformed-results", ("baseline", "update", "{tmp}/bad.json", "-b", "{tmp}/new.json"), "records[0].axes.batch_size: expected an integer, got True", {"bad.json": mutated(results_document, lambda d: d["records"][0]["axes"].__setitem__("batch_size", True))}),
    BadInput("baseline-malformed-existing", ("baseline", "update", "{tmp}/r.json", "-b", "{tmp}/bad.json"), "workloads.wl.cases[0].case: missing", {"bad.json": mutated(baseline_document, lambda d: d["workloads"]["wl"]["cases"][0].pop("case"))}),
    # report never replaces its inputs or files that are not its own
    BadInput("report-over-input", ("report", "{tmp}/r.json", "-o", "{tmp}/r.json"), "--output: this is an input of the command"),
    BadInput("report-default-over-input", ("report", "{tmp}/r.html"), "--output: this is an input of the command", {"r.html": RESULTS}),
    BadInput("report-over-workload", ("report", "{tmp}/r.json", "-o", "{tmp}/wl.yaml"), "--output: exists and is not a dsa-bench HTML report file"),
    BadInput("report-over-foreign-png", ("report", "{tmp}/r.json", "-o", "{tmp}/rep.html"), "exists and is not a PNG image file", {"rep-wl-latency.png": "not a picture\n"}),
    BadInput("report-long-name", ("report", "{tmp}/r.json", "-o", "{tmp}/" + LONG_NAME + ".html"), "--output: cannot use this path: File name too long"),
    BadInput("pack-out-long-name", ("pack", "{tmp}/sol", "-o", "{tmp}/" + LONG_NAME), "--out: cannot use this path: File name too long"),
    BadInput("report-under-file", ("report", "{tmp}/r.json", "-o", "{tmp}/wl.yaml/rep.html"), "is a file, so nothing can be written under it"),
    BadInput("report-malformed-results", ("report", "{tmp}/bad.json", "-o", "{tmp}/rep.html"), "records[0].timing: expected an object, got 'fast'", {"bad.json": mutated(results_document, lambda d: d["records"][0].__setitem__("timing", "fast"))}),
    # run: settings, names and isolation options that would check nothing or escape (docs/validation.md, docs/trust.md)
    BadInput("run-input-sets-zero", run_("--input-sets", "0"), "--input-sets 0: expected an integer >= 1"),
    BadInput("run-iterations-negative", run_("--iterations", "-3"), "--iterations -3: expected an integer >= 1"),
    BadInput("run-timeout-infinite", run_("--case-timeout", "inf"), "--case-timeout"),
    BadInput("run-tolerance-nan", run_(), "settings.atol", {"wl.yaml": WORKLOAD.replace("  seed: 1\n", "  seed: 1\n  atol: .nan\n")}),
    BadInput("run-worker-user-unknown", run_("--worker-user", "root"), "--worker-user 'root': expected one of auto, harness"),
    BadInput("run-impostor-reference", run_("-s", "{tmp}/imp"), "the solution name 'reference' is reserved", {"imp/solution.yaml": MANIFEST.replace("name: mine", "name: reference"), "imp/k.py": KERNEL}),
    BadInput("run-trace-blob-outside", run_(), "outside", {"trace.jsonl": TRACE_LINE.replace('"inputs":{', '"inputs":{"q_index_fp8":{"type":"safetensors","path":"../x.safetensors","tensor_key":"q"},')}),
]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (its sha256) and folder under ``folder``, hidden ones included."""
    found = {}
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        found[rel] = "folder" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def invoke(args: list[str], env: dict[str, str] | None = None):
    """The command in process, as ``dsa-bench`` runs it (the app maps DsaBenchError to exit 2)."""
    return CliRunner().invoke(app, args, env=env, catch_exceptions=True)


@pytest.mark.parametrize("entry", CORPUS, ids=[e.name for e in CORPUS])
def test_bad_input_is_refused_cleanly(entry: BadInput, tmp_path: Path) -> None:
    for rel, content in {**BASE_FILES, **entry.files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, int):
            with path.open("wb") as f:
                f.truncate(content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
    before = snapshot(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in entry.args]
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in entry.env.items()}
    start = time.perf_counter()
    result = invoke(args, env)
    elapsed = time.perf_counter() - start
    output = result.output
    # anything but a clean exit would have been a traceback for the user
    assert result.exception is None or isinstance(result.exception, SystemExit), (entry.name, repr(result.exception), output)
    assert "Traceback" not in output
    assert result.exit_code == entry.code, (entry.name, output)
    assert entry.expect in output, (entry.name, output)
    assert output.count("\n") <= 3 or entry.code == 0, f"one message, not a dump: {output}"
    assert snapshot(tmp_path) == before, "inputs changed, or something (a temporary file) was left behind"
    assert elapsed < entry.max_seconds, f"{entry.name} took {elapsed:.1f} s"


def test_the_real_entry_point_maps_errors_to_exit_2(tmp_path: Path) -> None:
    """The console script, in a real process: `report R.json -o R.json` leaves R.json as it was."""
    results = tmp_path / "r.json"
    results.write_text(RESULTS)
    proc = run_cli("report", str(results), "-o", str(results))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--output: this is an input of the command" in proc.stderr and "Traceback" not in proc.stderr
    assert results.read_text() == RESULTS and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_valid_files_still_pass(tmp_path: Path) -> None:
    """The corpus's starting files are good: each refusal above is caused by its own change."""
    for rel, content in BASE_FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    assert invoke(["validate", str(tmp_path / "wl.yaml"), str(tmp_path / "sol")]).exit_code == 0
    assert invoke(["compare", str(tmp_path / "r.json"), "-b", str(tmp_path / "baseline.json")]).exit_code == 0
    result = invoke(["baseline", "update", str(tmp_path / "r.json"), "-b", str(tmp_path / "baseline.json"), "--replace"])
    assert result.exit_code == 0, result.output
    (tmp_path / "p.json").write_text(packed([{"path": "lib/x.py", "content": "x = 1\n"}]))
    assert invoke(["unpack", str(tmp_path / "p.json"), str(tmp_path / "dest")]).exit_code == 0
    assert (tmp_path / "dest" / "lib" / "x.py").read_text() == "x = 1\n"
    result = invoke(["pack", str(tmp_path / "sol"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    result = invoke(["pack", str(tmp_path / "sol"), "-o", str(tmp_path / "out")])  # replacing its own output is fine
    assert result.exit_code == 0, result.output
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or ".dsa-bench-unpack-" in p.name]
    check_results_path(tmp_path / "r.json", [tmp_path / "wl.yaml"], [tmp_path / "sol"])  # an earlier results file may be replaced
    check_results_path(tmp_path / "new" / "r.json", [], [])


def test_repository_results_and_baselines_pass_the_checks() -> None:
    """Every results file and baseline committed to the repository is valid under the models."""
    checked = 0
    for path in sorted([*(ROOT / "benchmarks").rglob("*.json"), *(ROOT / "baselines").glob("*.json")]):
        kind = json.loads(path.read_text()).get("format")
        if kind == "dsa-bench-results":
            load_results(path)
            checked += 1
        elif kind == "dsa-bench-baseline":
            load_baseline(path)
            checked += 1
    assert checked >= 2


def test_a_written_record_reads_back_as_itself() -> None:
    """What a run writes (derived figures, host samples, the fallback note) is what a reader accepts."""
    timing = Timing.model_construct(timer="cuda_events", samples_ms=[[1.0, 2.0], [1.5, 1.0]], host_samples_ms=[[3.0], [3.5]],
                                    timer_fallback="no CUPTI", clocks=[{"after_warmup": {"sm_mhz": 1980}, "after_timing": None}])  # fmt: skip
    record = CaseRecord.new(case="c", solution="s", axes={"n": 1}, status=Status.PASSED, timing=timing, speedup=1.5, gpu=0)
    written = json.loads(json.dumps(record.model_dump()))
    assert written["status"] == "PASSED" and written["timing"]["mean_ms"] == timing.mean_ms
    assert CaseRecord.model_validate(written) == CaseRecord.model_validate(record.model_dump())
    assert CaseRecord.model_validate(written).model_dump() == record.model_dump()
    assert {"case", "solution", *dataclasses.asdict(CaseMeasure(status="PASSED"))} == set(BaselineCaseModel.model_fields)


def test_progress_shows_markup_literally() -> None:
    """Brackets in a case id or solution name are shown as they are and cannot stop the display."""
    from rich.console import Console

    from dsa_bench.cli import _progress

    out = io.StringIO()
    with _progress(Console(file=out, force_terminal=True, width=160)) as progress:
        task = progress.add_task("[/]start", total=2)
        progress.update(task, advance=1, description="case[/] [bold]x[/bold] [reference] PASSED")
        progress.refresh()
    assert "case[/] [bold]x[/bold] [reference] PASSED" in out.getvalue()


def test_report_draws_dollar_signs_literally(tmp_path: Path) -> None:
    """A $ in a case or solution name would be mathtext (an unparsable formula raises)."""
    results = tmp_path / "r.json"
    results.write_text(json.dumps(results_document(case="c$\\frac$", solution="tri$^$ton")))
    result = invoke(["report", str(results), "-o", str(tmp_path / "rep.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep-wl-latency.png").read_bytes().startswith(b"\x89PNG")


def test_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsa_bench import files

    target = tmp_path / "doc.json"
    target.write_text("old")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DsaBenchError, match="cannot write results file"):
        files.write_atomic(tmp_path / "folder", "new", "results")  # os.replace onto a folder fails
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(target, "new", "results")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json", "folder"], "no temporary file is left"


def test_failed_unpack_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsa_bench.pack import pack as packing

    doc = tmp_path / "p.json"
    doc.write_text(packed([{"path": "lib/x.py", "content": "x = 1\n"}]))
    calls = []

    def failing_write(self: Path, text: str, encoding: str | None = None) -> int:
        calls.append(self)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(self))
        return Path.write_bytes(self, text.encode())

    with monkeypatch.context() as patch:
        patch.setattr(packing.Path, "write_text", failing_write)
        with pytest.raises(DsaBenchError, match="No space left on device"):
            packing.unpack_solutions([doc], tmp_path / "new" / "dest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"], "no destination, parent or staging folder is left"

    def failing_rename(source: str, target: str) -> None:
        raise OSError(18, "Invalid cross-device link", str(target))

    monkeypatch.setattr(packing.os, "rename", failing_rename)
    with pytest.raises(DsaBenchError, match="Invalid cross-device link"):
        packing.unpack_solutions([doc], tmp_path / "new" / "dest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"], "the parent made for the destination is removed again"


def test_packing_odd_strings_in_sources_is_not_an_error(tmp_path: Path) -> None:
    """String literals naming impossible files (too long, absolute globs) are not files of the folder."""
    from dsa_bench.pack.pack import pack_solution

    (tmp_path / "sol").mkdir()
    (tmp_path / "sol" / "solution.yaml").write_text(MANIFEST)
    (tmp_path / "sol" / "k.py").write_text(KERNEL + f"A = {'n' * 280 + '.cu'!r}\nB = '/usr/include/*.cu'\nC = 'x\\x00.cu'\n")
    (item,) = pack_solution(tmp_path / "sol", tmp_path / "out")
    assert [s["path"] for s in item.document["sources"]] == ["k.py"]


# --------------------------------------------------------------------------- names, paths, settings and traces


INDEXER_DEFINITION = get_definition(idx.NAME)
ATTENTION = get_definition(attn.NAME)
IMPOSTOR = FIXTURES / "solutions" / "impostor_reference"
CPU = torch.device("cpu")


def invoke_run(*args: str) -> BaseException | None:
    """``dsa-bench run ARGS`` in process; the exception it ended with (None if it exited cleanly)."""
    result = CliRunner().invoke(app, ["run", *args, "--no-save"])
    if result.exit_code == EXIT_BAD_INPUT:  # the command group printed the DsaBenchError: rebuild it
        message = result.stderr.strip().removeprefix("error: ")
        return DsaBenchError(" ".join(message.split()))  # the console wraps long lines
    return result.exception


def write_solution(folder: Path, name: str, definition: str = idx.NAME) -> Path:
    folder.mkdir(parents=True)
    (folder / "solution.yaml").write_text(
        json.dumps(
            {
                "name": name,
                "author": "tests",
                "target_hardware": ["cpu"],
                "entries": {definition: {"entry_point": "kernel.py::kernel", "language": "python"}},
            }
        )
    )
    (folder / "kernel.py").write_text("def kernel(*args):\n    return None\n")
    return folder


# --------------------------------------------------------------------------- names


def test_safe_file_name_keeps_plain_names_and_makes_the_rest_safe_and_distinct():
    for plain in ("triton", "reference", "my-kernel_v2.1"):
        assert safe_file_name(plain) == plain
    hostile = ["../../x", "..", ".", "", "a/b", "a\\b", "a_b-", "-rf", ".hidden", "é", "x" * 500, "a\x00b", "triton-0123456789abcdef"]
    made = [safe_file_name(n) for n in hostile]
    for name, safe in zip(hostile, made, strict=True):
        assert safe and safe not in (".", "..") and safe[0] not in ".-", (name, safe)
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in safe), (name, safe)
        assert len(safe) <= MAX_FILE_NAME and Path(safe).name == safe
    assert len(set(made)) == len(made)
    assert safe_file_name("a/b") != safe_file_name("a_b") != safe_file_name("a?b")
    # a name that looks hashed is hashed again, so no plain name equals another name's hashed form
    assert safe_file_name(safe_file_name("a/b")) != safe_file_name("a/b")


def test_two_solutions_with_one_name_are_refused_naming_both_folders(tmp_path):
    copy = tmp_path / "raises"
    shutil.copytree(FIXTURES / "solutions" / "raises", copy)
    error = invoke_run("-w", "indexer_smoke", "-s", str(FIXTURES / "solutions" / "raises"), "-s", str(copy))
    assert isinstance(error, DsaBenchError)
    assert f"two solutions are named 'raises': {(FIXTURES / 'solutions' / 'raises').resolve()} and {copy.resolve()}" in str(error)
    assert "names must be unique within a run" in str(error)
    error = invoke_run("-w", "indexer_smoke", "-s", str(copy), "-s", str(copy))
    assert isinstance(error, DsaBenchError) and f"solution 'raises' ({copy.resolve()}) is given twice" in str(error)


def test_a_folder_claiming_the_reference_name_is_refused():
    error = invoke_run("-w", "indexer_smoke", "-s", str(IMPOSTOR))
    assert isinstance(error, DsaBenchError)
    message = str(error)
    assert message.startswith(f"{IMPOSTOR.resolve() / 'solution.yaml'}: the solution name 'reference' is reserved")
    assert str(ROOT / "solutions" / "reference") in message and "give this solution another name" in message


def test_an_impostor_reference_under_solutions_is_not_taken_for_the_reference(tmp_path, monkeypatch):
    # It sorts before solutions/reference and used to be picked as the reference (so a kernel
    # writing nothing "passed" and set the speedup baseline).
    project = tmp_path / "project"
    (project / "workloads").mkdir(parents=True)
    shutil.copy(ROOT / "workloads" / "indexer_smoke.yaml", project / "workloads")
    shutil.copytree(ROOT / "traces", project / "traces")
    shutil.copytree(ROOT / "solutions" / "reference", project / "solutions" / "reference")
    shutil.copytree(IMPOSTOR, project / "solutions" / "aaa_impostor")
    monkeypatch.setenv("DSA_BENCH_ROOT", str(project))
    error = invoke_run("-w", "indexer_smoke")
    assert isinstance(error, DsaBenchError)
    assert "aaa_impostor/solution.yaml: the solution name 'reference' is reserved" in str(error)


def test_the_project_reference_and_a_dataset_reference_may_use_the_name(tmp_path):
    reference = load_solution(ROOT / "solutions" / "reference")
    generated = write_solution(tmp_path / "generated", "reference")
    check_run_solutions([reference], [ROOT / "solutions" / "reference"])
    check_run_solutions([load_solution(generated)], [ROOT / "solutions" / "reference", generated])
    with pytest.raises(DsaBenchError, match="the solution name 'reference' is reserved"):
        check_run_solutions([load_solution(generated)], [ROOT / "solutions" / "reference"])


def test_manifest_name_must_be_a_printable_string(tmp_path):
    folder = write_solution(tmp_path / "s", "x")
    for bad in (["a"], "", "two\nlines", 3):
        data = json.loads((folder / "solution.yaml").read_text())
        (folder / "solution.yaml").write_text(json.dumps({**data, "name": bad}))
        with pytest.raises(DsaBenchError, match="field 'name' must be a non-empty string of printable characters"):
            load_solution(folder)


def test_pack_names_cannot_leave_the_output_folder(tmp_path, monkeypatch):
    folder = write_solution(tmp_path / "src" / "evil", "../../escaped")
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    (item,) = pack_solution(folder)  # default folder: packed/<solution name>/
    safe = safe_file_name("../../escaped")
    assert item.path == Path("packed") / safe / f"{safe_file_name('../../escaped_' + idx.NAME)}.json"
    assert item.path.is_file() and json.loads(item.path.read_text())["name"] == f"../../escaped_{idx.NAME}"
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert written == [f"work/deep/{item.path.as_posix()}"], "nothing is written outside packed/"
    # an entry key (a definition name) reaches the file name too
    manifest = json.loads((folder / "solution.yaml").read_text())
    manifest["entries"] = {"../../../outside": manifest["entries"][idx.NAME]}
    (folder / "solution.yaml").write_text(json.dumps({**manifest, "name": "ok"}))
    (item,) = pack_solution(folder, tmp_path / "out")
    assert item.path.parent == tmp_path / "out" and item.path.name == f"{safe_file_name('ok_../../../outside')}.json"


# --------------------------------------------------------------------------- paths


def write_trace(folder: Path, cases: list[dict], definition: str = idx.NAME) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    (folder / "w.yaml").write_text(f"name: t\ndefinition: {definition}\ntrace: t.jsonl\n")
    return folder / "w.yaml"


def attention_case(**inputs) -> dict:
    return {"id": "c", "axes": {"num_tokens": 2, "num_pages": 4}, "inputs": inputs}


def test_trace_safetensors_paths_stay_in_the_trace_folder(tmp_path):
    indices = torch.full((2, 2048), -1, dtype=torch.int32)
    save_file({"idx": indices}, str(tmp_path / "outside.safetensors"))
    traces = tmp_path / "traces"
    source = {"type": "safetensors", "tensor_key": "idx"}
    attacks = {
        "../outside.safetensors": "inputs.sparse_indices.path: path '../outside.safetensors' resolves to",
        str(tmp_path / "outside.safetensors"): "resolves to",
        "link.safetensors": "inputs.sparse_indices.path: path 'link.safetensors' resolves to",
    }
    traces.mkdir()
    os.symlink(tmp_path / "outside.safetensors", traces / "link.safetensors")
    for path, fragment in attacks.items():
        wl = write_trace(traces, [attention_case(sparse_indices={**source, "path": path})], attn.NAME)
        with pytest.raises(DsaBenchError) as info:
            load_workload(wl)
        message = str(info.value)
        assert message.startswith(f"{traces / 't.jsonl'}:1: ") and fragment in message and f"outside {traces}" in message
    # inside the folder (a sub-folder) is fine
    (traces / "blobs").mkdir()
    save_file({"idx": indices}, str(traces / "blobs" / "in.safetensors"))
    wl = write_trace(traces, [attention_case(sparse_indices={**source, "path": "blobs/in.safetensors"})], attn.NAME)
    assert load_workload(wl).cases[0].inputs["sparse_indices"].path == (traces / "blobs" / "in.safetensors").resolve()


RMSNORM = {
    "name": "rmsnorm_h64",
    "op_type": "rmsnorm",
    "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 64}},
    "inputs": {"x": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "outputs": {"y": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "reference": "def run(x):\n    return x\n",
}


def write_dataset(root: Path, inputs: dict, axes: dict | None = None) -> Path:
    (root / "definitions").mkdir(parents=True, exist_ok=True)
    (root / "definitions" / "rmsnorm_h64.json").write_text(json.dumps(RMSNORM))
    (root / "workloads").mkdir(exist_ok=True)
    line = {"definition": "rmsnorm_h64", "solution": None, "workload": {"uuid": "u0", "axes": axes or {"batch_size": 2}, "inputs": inputs}}
    (root / "workloads" / "rmsnorm_h64.jsonl").write_text(json.dumps(line) + "\n")
    return root


def test_dataset_blob_paths_stay_in_the_dataset(tmp_path):
    save_file({"x": torch.zeros(2, 64, dtype=torch.bfloat16)}, str(tmp_path / "outside.safetensors"))
    root = write_dataset(tmp_path / "dataset", {"x": {"type": "safetensors", "path": "blob/../../outside.safetensors", "tensor_key": "x"}})
    with pytest.raises(DsaBenchError) as info:
        load_dataset_workload(root, "rmsnorm_h64")
    assert str(info.value).startswith(
        f"{root / 'workloads' / 'rmsnorm_h64.jsonl'}:1: inputs.x.path: path 'blob/../../outside.safetensors' resolves to"
    )


def test_manifest_entry_linking_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere.py").write_text("def kernel(*args):\n    return None\n")
    folder = write_solution(tmp_path / "s", "linked")
    (folder / "kernel.py").unlink()
    os.symlink(tmp_path / "elsewhere.py", folder / "kernel.py")
    with pytest.raises(
        DsaBenchError, match=rf"entries.{idx.NAME}: 'kernel.py' lies outside the solution folder \(it resolves to .*elsewhere.py\)"
    ):
        load_solution(folder)


def packed_document(tmp_path: Path) -> dict:
    (item,) = pack_solution(write_solution(tmp_path / "src", "p"), tmp_path / "packed")
    return item.document


def test_unpack_refuses_paths_that_leave_or_confuse_the_destination(tmp_path):
    doc = packed_document(tmp_path)
    bad_paths = {
        "a/../../x.py": "must be relative, with '/' separators and no '..'",
        "/etc/x.py": "must be relative",
        ".": "expected a normalised path",
        "sub//x.py": "expected a normalised path",
        "sub/./x.py": "expected a normalised path",
    }
    for i, (path, fragment) in enumerate(bad_paths.items()):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(json.dumps({**doc, "sources": doc["sources"] + [{"path": path, "content": "x = 1\n"}]}))
        with pytest.raises(DsaBenchError, match=f"^{bad}: sources\\[1\\]"):
            unpack_solutions([bad], tmp_path / f"dest{i}")
        with pytest.raises(DsaBenchError) as info:
            unpack_solutions([bad], tmp_path / f"dest{i}")
        assert fragment in str(info.value)
    clash = tmp_path / "clash.json"
    clash.write_text(
        json.dumps({**doc, "sources": doc["sources"] + [{"path": "sub", "content": "x\n"}, {"path": "sub/x.py", "content": "x = 1\n"}]})
    )
    with pytest.raises(DsaBenchError, match=r"sources\[1\].path 'sub': is a file, but other sources lie inside it as a folder"):
        unpack_solutions([clash], tmp_path / "dest_clash")


def test_unpack_does_not_follow_a_link_out_of_a_forced_destination(tmp_path):
    doc = packed_document(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "lib")
    packed = tmp_path / "linked.json"
    packed.write_text(json.dumps({**doc, "sources": doc["sources"] + [{"path": "lib/x.py", "content": "x = 1\n"}]}))
    with pytest.raises(
        DsaBenchError, match=rf"^{dest}: {dest}/lib is a file \(or a link\), but the unpacked source lib/x.py must go inside it"
    ):
        unpack_solutions([packed], dest, force=True)
    assert not any(outside.iterdir()) and not (dest / "kernel.py").exists(), "nothing is written when one path is refused"


# --------------------------------------------------------------------------- settings

BAD_SETTINGS = [
    ("input_sets", "0", "expected an integer >= 1"),
    ("input_sets", "65", "expected an integer <= 64"),
    ("iterations", "0", "expected an integer >= 1"),
    ("iterations", "-5", "expected an integer >= 1"),
    ("iterations", "100001", "expected an integer <= 100000"),
    ("trials", "0", "expected an integer >= 1"),
    ("trials", "101", "expected an integer <= 100"),
    ("warmup", "-1", "expected an integer >= 0"),
    ("warmup", "100001", "expected an integer <= 100000"),
    ("seed", "-1", "expected an integer >= 0"),
    ("seed", "1.5", "expected an integer in [0, 9223372036854775807]"),
    ("trials", "true", "expected an integer in [1, 100]"),
    ("iterations", "'50'", "expected an integer in [1, 100000]"),
    ("atol", ".nan", "expected a finite number >= 0"),
    ("rtol", ".inf", "expected a finite number >= 0"),
    ("score_rtol", "-1.0e-4", "expected a finite number >= 0"),
    ("atol", "loose", "expected a finite number >= 0"),
    ("rtol", "false", "expected a finite number >= 0"),
    ("atol", "1" + "0" * 400, "expected a finite number >= 0"),
]


@pytest.mark.parametrize("key,value,expected", BAD_SETTINGS)
def test_bad_workload_settings_are_refused(tmp_path, key, value, expected):
    shutil.copy(ROOT / "traces" / "indexer_smoke.jsonl", tmp_path / "t.jsonl")
    path = tmp_path / "w.yaml"
    path.write_text(f"name: w\ndefinition: {idx.NAME}\ntrace: t.jsonl\nsettings:\n  {key}: {value}\n")
    with pytest.raises(DsaBenchError) as info:
        load_workload(path)
    assert str(info.value).startswith(f"{path}: settings.{key} = ")
    assert str(info.value).endswith(f": {expected}")


def test_good_workload_settings_at_their_bounds_load(tmp_path):
    shutil.copy(ROOT / "traces" / "indexer_smoke.jsonl", tmp_path / "t.jsonl")
    path = tmp_path / "w.yaml"
    path.write_text(
        f"name: w\ndefinition: {idx.NAME}\ntrace: t.jsonl\n"
        "settings: {seed: 0, input_sets: 64, warmup: 0, iterations: 100000, trials: 100, atol: 0, rtol: 0.5, score_rtol: 0}\n"
    )
    settings = load_workload(path).settings
    assert (settings.input_sets, settings.warmup, settings.iterations, settings.trials) == (64, 0, 100000, 100)
    assert settings.tolerance.atol == 0.0 and isinstance(settings.tolerance.atol, float)


BAD_OPTIONS = [
    (["--input-sets", "0"], "--input-sets 0: expected an integer >= 1"),
    (["--input-sets", "1000"], "--input-sets 1000: expected an integer <= 64"),
    (["--iterations", "0"], "--iterations 0: expected an integer >= 1"),
    (["--iterations", "-1"], "--iterations -1: expected an integer >= 1"),
    (["--trials", "0"], "--trials 0: expected an integer >= 1"),
    (["--trials", "1000"], "--trials 1000: expected an integer <= 100"),
    (["--warmup", "-1"], "--warmup -1: expected an integer >= 0"),
    (["--warmup", "1000000"], "--warmup 1000000: expected an integer <= 100000"),
    (["--seed", "-3"], "--seed -3: expected an integer >= 0"),
    (["--case-timeout", "0"], "--case-timeout 0: expected a finite number of seconds > 0 and <= 86400"),
    (["--case-timeout", "-5"], "--case-timeout -5: expected a finite number of seconds > 0 and <= 86400"),
    (["--case-timeout", "inf"], "--case-timeout inf: expected a finite number of seconds > 0 and <= 86400"),
    (["--case-timeout", "nan"], "--case-timeout nan: expected a finite number of seconds > 0 and <= 86400"),
    (["--compile-timeout", "0"], "--compile-timeout 0: expected a finite number of seconds > 0 and <= 86400"),
    (["--compile-timeout", "1e9"], "--compile-timeout 1e+09: expected a finite number of seconds > 0 and <= 86400"),
]


@pytest.mark.parametrize("options,expected", BAD_OPTIONS)
def test_bad_run_options_are_refused(options, expected):
    error = invoke_run("-w", "indexer_smoke", *options)
    assert isinstance(error, DsaBenchError) and str(error) == expected


def test_a_bad_option_exits_2_without_traceback():
    proc = run_cli("run", "-w", "indexer_smoke", "--input-sets", "0", "--no-save")
    assert proc.returncode == 2 and "--input-sets 0: expected an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- traces


def indexer_case(axes: dict | None = None, **inputs) -> dict:
    return {"id": "c", "axes": axes or {"batch_size": 2, "max_num_pages": 3, "num_pages": 16}, "inputs": inputs}


def trace_error(tmp_path: Path, case: dict, definition: str = idx.NAME) -> str:
    wl = write_trace(tmp_path, [case], definition)
    with pytest.raises(DsaBenchError) as info:
        load_workload(wl)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 't.jsonl'}:1: case 'c': "), message
    return message


@pytest.mark.parametrize(
    "params,expected",
    [
        ({"max": math.nan}, "seq_lens.params.max = nan must be an integer"),
        ({"max": math.inf}, "seq_lens.params.max = inf must be an integer"),
        ({"min": -math.inf}, "seq_lens.params.min = -inf must be an integer"),
        ({"max": "100"}, "seq_lens.params.max = '100' must be an integer"),
        ({"max": True}, "seq_lens.params.max = True must be an integer"),
        ({"min": 2.0}, "seq_lens.params.min = 2.0 must be an integer"),
        ({"min": None}, "seq_lens.params.min = None must be an integer"),
        ({"min": 100, "max": 10}, "seq_lens.params: min = 100 is above max = 10"),
        ({"max": 0}, "seq_lens.params: min = 1 (the default) is above max = 0"),
        ({"min": 193}, "seq_lens.params: min = 193 is above max = 192 (the default, max_num_pages*64)"),
        ({"min": -1}, "seq_lens.params.min = -1 is negative"),
        ({"max": 193}, "seq_lens.params.max = 193 exceeds max_num_pages*64 = 192"),
        ({"mean": 50}, "seq_lens.params.mean is not a generator parameter (its parameters are min, max)"),
    ],
)
def test_bad_seq_lens_parameters(tmp_path, params, expected):
    assert expected in trace_error(tmp_path, indexer_case(seq_lens={"type": "random", "params": params}))


def test_bad_parameters_of_other_indexer_inputs(tmp_path):
    for params, expected in [
        ({"distinct_keys": math.nan}, "k_index_cache_fp8.params.distinct_keys = nan must be an integer"),
        ({"distinct_keys": 0}, "k_index_cache_fp8.params.distinct_keys = 0 must be in [1, num_pages*64 = 1024]"),
        ({"distinct_keys": 10**12}, "k_index_cache_fp8.params.distinct_keys = 1000000000000 must be in [1, num_pages*64 = 1024]"),
        ({"distinct": 4}, "k_index_cache_fp8.params.distinct is not a generator parameter "
                          "(its parameters are distinct_keys, near_constant_rows, near_constant_spread)"),
    ]:
        assert expected in trace_error(tmp_path, indexer_case(k_index_cache_fp8={"type": "random", "params": params}))
    message = trace_error(tmp_path, indexer_case(weights={"type": "random", "params": {"offset": 2}}))
    assert "weights.params.offset is not a generator parameter (its parameters are sign, scale)" in message
    message = trace_error(tmp_path, indexer_case(q_index_fp8={"type": "random", "params": {"scale": 2}}))
    assert "q_index_fp8.params.scale is not a generator parameter (its generator takes none)" in message


def test_random_seq_lens_with_an_explicit_block_table_check_every_reachable_entry(tmp_path):
    # Rows drawn up to 100 tokens reach 2 pages; entry [1][1] = 99 is no page. Only some seeds
    # draw a row that long, and those used to fail as the reference failing.
    table = {"type": "explicit", "values": [[1, 2, 99], [3, 99, 5]]}
    message = trace_error(tmp_path, indexer_case(seq_lens={"type": "random", "params": {"max": 100}}, block_table=table))
    assert "block_table[1][1] = 99 is not a page id in [0, num_pages = 16)" in message
    assert "(random seq_lens up to max = 100 reach the first 2 entries of every row)" in message
    twice = {"type": "explicit", "values": [[1, 1, 99], [3, 4, 99]]}
    message = trace_error(tmp_path, indexer_case(seq_lens={"type": "random", "params": {"max": 100}}, block_table=twice))
    assert "block_table[0] lists a page twice among its first 2 entries" in message
    # entries no allowed length reaches may hold anything; every seed then builds and runs
    table = {"type": "explicit", "values": [[1, 2, -7], [3, 4, 99]]}
    (case,) = load_workload(
        write_trace(tmp_path, [indexer_case(seq_lens={"type": "random", "params": {"min": 0, "max": 128}}, block_table=table)])
    ).cases
    for seed in range(12):
        inputs = build_inputs(INDEXER_DEFINITION, case, seed, CPU)
        INDEXER_DEFINITION.reference(**inputs)


def test_random_seq_lens_and_random_pages_must_fit_the_page_pool(tmp_path):
    axes = {"batch_size": 2, "max_num_pages": 3, "num_pages": 4}
    message = trace_error(tmp_path, indexer_case(axes, seq_lens={"type": "random"}))
    assert (
        "random seq_lens up to max = 192 may need 2 x 3 = 6 pages but num_pages = 4; lower seq_lens.params.max or raise num_pages"
        in message
    )
    # at the bound, no seed draws an impossible allocation
    (case,) = load_workload(write_trace(tmp_path, [indexer_case(axes, seq_lens={"type": "random", "params": {"max": 128}})])).cases
    for seed in range(20):
        inputs = build_inputs(INDEXER_DEFINITION, case, seed, CPU)
        assert int(inputs["seq_lens"].max()) <= 128


def test_bad_sparse_attention_parameters(tmp_path):
    def indices(**params) -> dict:
        return {"type": "random", "params": params}

    cases = [
        (attention_case(sparse_indices=indices(valid_counts=[True, 3])), "sparse_indices.params.valid_counts[0] = True must be an integer"),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, math.nan])),
            "sparse_indices.params.valid_counts[1] = nan must be an integer",
        ),
        (attention_case(sparse_indices=indices(valid_counts=[3, "4"])), "sparse_indices.params.valid_counts[1] = '4' must be an integer"),
        (
            attention_case(sparse_indices=indices(valid_counts=None)),
            "sparse_indices.params.valid_counts = None, expected a list of num_tokens = 2 integers",
        ),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, 2049])),
            "sparse_indices.params.valid_counts[1] = 2049 is not in [0, 2048]",
        ),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, 3], context_tokens=[3, math.inf])),
            "sparse_indices.params.context_tokens[1] = inf must be an integer",
        ),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, 3], context_tokens=[3, 2])),
            "sparse_indices.params.context_tokens[1] = 2 is below valid_counts[1] = 3",
        ),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, 3], context_tokens=[3, 10**15])),
            "the rows need 15625000000001 pages of 64 tokens but num_pages = 4",
        ),
        (attention_case(sparse_indices=indices(context_tokens=[100, 100])), "sparse_indices.params.context_tokens needs valid_counts"),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, 3], padding="middle")),
            "sparse_indices.params.padding = 'middle', expected 'tail' or 'scattered'",
        ),
        (
            attention_case(sparse_indices=indices(valid_counts=[3, 3], pad="tail")),
            "sparse_indices.params.pad is not a generator parameter (its parameters are valid_counts, context_tokens, padding)",
        ),
        (attention_case(q_nope=indices(scale=3)), "q_nope.params.scale is not a generator parameter (its generator takes none)"),
        # without valid_counts a token draws up to 2048 valid slots: 32 pages each
        (
            attention_case(sparse_indices=indices()),
            "random valid counts (up to 2048 per token) may need 2 x 32 = 64 pages of 64 tokens but num_pages = 4",
        ),
    ]
    for case, expected in cases:
        assert expected in trace_error(tmp_path, case, attn.NAME)


def test_terabyte_shapes_are_refused_before_anything_is_allocated(tmp_path):
    message = trace_error(tmp_path, indexer_case({"batch_size": 10**6, "max_num_pages": 10**6, "num_pages": 16}))
    assert (
        "one input set needs 4016644135168 bytes (3.74e+3 GiB) of inputs and outputs, more than the limit of 68719476736 bytes (64 GiB)"
        in message
    )
    assert "the largest is block_table (1000000, 1000000) int32: 4000000000000 bytes" in message
    message = trace_error(tmp_path, attention_case_axes(num_tokens=1, num_pages=10**7), attn.NAME)
    assert "the largest is ckv_cache (10000000, 64, 512) bfloat16: 655360000000 bytes" in message
    message = trace_error(tmp_path, attention_case_axes(num_tokens=10**400, num_pages=1), attn.NAME)
    assert "one input set needs 4.307e+404 bytes (4.01e+395 GiB) of inputs and outputs, more than the limit" in message
    assert "the largest is q_nope ('num_tokens', 'num_qo_heads', 'head_dim_ckv') bfloat16: 1.638e+404 bytes" in message


def attention_case_axes(**axes) -> dict:
    return {"id": "c", "axes": axes, "inputs": {}}


def test_dataset_generic_definitions_have_the_same_size_bound(tmp_path):
    root = write_dataset(tmp_path / "dataset", {"x": {"type": "random"}}, axes={"batch_size": 10**9})
    with pytest.raises(DsaBenchError) as info:
        load_dataset_workload(root, "rmsnorm_h64")
    message = str(info.value)
    assert message.startswith(f"{root / 'workloads' / 'rmsnorm_h64.jsonl'}:1: case 'u0': one input set needs 256000000000 bytes")
    assert "the largest is x (1000000000, 64) bfloat16: 128000000000 bytes" in message


def test_explicit_values_are_never_truncated_or_wrapped(tmp_path):
    def seq_lens(values) -> dict:
        return indexer_case(seq_lens={"type": "explicit", "values": values})

    for case, expected in [
        (seq_lens([True, 2]), "inputs.seq_lens.values holds True, not an integer (int32)"),
        (seq_lens([1.5, 2]), "inputs.seq_lens.values holds 1.5, not an integer (int32)"),
        (seq_lens([math.nan, 2]), "inputs.seq_lens.values holds nan, not an integer (int32)"),
        # 2**40 used to wrap to a valid-looking 0 in int32
        (seq_lens([2**40, 2]), "inputs.seq_lens.values holds 1099511627776, outside the range of int32 [-2147483648, 2147483647]"),
        (indexer_case(weights={"type": "explicit", "values": [[False] * 64] * 2}), "inputs.weights.values holds False, not a number"),
    ]:
        wl = write_trace(tmp_path, [case])
        with pytest.raises(DsaBenchError) as info:
            load_workload(wl)
        assert str(info.value) == f"{tmp_path / 't.jsonl'}:1: {expected}"


def test_scalars_must_be_finite(tmp_path):
    one_slot_each = {"type": "random", "params": {"valid_counts": [1, 1]}}
    for value, expected in [
        (math.nan, "inputs.sm_scale.value must be a finite number, got nan"),
        (math.inf, "inputs.sm_scale.value must be a finite number, got inf"),
        (10**400, "inputs.sm_scale.value must be a finite number, got 1000"),
    ]:
        wl = write_trace(tmp_path, [attention_case(sm_scale={"type": "scalar", "value": value}, sparse_indices=one_slot_each)], attn.NAME)
        with pytest.raises(DsaBenchError) as info:
            load_workload(wl)
        assert str(info.value).startswith(f"{tmp_path / 't.jsonl'}:1: {expected}")
    case = attention_case(sm_scale={"type": "scalar", "value": 1e300}, sparse_indices=one_slot_each)
    assert "sm_scale = 1e+300 must be in (0, 1]" in trace_error(tmp_path, case, attn.NAME)


# --------------------------------------------------------------------------- the replay of issue 47


def _one_line_refusal(proc, fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr


@pytest.mark.parametrize("count", ["100000", "1" + "0" * 30])
def test_a_device_count_beyond_the_machine_is_refused_at_once(count):
    _one_line_refusal(cli("run", "-w", "indexer_smoke", "--gpus", count, "--no-save"), "--gpus")


def test_a_ray_address_where_nothing_listens_is_refused_within_the_connect_timeout():
    proc = cli("run", "-w", "indexer_smoke", "--executor", "ray", "--ray-address", "127.0.0.1:1", "--no-save")
    _one_line_refusal(proc, "--ray-address 127.0.0.1:1: no Ray cluster answers there within 10 s")


def test_save_and_no_save_together_are_refused(tmp_path):
    proc = cli("run", "-w", "indexer_smoke", "--save", str(tmp_path / "r.json"), "--no-save")
    _one_line_refusal(proc, "contradict each other")


def test_a_workload_folder_and_an_unknown_definition_are_named(tmp_path):
    _one_line_refusal(cli("run", "-w", str(tmp_path), "--no-save"), "is a folder")
    workload = tmp_path / "mine.yaml"
    workload.write_text("definition: dsa_topk_indexer_h64\ntrace: t.jsonl\n")
    proc = cli("run", "-w", str(workload), "--no-save")
    _one_line_refusal(proc, f"{workload}: field 'definition': unknown definition 'dsa_topk_indexer_h64' (closest: ")
    assert "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64" in proc.stderr and len(proc.stderr) < 400, proc.stderr


@pytest.mark.parametrize("args", [["--layers", "1000000000"], ["--indexer-alignment", "0"], ["--indexer-alignment", "-16"],
                                  ["--indexer-alignment", "3"], ["--block-size", "0"]])  # fmt: skip
def test_layout_ranges_are_checked(args):
    _one_line_refusal(cli("layout", "--with-indexer", *args), args[0])


def test_layout_accepts_the_formats_own_alignments():
    from dsa_bench.definitions.kv_records import V4  # its alignment is no power of two

    assert cli("layout", "V41", "--with-indexer", "--indexer-alignment", str(V4.page_alignment), "--layers", "5").returncode == 0


def test_compare_of_a_file_without_records_is_refused(tmp_path):
    full = write_results(tmp_path / "full.json", "indexer_h64", {"c0": {"reference": 1.0, "triton": 0.5}})
    header = {k: v for k, v in json.loads(full.read_text()).items() if k not in ("records", "complete", "finished", "created", "format")}
    empty = tmp_path / "interrupted.json"
    ResultsFile(empty, ResultsHeader.model_validate(header)).update(complete=False)
    proc = cli("compare", str(empty), "--baseline", str(ROOT / "baselines" / "h200.json"))
    _one_line_refusal(proc, "holds no records (an interrupted run): nothing to compare")


def test_merge_of_an_interrupted_part_is_incomplete_and_no_baseline(tmp_path):
    part = write_results(tmp_path / "part.json", "indexer_h64", {"c0": {"reference": 1.0, "triton": 0.5}, "c1": {"reference": 1.0}})
    doc = json.loads(part.read_text())
    doc.update(complete=False, cases=["c0", "c1"])  # stopped before triton ran c1
    part.write_text(json.dumps(doc))
    merged = tmp_path / "merged.json"
    assert cli("results", "merge", str(part), "-o", str(merged)).returncode == 0
    assert json.loads(merged.read_text())["complete"] is False
    proc = cli("baseline", "update", str(merged), "--baseline", str(tmp_path / "baseline.json"))
    _one_line_refusal(proc, "incomplete")
    assert not (tmp_path / "baseline.json").exists()


def test_resume_of_a_file_with_a_case_the_workload_lacks_is_refused(tmp_path):
    from dsa_bench.run.plan import plan_run
    from dsa_bench.run.request import RunRequest

    save = tmp_path / "run.json"
    plan = plan_run(RunRequest(workload="indexer_smoke", solutions=["reference"], cases=["smoke_scored"], device="cpu", save=save), ROOT)
    ghost = CaseRecord(case="ghost_case", solution="reference", axes={"batch_size": 1}, status=Status.PASSED)
    ResultsFile(save, plan.header(), [ghost]).update(complete=False)
    proc = cli("run", "-w", "indexer_smoke", "-s", "reference", "-c", "smoke_scored", "--device", "cpu", "--resume", str(save))
    _one_line_refusal(proc, "records[0] holds case 'ghost_case', which this run does not have")


def test_export_never_overwrites_a_dataset_workload_file(tmp_path):
    from dataset_files import _dataset

    from dsa_bench.flashinfer_bench.dataset import load_dataset_workload

    root = _dataset(tmp_path / "dataset", "def run(hidden_states, weight, eps):\n    return hidden_states\n")
    lines = root / "workloads" / "rmsnorm_h64.jsonl"
    rows = [{**json.loads(line), "evaluation": None} for line in lines.read_text().splitlines()]  # as the ecosystem writes them
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = lines.read_bytes()
    workload = load_dataset_workload(root, "rmsnorm_h64")
    full = write_results(tmp_path / "shape.json", "x", {"r0": {"reference": 1.0}}, timed=False)
    header = {k: v for k, v in json.loads(full.read_text()).items() if k not in ("records", "complete", "finished", "created", "format")}
    header["workload"] = {"name": "rmsnorm_h64", "path": str(lines), "trace": str(lines), "definition": workload.definition.name,
                          "dataset": str(root)}  # fmt: skip
    header["solutions"] = {"reference": {"path": "solutions/reference", "content_hash": "aa"}}
    results = tmp_path / "results.json"
    record = CaseRecord(case="r0", solution="reference", axes={"batch_size": 2}, status=Status.PASSED)
    ResultsFile(results, ResultsHeader.model_validate(header), [record]).update(complete=True)
    proc = cli("export", str(results), "-o", str(lines))
    _one_line_refusal(proc, "--output")
    assert lines.read_bytes() == before
    assert cli("export", str(results), "-o", str(tmp_path / "traces.jsonl")).returncode == 0  # the same export elsewhere is fine
