"""Malformed input through every command: one clear message, the documented exit code, no
traceback, and no data loss (every file byte-identical afterwards, no temporary file left).

``CORPUS`` is the table to extend: each entry writes its files into a fresh folder, runs one
command in process (``CliRunner`` on the real app, whose group maps DsaBenchError to exit 2
exactly as for a user), and names a fragment the message must hold.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from typer.testing import CliRunner

from dsa_bench.cli import app
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import MAX_TEXT_BYTES
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
