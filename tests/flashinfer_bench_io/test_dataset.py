"""Reading a flashinfer-bench dataset folder (definitions JSON, workloads JSONL, safetensors blobs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import cli, run_cli
from dataset_files import RMSNORM, RMSNORM_DEFINITION, RMSNORM_SOLUTION, _jsonl, _line, definition_json
from safetensors.torch import save_file

from dsa_bench.definitions import get_definition
from dsa_bench.definitions.base import Tolerance
from dsa_bench.definitions.checks import judge
from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.flashinfer_bench.dataset import load_dataset_workload
from dsa_bench.workloads import build_inputs

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
CPU = torch.device("cpu")

@pytest.fixture
def dataset(tmp_path) -> Path:
    """A small dataset in the ecosystem's layout, nested one level like the contest's."""
    root = tmp_path / "dataset"
    indexer = get_definition(INDEXER)
    (root / "definitions" / "dsa_paged").mkdir(parents=True)
    (root / "definitions" / "dsa_paged" / f"{INDEXER}.json").write_text(json.dumps(definition_json(indexer, "dsa_topk_indexer")))
    (root / "definitions" / "norm").mkdir(parents=True)
    (root / "definitions" / "norm" / f"{RMSNORM}.json").write_text(json.dumps(RMSNORM_DEFINITION))

    blob = root / "blob" / "workloads" / "dsa_paged" / INDEXER
    blob.mkdir(parents=True)
    table = torch.stack([torch.arange(0, 40), torch.arange(50, 90)]).to(torch.int32)
    save_file({"seq_lens": torch.tensor([2100, 300], dtype=torch.int32), "block_table": table}, str(blob / "w0.safetensors"))
    save_file(
        {"seq_lens": torch.tensor([64], dtype=torch.int32), "block_table": torch.tensor([[7, 3]], dtype=torch.int32)},
        str(blob / "w1.safetensors"),
    )
    rel = f"./blob/workloads/dsa_paged/{INDEXER}"
    _jsonl(
        root / "workloads" / "dsa_paged" / f"{INDEXER}.jsonl",
        [
            _line(INDEXER, "w0", {"batch_size": 2, "max_num_pages": 40, "num_pages": 100}, {
                "q_index_fp8": {"type": "random"}, "k_index_cache_fp8": {"type": "random"}, "weights": {"type": "random"},
                "seq_lens": {"type": "safetensors", "path": f"{rel}/w0.safetensors", "tensor_key": "seq_lens"},
                "block_table": {"type": "safetensors", "path": f"{rel}/w0.safetensors", "tensor_key": "block_table"},
            }),
            _line(INDEXER, "w1", {"batch_size": 1, "max_num_pages": 2, "num_pages": 8}, {
                "seq_lens": {"type": "safetensors", "path": f"{rel}/w1.safetensors", "tensor_key": "seq_lens"},
                "block_table": {"type": "safetensors", "path": f"{rel}/w1.safetensors", "tensor_key": "block_table"},
            }),
        ],
    )  # fmt: skip
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    save_file({"hidden_states": x}, str(root / "blob" / "norm.safetensors"))
    _jsonl(
        root / "workloads" / "norm" / f"{RMSNORM}.jsonl",
        [
            _line(RMSNORM, "r0", {"batch_size": 5}, {
                "hidden_states": {"type": "random"}, "weight": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6},
            }),
            _line(RMSNORM, "r1", {"batch_size": 3}, {
                "hidden_states": {"type": "safetensors", "path": "blob/norm.safetensors", "tensor_key": "hidden_states"},
                "eps": {"type": "scalar", "value": 1e-5},
            }),
        ],
    )  # fmt: skip
    return root


def test_known_definition_uses_dsa_bench_generator_and_checker(dataset):
    workload = load_dataset_workload(dataset, INDEXER)
    definition = workload.definition
    assert definition is get_definition(INDEXER)  # the built-in contract, not a generic one
    assert [c.id for c in workload.cases] == ["w0", "w1"]
    inputs = build_inputs(definition, workload.cases[0], seed=3, device=CPU)
    assert inputs["seq_lens"].tolist() == [2100, 300]
    assert inputs["block_table"][1, 0] == 50
    pages = inputs["k_index_cache_fp8"].view(torch.uint8).reshape(100, -1)
    assert (pages[99, : 64 * 128] == 0x7F).all()  # an unowned page stays NaN-filled (dsa-bench's generator)
    assert not (pages[0, : 64 * 128] == 0x7F).all()
    expected = definition.expect(inputs)
    axes = definition.axes(workload.cases[0].axes)
    good = definition.reference(**inputs)
    assert judge(definition, axes, inputs, good, expected, Tolerance(), CPU).status is Status.PASSED
    bad = {"topk_indices": good["topk_indices"].flip(-1).contiguous()}
    bad["topk_indices"][0, :5] = 50 * 64  # a token of the other row's page
    assert judge(definition, axes, inputs, bad, expected, Tolerance(), CPU).status is Status.INCORRECT_INDICES


def test_unknown_definition_becomes_generic(dataset):
    workload = load_dataset_workload(dataset, f"workloads/norm/{RMSNORM}.jsonl")  # relative to the dataset root
    definition = workload.definition
    assert definition.name == RMSNORM and get_definition(RMSNORM) is definition
    assert definition.var_axes == ("batch_size",) and definition.const_axes == {"hidden_size": 64}
    case = workload.cases[1]
    first = build_inputs(definition, case, seed=5, device=CPU)
    again = build_inputs(definition, case, seed=5, device=CPU)
    other = build_inputs(definition, case, seed=6, device=CPU)
    assert first["eps"] == 1e-5 and first["hidden_states"].shape == (3, 64)
    assert torch.equal(first["weight"], again["weight"]) and not torch.equal(first["weight"], other["weight"])  # seeded
    assert torch.equal(first["hidden_states"], other["hidden_states"])  # from the blob, not random
    expected = definition.expect(first)
    axes = definition.axes(case.axes)
    assert judge(definition, axes, first, dict(expected), expected, Tolerance(), CPU).status is Status.PASSED
    wrong = {"output": expected["output"] * 1.1}
    result = judge(definition, axes, first, wrong, expected, Tolerance(), CPU)
    assert result.status is Status.INCORRECT_NUMERICAL and "output" in result.message


def test_bad_datasets_give_clear_errors(dataset, tmp_path):
    with pytest.raises(DsaBenchError, match="dataset has no definition 'nope'; its definitions: dsa_topk"):
        load_dataset_workload(dataset, "nope")
    with pytest.raises(DsaBenchError, match="no definitions/ folder"):
        load_dataset_workload(tmp_path, INDEXER)

    path = dataset / "definitions" / "dsa_paged" / f"{INDEXER}.json"
    data = json.loads(path.read_text())
    data["inputs"]["weights"]["dtype"] = "bfloat16"
    path.write_text(json.dumps(data))
    with pytest.raises(DsaBenchError, match="inputs differ from dsa-bench's"):
        load_dataset_workload(dataset, INDEXER)

    norm = dataset / "definitions" / "norm" / f"{RMSNORM}.json"
    norm.write_text(
        json.dumps({**RMSNORM_DEFINITION, "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "float4_e2m1"}}})
    )
    with pytest.raises(DsaBenchError, match=r"outputs.output.dtype 'float4_e2m1' is not supported"):
        load_dataset_workload(dataset, RMSNORM)
    norm.write_text(json.dumps({**RMSNORM_DEFINITION, "reference": "def not_run():\n    pass\n"}))
    with pytest.raises(DsaBenchError, match="defines no top-level function run"):
        load_dataset_workload(dataset, RMSNORM)
    norm.write_text(json.dumps(RMSNORM_DEFINITION))

    lines = dataset / "workloads" / "norm" / f"{RMSNORM}.jsonl"
    rows = lines.read_text().splitlines()
    broken = json.loads(rows[1])
    broken["workload"]["inputs"]["hidden_states"]["path"] = "blob/missing.safetensors"
    lines.write_text(rows[0] + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(DsaBenchError, match=rf"{RMSNORM}.jsonl:2: inputs.hidden_states: safetensors file .* does not exist"):
        load_dataset_workload(dataset, RMSNORM)
    broken["workload"]["axes"] = {"batch_size": 3, "hidden_size": 32}
    lines.write_text(rows[0] + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(DsaBenchError, match="axes.hidden_size = 32 but the definition fixes it to 64"):
        load_dataset_workload(dataset, RMSNORM)
    lines.write_text(rows[0] + "\n{oops\n")
    with pytest.raises(DsaBenchError, match=rf"{RMSNORM}.jsonl:2: invalid JSON"):
        load_dataset_workload(dataset, RMSNORM)


@pytest.mark.slow  # harness runs of a dataset (~13 s on two cores)
def test_run_cli_on_a_dataset(dataset, tmp_path):
    save = tmp_path / "indexer.json"
    proc = run_cli("run", "--dataset", str(dataset), "-w", INDEXER, "-s", "reference", "--save", str(save))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(save.read_text())
    assert doc["workload"]["dataset"] == str(dataset.resolve())
    assert [(r["case"], r["status"]) for r in doc["records"]] == [("w0", "PASSED"), ("w1", "PASSED")]

    solution = tmp_path / "rms_user"
    solution.mkdir()
    for rel, text in RMSNORM_SOLUTION.items():
        (solution / rel).write_text(text)
    # a definition dsa-bench does not know: its reference is the JSON's run, in isolated workers too
    proc = run_cli("run", "--dataset", str(dataset), "-w", RMSNORM, "-s", "reference", "-s", str(solution), "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 4 and "rms_user" in proc.stdout

    proc = run_cli("run", "--dataset", str(dataset), "-w", "missing.jsonl", "--no-save")
    assert proc.returncode == 2 and "workload file missing.jsonl does not exist" in proc.stderr


def _packed_rms(folder: Path, kernel: str, name: str) -> dict:
    """A packed Solution JSON of the RMSNorm definition, as flashinfer-bench datasets hold them."""
    return {
        "name": name, "definition": RMSNORM, "author": "tests",
        "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "kernel.py::kernel", "dependencies": ["torch"]},
        "sources": [{"path": "kernel.py", "content": kernel}],
    }  # fmt: skip


# off by about one bf16 step: within the default atol of 1e-2, outside an atol of 1e-3
SHIFTED_KERNEL = RMSNORM_SOLUTION["kernel.py"].replace("output.copy_((x / norm * weight.float()).bfloat16())",
                                                       "output.copy_((x / norm * weight.float() + 0.005).bfloat16())")  # fmt: skip


@pytest.mark.slow  # a run of the dataset's solutions (~15 s on two cores)
def test_run_the_datasets_own_solutions(dataset, tmp_path):
    solutions = dataset / "solutions" / "norm"
    solutions.mkdir(parents=True)
    (solutions / "rms_user.json").write_text(json.dumps(_packed_rms(solutions, RMSNORM_SOLUTION["kernel.py"], "rms_user_v1")))
    (solutions / "rms_shifted.json").write_text(json.dumps(_packed_rms(solutions, SHIFTED_KERNEL, "rms_shifted")))
    tvm = {
        "name": "rms_cuda", "definition": RMSNORM, "author": "tests",
        "spec": {"language": "cuda", "target_hardware": ["cuda"], "entry_point": "k.cu::run"},  # no binding: tvm-ffi
        "sources": [{"path": "k.cu", "content": "// TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, ...)\n"}],
    }  # fmt: skip
    (solutions / "rms_cuda.json").write_text(json.dumps(tvm))
    (dataset / "solutions" / "other.json").write_text(json.dumps({"name": "half_done", "definition": INDEXER}))  # not this run's
    save = tmp_path / "all.json"
    proc = run_cli("run", "--dataset", str(dataset), "-w", RMSNORM, "--dataset-solutions", "all", "--save", str(save))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dataset solution 'rms_cuda' ({solutions / 'rms_cuda.json'}) is not run: this CUDA solution has no spec.binding" in proc.stderr
    doc = json.loads(save.read_text())
    assert sorted({r["solution"] for r in doc["records"]}) == ["rms_shifted", "rms_user_v1"]  # a packed solution keeps its name
    assert {r["status"] for r in doc["records"]} == {"PASSED"}
    assert doc["solutions"]["rms_user_v1"]["packed"] == str((solutions / "rms_user.json").resolve())
    assert doc["settings"]["tolerance"]["atol"] == 0.01

    # the tolerances of one run, recorded; the shifted solution fails them, the faithful one does not
    strict = tmp_path / "strict.json"
    proc = run_cli("run", "--dataset", str(dataset), "-w", RMSNORM, "--dataset-solutions", "rms_shifted", "-s", "reference",
                   "--atol", "0.001", "--save", str(strict))  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tolerances set on the command line judge cases differently from the workload's settings: atol 0.001 (the workload's: 0.01)" in (
        proc.stderr
    )
    doc = json.loads(strict.read_text())
    assert doc["settings"]["tolerance"] == {"atol": 0.001, "rtol": 0.01, "lse_atol": 0.00025, "score_rtol": None}
    assert {(r["solution"], r["status"]) for r in doc["records"]} == {("reference", "PASSED"), ("rms_shifted", "INCORRECT_NUMERICAL")}

    # the traces of a dataset run: the workloads as the dataset gives them
    proc = cli("export", str(strict), "-o", str(tmp_path / "strict.jsonl"))
    assert proc.returncode == 0, proc.stderr
    traces = [json.loads(line) for line in (tmp_path / "strict.jsonl").read_text().splitlines()]
    assert traces[0]["workload"] == {"uuid": "r0", "axes": {"batch_size": 5}, "inputs": {
        "hidden_states": {"type": "random"}, "weight": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6}}}  # fmt: skip
    blob = {"type": "safetensors", "path": "blob/norm.safetensors", "tensor_key": "hidden_states"}
    assert [t["workload"]["inputs"]["hidden_states"] for t in traces if t["workload"]["uuid"] == "r1"] == [blob, blob]
    shifted = [t for t in traces if t["solution"] == "rms_shifted"]
    assert {t["evaluation"]["status"] for t in shifted} == {"INCORRECT_NUMERICAL"}
    assert "tolerance: atol=0.001 rtol=0.01" in shifted[0]["evaluation"]["log"]

    for wanted, message in (
        ("nope", f"--dataset-solutions nope: no dataset solution of {RMSNORM} has this name; its solutions: rms_cuda, rms_shifted, "
                 "rms_user_v1"),
        ("rms_cuda", "flashinfer-bench reads as 'tvm-ffi' (its default)"),
    ):
        proc = cli("run", "--dataset", str(dataset), "-w", RMSNORM, "--dataset-solutions", wanted, "--no-save")
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    proc = cli("run", "-w", "indexer_smoke", "--dataset-solutions", "all", "--no-save")
    assert proc.returncode == 2 and "give the dataset with --dataset" in proc.stderr
    for option, value in (("--atol", "nan"), ("--score-rtol", "-0.5")):
        proc = cli("run", "-w", "indexer_smoke", option, value, "--no-save")
        assert proc.returncode == 2 and f"{option} {value}: expected a finite number >= 0" in proc.stderr, proc.stderr


def test_git_lfs_pointers_are_named_with_the_command_that_fetches_them(dataset):
    (dataset / ".git").mkdir()  # the dataset is a clone, its blobs not fetched
    blob = dataset / "blob" / "norm.safetensors"
    blob.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 1048576\n")
    with pytest.raises(DsaBenchError) as raised:
        load_dataset_workload(dataset, RMSNORM)
    message = str(raised.value)
    assert f"{RMSNORM}.jsonl:2: inputs.hidden_states: {blob}: this safetensors file is a Git LFS pointer" in message
    assert f"fetch it with: git -C {dataset} lfs pull --include blob/norm.safetensors" in message
    definition = dataset / "definitions" / "norm" / f"{RMSNORM}.json"
    definition.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:99\nsize 2\n")
    with pytest.raises(DsaBenchError, match=rf"{definition}: this definition file is a Git LFS pointer .* --include definitions/norm/"):
        load_dataset_workload(dataset, RMSNORM)
