"""Names, paths, settings and traces chosen to break the harness each get one clear message.

Every attack here once passed silently, wrote outside its folder, or surfaced later as the
reference failing (or as an allocation attempt); now the loader or the command line refuses it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, run_cli
from safetensors.torch import save_file
from typer.testing import CliRunner

from dsa_bench import cli
from dsa_bench.definitions import get_definition
from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.errors import DsaBenchError
from dsa_bench.flashinfer_bench.dataset import load_dataset_workload
from dsa_bench.pack.pack import pack_solution, unpack_solutions
from dsa_bench.paths import MAX_FILE_NAME, safe_file_name
from dsa_bench.project import check_run_solutions
from dsa_bench.solution import load_solution
from dsa_bench.workloads import build_inputs, load_workload

INDEXER = get_definition(idx.NAME)
ATTENTION = get_definition(attn.NAME)
IMPOSTOR = FIXTURES / "solutions" / "impostor_reference"
CPU = torch.device("cpu")


def invoke_run(*args: str) -> BaseException | None:
    """``dsa-bench run ARGS`` in process; the exception it ended with (None if it exited cleanly)."""
    result = CliRunner().invoke(cli.app, ["run", *args, "--no-save"])
    if result.exit_code == cli.EXIT_BAD_INPUT:  # the command group printed the DsaBenchError: rebuild it
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
        inputs = build_inputs(INDEXER, case, seed, CPU)
        INDEXER.reference(**inputs)


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
        inputs = build_inputs(INDEXER, case, seed, CPU)
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
