"""The indexer peers (solutions/deepgemm_sglang, solutions/deepgemm_flashinfer) and tools/carry_peers.py.

On a CPU: their manifests, their skip on a machine without the GPU or the packages, the per-batch
state they keep outside the timed calls, and the pruning of the wheels carried to the device.

On the GPU (``-m gpu``): each one whose packages import passes the cases a run gives it. That needs
an SM90 GPU and the peers' packages (tools/carry_peers.py, docs/peers.md); a peer whose package is
missing is SKIPPED by the run with its reason, and the test skips it too.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib.util
import io
import itertools
import json
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli

from dsa_bench.definitions import indexer
from dsa_bench.solution import load_solution

# --------------------------------------------------------------------------- on a CPU


PEER_FOLDERS = [ROOT / "solutions" / "deepgemm_sglang", ROOT / "solutions" / "deepgemm_flashinfer"]


def load_file(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


batch_state = load_file(PEER_FOLDERS[0] / "batch_state.py", "peer_batch_state")
carry = load_file(ROOT / "tools" / "carry_peers.py", "carry_peers_tool")


def test_manifests_pin_the_versions_tried_on_the_h200():
    sglang, flashinfer = (load_solution(folder) for folder in PEER_FOLDERS)
    assert sglang.requires.modules == {
        "tvm_ffi": "apache-tvm-ffi==0.1.11", "deep_gemm": "sgl-deep-gemm==0.1.4.post1", "sgl_kernel": "sglang-kernel==0.4.5",
    }  # fmt: skip
    assert flashinfer.requires.modules["flashinfer.topk"] == "flashinfer-python==0.7.2.post1"
    assert flashinfer.requires.modules["deep_gemm"] == "sgl-deep-gemm==0.1.4.post1"
    assert sglang.requires.cuda_capabilities == flashinfer.requires.cuda_capabilities == ("sm_90",)
    assert {indexer.name_of(k) for k in indexer.TOPKS} == set(sglang.entries) == set(flashinfer.entries)
    assert [k for k in indexer.TOPKS if sglang.entries[indexer.name_of(k)].unsupported is None] == [2048], "SGLang: top-2048 only"
    # what the carry tool downloads is what the manifests require
    pinned = {p.requirement for p in carry.PEERS}
    assert set(sglang.requires.modules.values()) <= pinned
    assert {r for r in flashinfer.requires.modules.values() if "==" in r} <= pinned


def test_the_shared_batch_state_file_is_the_same_in_both_peers():
    first, second = ((folder / "batch_state.py").read_bytes() for folder in PEER_FOLDERS)
    assert first == second


def test_peers_are_skipped_with_their_reason_on_a_cpu_and_the_run_passes(tmp_path):
    out = tmp_path / "results.json"
    proc = run_cli(
        "run", "-w", "indexer_smoke", "-c", "smoke_boundary", "-s", "reference", "-s", "deepgemm_sglang", "-s", "deepgemm_flashinfer",
        "--save", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(out.read_text())
    records = {r["solution"]: r for r in document["records"]}
    for name in ("deepgemm_sglang", "deepgemm_flashinfer"):
        assert records[name]["status"] == "SKIPPED"
        assert "needs a CUDA GPU (sm_90); this run has none" in records[name]["message"]
        assert f"{name}: 1 case(s) skipped: needs a CUDA GPU (sm_90)" in proc.stdout
    assert records["reference"]["status"] == "PASSED"
    assert document["peers"] == ["deepgemm_sglang", "deepgemm_flashinfer"] and document["speedup_over"] is None


def test_batch_state_is_made_once_per_pair_of_live_unmodified_tensors():
    counter = itertools.count(1)
    cache = batch_state.BatchCache(lambda seq_lens, table: next(counter))  # keeps no tensor alive
    seq_lens, table = torch.tensor([5, 3], dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32)
    first = cache.get(seq_lens, table)
    assert cache.get(seq_lens, table) is first and cache.made == 1, "the same tensors: the state is reused"
    seq_lens[0] = 7  # an in-place change bumps the version counter
    changed = cache.get(seq_lens, table)
    assert changed is not first and changed.data == 2
    assert cache.get(seq_lens.clone(), table).data == 3, "another tensor with equal contents is another batch"
    assert cache.get(seq_lens, table) is changed
    entries = len(cache.entries)
    del seq_lens, changed
    gc.collect()
    assert len(cache.entries) < entries, "a dead tensor's states are dropped"


def test_batch_state_never_serves_a_new_tensor_at_a_reused_id():
    cache = batch_state.BatchCache(lambda seq_lens, table: int(seq_lens[0]))
    table = torch.zeros(1, 4, dtype=torch.int32)
    seen = []
    for value in range(20):  # freed tensors' ids get reused by the next ones
        seen.append(cache.get(torch.tensor([value], dtype=torch.int32), table).data)
    assert seen == list(range(20))


def test_graph_replay_runs_eagerly_inside_an_outer_capture(monkeypatch):
    """Under run --cuda-graph the harness captures the call: the peers' own graphs must not nest in
    it, and what the capture ran must leave no state a later eager call would trip on."""
    replay = batch_state.GraphReplay()
    state = batch_state.BatchState(None)
    tensors = (torch.zeros(2, 3),)
    launched = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    replay(state, lambda: launched.append("captured"), tensors)
    replay(state, lambda: launched.append("captured"), tensors)
    assert launched == ["captured", "captured"], "every call inside the capture launches as it is"
    assert replay.warmed == set() and state.graphs == {} and replay.pool is None and replay.disabled_reason is None
    # outside a capture its own graphs start as before: the first call of a signature runs eagerly
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    replay(state, lambda: launched.append("eager"), tensors)
    assert launched[-1] == "eager" and len(replay.warmed) == 1


def test_graph_replay_returns_what_the_captured_launch_returned(monkeypatch):
    """A launch that returns its outputs (the production step's FlashMLA out and lse) gets, on every
    replay, the tensors it returned while captured: those the replay rewrites."""
    replay, state, tensors = batch_state.GraphReplay(), batch_state.BatchState(None), (torch.zeros(2, 3),)

    class FakeGraph:
        replays = 0

        def replay(self) -> None:
            FakeGraph.replays += 1

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    results = iter(["eager", "captured", "launched again"])
    assert replay(state, lambda: next(results), tensors) == "eager"  # a signature's first call
    assert replay(state, lambda: next(results), tensors) == "captured" and FakeGraph.replays == 1
    assert replay(state, lambda: next(results), tensors) == "captured" and FakeGraph.replays == 2  # a replay, not a launch


def test_peer_input_checks_name_the_problem():
    q = torch.zeros(1, 64, 128).to(torch.float8_e4m3fn)
    cache = torch.zeros(2, 64, 1, 132, dtype=torch.int8)
    weights, seq_lens = torch.zeros(1, 64), torch.tensor([5], dtype=torch.int32)
    table, out = torch.zeros(1, 2, dtype=torch.int32), torch.empty(1, 2048, dtype=torch.int32)
    with pytest.raises(ValueError, match="every tensor must be on the GPU"):
        batch_state.check_inputs(q, cache, weights, seq_lens, table, out)
    with pytest.raises(ValueError, match=r"weights must be contiguous float32 \[1, 64\], got torch.float64"):
        batch_state.check_inputs(q, cache, weights.double(), seq_lens, table, out)
    with pytest.raises(ValueError, match="k_index_cache_fp8 must be a contiguous 1-byte"):
        batch_state.check_inputs(q, cache[:, :32], weights, seq_lens, table, out)


# --------------------------------------------------------------------------- tools/carry_peers.py


def test_pruning_keeps_what_the_peers_import():
    assert carry.keep_sglang("sgl_kernel/top_k.py") and carry.keep_sglang("sgl_kernel/sm90/common_ops.abi3.so")
    assert not carry.keep_sglang("sgl_kernel/flash_ops.abi3.so") and not carry.keep_sglang("sgl_kernel/sm100/common_ops.abi3.so")
    keep = carry.keep_flashinfer
    assert keep("flashinfer/topk.py") and keep("flashinfer/jit/core.py") and keep("flashinfer/data/csrc/cub_topk.cu")
    assert keep("flashinfer/data/include/flashinfer/topk.cuh") and keep("flashinfer_python-0.7.2.post1.dist-info/METADATA")
    assert not keep("flashinfer/attention/prefill.py"), "a subpackage topk does not import"
    assert not keep("flashinfer/data/csrc/batch_prefill.cu") and not keep("flashinfer/data/cutlass/include/cutlass/cutlass.h")


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("demo-1.0.dist-info/RECORD", "stale\n")
    return path


def test_a_pruned_wheel_has_a_true_record_and_installs(tmp_path):
    source = _wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": b"import demo.heavy\n",
        "demo/light.py": b"VALUE = 3\n",
        "demo/heavy.py": b"raise ImportError('needs a big dependency')\n",
        "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
        "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    })  # fmt: skip
    peer = carry.Peer("demo==1.0", keep=lambda path: "heavy" not in path, replace=(("demo/__init__.py", "# marker\n"),), why="test")
    target = tmp_path / "out" / source.name
    target.parent.mkdir()
    kept, left_out = carry.prune_wheel(source, target, peer, extra={"demo/data/prebuilt.so": b"\x7fELF"})
    assert (kept, left_out) == (4, 1)
    with zipfile.ZipFile(target) as wheel:
        names = set(wheel.namelist())
        assert "demo/heavy.py" not in names and wheel.read("demo/__init__.py") == b"# marker\n"
        assert "demo/heavy.py" in wheel.read("demo-1.0.dist-info/DSA_BENCH_PRUNED").decode()
        rows = list(csv.reader(io.StringIO(wheel.read("demo-1.0.dist-info/RECORD").decode())))
        assert {row[0] for row in rows} == names
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                continue
            assert int(size) == len(wheel.read(path)) and digest == carry._record_line(path, wheel.read(path))[1]
    installed = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target", str(installed), str(target)], check=True
    )
    probe = "import importlib.metadata, demo.light; print(demo.light.VALUE, importlib.metadata.version('demo'))"
    proc = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(installed)}, capture_output=True, text=True)
    assert proc.stdout.split() == ["3", "1.0"], proc.stderr
    assert (installed / "demo" / "data" / "prebuilt.so").read_bytes() == b"\x7fELF"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_toolkit_is_found_through_nvcc_itself():
    toolkit, library_dirs = carry.cuda_toolkit()  # /usr/local/bin/nvcc may be a wrapper script
    assert (toolkit / "include" / "cuda_runtime.h").is_file()
    assert any((d / "libcudart.so").exists() for d in library_dirs)


# --------------------------------------------------------------------------- on the GPU


PEERS = ("deepgemm_sglang", "deepgemm_flashinfer")
CASES = {
    # a passthrough batch, one case of each scored band, the largest case; and L = 0, 2048, 2049, 1, 63, 2112
    "indexer_h64": ["indexer_000_b1_p1", "indexer_068_b31_p32", "indexer_069_b1_p33", "indexer_107_b31_p45", "indexer_127_b31_p91"],
    "indexer_smoke": ["smoke_passthrough", "smoke_boundary", "smoke_scored", "smoke_edges"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("workload", list(CASES))
def test_importable_peers_pass_and_get_compared(tmp_path, workload):
    out = tmp_path / "results.json"
    cases = [arg for case in CASES[workload] for arg in ("-c", case)]
    peers = [arg for peer in PEERS for arg in ("-s", peer)]
    proc = run_cli(
        "run", "-w", workload, *cases, "-s", "reference", "-s", "triton", *peers,
        "--warmup", "3", "--iterations", "10", "--trials", "2", "--save", str(out), "--compile-timeout", "3600",
    )  # fmt: skip
    document = json.loads(out.read_text())
    records = document["records"]
    ran = []
    for peer in PEERS:
        mine = [r for r in records if r["solution"] == peer]
        assert len(mine) == len(CASES[workload])
        if all(r["status"] == "SKIPPED" and "cannot be imported" in r["message"] for r in mine):
            continue  # its package is not installed here
        assert [r["status"] for r in mine] == ["PASSED"] * len(mine), [r["message"] for r in mine]
        assert set(document["solution_packages"][peer]) >= {"sgl-deep-gemm", "apache-tvm-ffi"}
        assert "outside the timed calls" in document["solution_notes"][peer]
        ran.append(peer)
    if not ran:
        pytest.skip("no peer's packages import here: " + "; ".join({r["message"] for r in records if r["status"] == "SKIPPED"}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in records:
        if r["solution"] == "triton":
            assert r["status"] == "PASSED" and r["peer"] in ran and r["peer_speedup"] > 0
    assert "vs peer" in proc.stdout
