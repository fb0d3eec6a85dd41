"""The triton indexer's long-row top-k (indexer/cuda_topk_long.py, csrc/topk_long.cuh) and its dispatch.

On CPU the kernels' exact selection runs on a host emulator (topk_long_emulator.cpp: the CUDA
source compiled as host C++ over topk_emulator.cpp's fiber-based SIMT layer, the four kernels run
grid after grid), and the library compiles with nvcc for sm_90a. On a GPU (tests marked ``gpu``)
the compiled kernels are checked against torch.topk exactly and the entry on long rows with the
harness checker.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HAS_CUDA
from test_triton_indexer import (
    DEVICE,
    NUM_PAGES,
    TOPK_CSRC,
    assert_exact_topk,
    assert_passes,
    build_emulator,
    entry_module,
    make_inputs,
    run,
)

from dsa_bench.definitions import indexer
from dsa_bench.definitions.base import INT_POISON, InputRng

topk_long = importlib.import_module(f"{entry_module.__package__}.cuda_topk_long")
policy = importlib.import_module(f"{entry_module.__package__}.policy")
cuda_build = importlib.import_module(f"{entry_module.__package__.rsplit('.', 1)[0]}.common.cuda_build")
EMULATOR_SOURCE = Path(__file__).resolve().parent / "topk_long_emulator.cpp"  # includes csrc/topk_cluster.cuh, topk_long.cuh
SCRATCH_INTS = topk_long.SCRATCH_INTS


# --------------------------------------------------------------------------- helpers


def hard_rows(seed: int, max_pages: int = 400):
    """Score rows that drive every level of the selection, with a scattered block table."""
    g = torch.Generator().manual_seed(seed)
    width = max_pages * 64
    lens = [width, width, width, width, width - 5, 20000, 9000, 12345, 2049, 2048, 0, 4097, 1]
    scores = torch.randn((len(lens), width), generator=g)
    ulp = 2.0**-23
    scores[0] = 0.25  # all equal: every level multi-block, the last one hands out tickets
    scores[1] = 1.0 + torch.randint(0, 2**12, (width,), generator=g).float() * ulp  # one level-1 bin, spread over bits 19..8
    scores[2] = 1.0 + torch.randint(0, 200, (width,), generator=g).float() * ulp  # one level-1 and level-2 bin: level 3 decides
    scores[3, :3000] = 7.0  # 3000 equal keys at the top, more than k
    scores[3, 3000:] = -1.0
    scores[4] = torch.randn((width,), generator=g) * 1e-3 + 5.0  # near-constant: the top 12 key bits mostly equal
    scores[5] = torch.randint(0, 3, (width,), generator=g).float()  # three huge tie groups
    scores[6] = 1.0 + torch.randint(0, 700, (width,), generator=g).float() * ulp  # differ only in the low key bits
    scores[7] = -torch.rand((width,), generator=g) * 1e-30  # tiny negatives and denormals
    scores[8] = torch.randn((width,), generator=g) * 1e6
    scores[9:, 4097:] = float("-inf")  # the score kernel's padding past L
    scores[12, ::2] = 0.0  # +0 ...
    scores[12, 1::2] = -0.0  # ... and -0
    table = torch.stack([torch.randperm(NUM_PAGES, generator=g)[:max_pages] for _ in lens]).int()
    return scores, torch.tensor(lens, dtype=torch.int32), table


# --------------------------------------------------------------------------- dispatch


def test_dispatch_keeps_short_tables_on_the_filtered_topk():
    # The contest's shapes (at most 91 pages) and every table up to 16384 tokens stay on the
    # one-block-per-row top-k; long tables take the long path at small batches, and at B = 64
    # only from 64K tokens, at B = 128 only from 128K (ragged serving batches); larger batches keep one block per row.
    for batch in (1, 31, 128):
        for pages in (33, 91, 128, 256):
            assert not policy.uses_long_path(batch, pages)
    assert policy.uses_long_path(1, 257) and policy.uses_long_path(32, 512) and policy.uses_long_path(32, 2048)
    assert not policy.uses_long_path(64, 512) and policy.uses_long_path(64, 1024) and policy.uses_long_path(64, 2048)
    assert not policy.uses_long_path(128, 512) and not policy.uses_long_path(128, 2047) and policy.uses_long_path(128, 2048)
    assert not policy.uses_long_path(129, 2048)


def test_dispatch_keeps_8k_to_36k_rows_in_shared_memory_from_two_rows():
    # 8193-36864 tokens (MTP rows of 32K + 1 included) at B >= 2: the filtered top-k, its rows in
    # shared memory, whatever the cluster and long-row rules say; one row alone keeps the cluster.
    most = policy.SHARED_ROW_MAX_TOKENS // 64  # pages
    assert policy.uses_shared_rows(2, 129) and policy.uses_shared_rows(32, 513) and policy.uses_shared_rows(128, most)
    assert not policy.uses_shared_rows(1, 512) and not policy.uses_shared_rows(64, 128) and not policy.uses_shared_rows(8, most + 1)
    header = (TOPK_CSRC / "topk_filtered.cuh").read_text()
    assert f"kMtpSharedRowMaxLen = {policy.SHARED_ROW_MAX_TOKENS};" in header
    assert f"kLongRowMaxLen = {policy.LONG_ROW_REGISTER_TOKENS};" in header
    for batch, pages in ((2, 129), (32, 513), (64, 512), (128, 256)):
        assert entry_module.cuda_topk_for(batch, pages, torch.device("cpu")) is entry_module.cuda_topk.filtered_topk


def test_dispatch_splits_longer_rows_of_large_batches():
    # Past the shared rows (36864 tokens) at B >= 32, up to 16 chunks of 32768: the split top-k, before
    # the cluster and multi-pass rules; smaller batches keep those, and so do longer tables.
    most, shared = policy.SPLIT_MAX_TOKENS // 64, policy.SHARED_ROW_MAX_TOKENS // 64  # pages
    assert policy.uses_split_rows(32, shared + 1) and policy.uses_split_rows(64, 2048) and policy.uses_split_rows(128, most)
    assert not policy.uses_split_rows(31, 2048) and not policy.uses_split_rows(128, shared) and not policy.uses_split_rows(32, most + 1)
    assert policy.SPLIT_MAX_TOKENS // policy.SPLIT_LEN * indexer.TOPK == entry_module.cuda_topk.SPLIT_MAX_CANDIDATES
    assert policy.SPLIT_LEN <= entry_module.cuda_topk.SPLIT_MAX_CHUNK_LEN
    for batch, pages in ((32, 1024), (64, 2048), (128, 1025)):
        chosen = entry_module.cuda_topk_for(batch, pages, torch.device("cpu"))
        assert chosen.func is entry_module.cuda_topk.split_topk and chosen.keywords == {"split_len": policy.SPLIT_LEN}


def test_dispatch_takes_the_cluster_topk_where_its_clusters_fit_one_wave_or_two_at_b64():
    # Past 8192 tokens and up to 128K, while batch x blocks per row (8192 tokens a block, a power
    # of two) stays within 132 blocks, or 264 at B <= 64; the multi-pass top-k or the filtered one elsewhere.
    assert [policy.cluster_blocks(p) for p in (129, 256, 257, 512, 1024, 2048)] == [2, 2, 4, 4, 8, 16]
    assert not policy.uses_cluster_path(1, 128) and not policy.uses_cluster_path(1, 2049)
    assert policy.uses_cluster_path(1, 129) and policy.uses_cluster_path(1, 2048) and policy.uses_cluster_path(8, 2048)
    assert policy.uses_cluster_path(33, 512) and policy.uses_cluster_path(66, 256)  # one wave
    assert policy.uses_cluster_path(64, 512) and policy.uses_cluster_path(32, 1024) and policy.uses_cluster_path(32, 513)  # two, B <= 64
    assert not policy.uses_cluster_path(66, 512) and not policy.uses_cluster_path(128, 256)  # two waves past B = 64
    assert not policy.uses_cluster_path(32, 2048) and not policy.uses_cluster_path(64, 2048) and not policy.uses_cluster_path(128, 1024)
    assert topk_long.CLUSTER_MAX_LEN == policy.cluster_blocks(2048) * policy.CLUSTER_BLOCK_TOKENS


# --------------------------------------------------------------------------- emulated on CPU


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    return build_emulator(tmp_path_factory, EMULATOR_SOURCE)


def run_rows_emulator(
    exe: Path, scores: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, k: int, extra: int, *mode: str
) -> np.ndarray:
    """Runs the long-row emulator on its input (topk_emulator.cpp's ``RowsInput``, ``extra`` its sixth
    header field; ``mode`` "cluster" for the cluster kernel); returns the int32 words it wrote."""
    scores = scores.detach().float().cpu().contiguous()
    batch, width = scores.shape
    header = np.array([batch, width, block_table.shape[1], block_table.shape[1] * 64, k, extra], dtype=np.int32)
    parts = (header, scores.numpy(), seq_lens.cpu().numpy().astype(np.int32), block_table.cpu().numpy().astype(np.int32))
    folder = exe.parent
    (folder / "in.bin").write_bytes(b"".join(np.ascontiguousarray(part).tobytes() for part in parts))
    subprocess.run([str(exe), str(folder / "in.bin"), str(folder / "out.bin"), *mode], check=True, timeout=600)
    return np.fromfile(folder / "out.bin", dtype=np.int32)


def emulate_long_topk(exe: Path, scores: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, k: int, blocks_per_row: int = 0):
    """Runs topk_long.cuh's kernels on the emulator (``blocks_per_row`` 0: a block per chunk of 4096
    entries, else that many blocks looping over a row's chunks); returns ([B, k] int32 ids,
    [B, SCRATCH_INTS] int32 scratch after the call)."""
    batch = scores.shape[0]
    raw = run_rows_emulator(exe, scores, seq_lens, block_table, k, blocks_per_row)
    out, scratch = raw[: batch * k].reshape(batch, k), raw[batch * k :].reshape(batch, SCRATCH_INTS)
    return torch.from_numpy(out.copy()), torch.from_numpy(scratch.copy())


@pytest.mark.parametrize(("k", "blocks_per_row"), [(2048, 0), (512, 0), (2048, 2), (2048, 1)])
def test_emulated_long_topk_is_exact_and_leaves_scratch_zero(emulator, k, blocks_per_row):
    # blocks_per_row 0: a block per chunk (small calls); 2 and 1: blocks loop over a row's chunks (large calls)
    scores, seq_lens, table = hard_rows(seed=k + blocks_per_row)
    out, scratch = emulate_long_topk(emulator, scores, seq_lens, table, k, blocks_per_row)
    assert_exact_topk(scores, seq_lens, table, out, k)
    assert not scratch.any(), "the kernels must leave the scratch zeroed for the next call"


def test_emulated_long_topk_random_rows(emulator):
    # Ordinary score rows of several lengths (one to several chunks of 4096): rows finish in the
    # first level's last block, or in later levels when their threshold bins are large.
    g = torch.Generator().manual_seed(3)
    lens = torch.tensor([16384, 2049, 4096, 4097, 8192, 12288, 16000], dtype=torch.int32)
    scores = torch.randn((len(lens), 256 * 64), generator=g) * torch.logspace(-4, 4, len(lens))[:, None]
    for b, n in enumerate(lens.tolist()):
        scores[b, n:] = float("-inf")
    table = torch.stack([torch.randperm(NUM_PAGES, generator=g)[:256] for _ in range(len(lens))]).int()
    out, scratch = emulate_long_topk(emulator, scores, lens, table, 2048)
    assert_exact_topk(scores, lens, table, out, 2048)
    assert not scratch.any()


def emulate_cluster_topk(exe: Path, scores: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, k: int, blocks: int):
    """Runs topk_cluster.cuh's kernel on the emulator, one cluster of ``blocks`` blocks per row; returns [B, k] int32 ids."""
    raw = run_rows_emulator(exe, scores, seq_lens, block_table, k, blocks, "cluster")
    return torch.from_numpy(raw.reshape(scores.shape[0], k).copy())


def cluster_rows(seed: int, max_pages: int):
    """hard_rows plus rows for the cluster top-k's paths: a single outlier stretching the key range
    (the first level's threshold bin holds most of the row: a second cluster-wide level), two
    outliers above a narrow band, and a tight band of near-ties just below the spread top keys
    (gathered by block 0, whose finish then runs two levels and hands out tickets)."""
    scores, seq_lens, table = hard_rows(seed, max_pages)
    g = torch.Generator().manual_seed(seed + 1)
    width = max_pages * 64
    extra = torch.ones((3, width)) + torch.randn((3, width), generator=g) * 1e-3
    extra[0, 17] = 1e30
    extra[1, 5], extra[1, width - 3] = 3e20, -3e20
    # 1900 spread keys on top, then 1000 within 64 ulps of 1.0 (one first-level bin, gathered, its
    # threshold sub-bin split again in block 0), the rest far below
    extra[2] = 0.25 + torch.randint(0, 2**20, (width,), generator=g).float() * 2.0**-25
    extra[2, :1900] = 2.0 + torch.rand((1900,), generator=g) * 2.0
    extra[2, 1900:2900] = 1.0 + torch.randint(0, 64, (1000,), generator=g).float() * 2.0**-23
    lens = torch.tensor([width, width - 1000, width], dtype=torch.int32)
    extra_table = torch.stack([torch.randperm(NUM_PAGES, generator=g)[:max_pages] for _ in range(3)]).int()
    return torch.cat([scores, extra]), torch.cat([seq_lens.clamp(max=width), lens]), torch.cat([table, extra_table])


@pytest.mark.parametrize(("k", "max_pages", "blocks"), [(2048, 256, 2), (512, 256, 2), pytest.param(2048, 400, 4, marks=pytest.mark.slow)])
def test_emulated_cluster_topk_is_exact(emulator, k, max_pages, blocks):
    # The rows that drive every path (equal scores: cluster-wide tickets; one outlier: a second
    # cluster-wide level; more equal top keys than k; near-ties: block 0's finish over several
    # levels; denormals; -inf padding; short and empty rows), a cluster of 2 blocks (16384
    # tokens) and of 4 (rows of 25600 tokens: two blocks hold a partial slice, the others a full one).
    scores, seq_lens, table = cluster_rows(seed=k + blocks, max_pages=max_pages)
    out = emulate_cluster_topk(emulator, scores, seq_lens, table, k, blocks)
    assert_exact_topk(scores, seq_lens, table, out, k)


# --------------------------------------------------------------------------- sources compile


@pytest.mark.slow
def test_long_topk_library_builds_for_sm90a_without_a_gpu(tmp_path):
    """The long-row top-k's shared library, built as a GPU machine builds it: its C ABI exports the
    function, the error names and the header's constants, and rejects bad arguments before any CUDA call."""
    if cuda_build.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    compiled = cuda_build.compile_library(
        topk_long.STEM, topk_long.WHAT, topk_long.HERE, topk_long.SOURCES, topk_long.HEADERS, "sm_90a", root=tmp_path
    )
    assert "arch=compute_90a,code=sm_90a" in compiled.command
    library = cuda_build.CudaLibrary(compiled, topk_long.WHAT, topk_long.PREFIX, topk_long.SIGNATURES)  # opens without a GPU
    assert library.mismatched(topk_long.EXPECTED_CONSTANTS) == []
    # device, stream, scores, stride, seq_lens, table, stride, out, stride, scratch, candidates, batch, max_len, topk, dependent,
    # cluster (0: the multi-pass kernel)
    args = [0, None, 16, 64, 16, 16, 1, 16, 2048, 16, 16, 1, 64, 2048, 0, 0]
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        library.call("select", *[*args[:2], 4, *args[3:]])
    with pytest.raises(RuntimeError, match="topk must be in 1..TOPK"):
        library.call("select", *[*args[:13], 4096, 0, 0])
    library.call("select", *[*args[:11], 0, *args[12:]])  # batch 0: nothing to launch, returns 0
    cluster = [*args[:9], None, None, *args[11:15], 1]  # the cluster kernel: no scratch, rows of at most CLUSTER_MAX_LEN
    library.call("select", *[*cluster[:11], 0, *cluster[12:]])
    with pytest.raises(RuntimeError, match="too large"):
        library.call("select", *[*cluster[:12], topk_long.CLUSTER_MAX_LEN + 64, *cluster[13:]])
    with pytest.raises(RuntimeError, match="null tensor pointer"):
        library.call("select", *[*args[:9], None, *args[10:]])  # the multi-pass kernel needs its scratch
    nm = shutil.which("nm")
    if nm:
        proc = subprocess.run([nm, "-D", "--defined-only", str(compiled.path)], capture_output=True, text=True, check=True)
        exported = {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}
        assert exported == {topk_long.PREFIX + name for name in [*topk_long.SIGNATURES, "error_string", *topk_long.EXPECTED_CONSTANTS]}


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2048, 512])
def test_cuda_long_topk_matches_torch_topk(k):
    scores, seq_lens, table = hard_rows(seed=11 + k)
    scores, seq_lens, table = scores.cuda(), seq_lens.cuda(), table.cuda()
    for _ in range(2):  # the second call reuses the scratch the first one left zeroed
        out = torch.full((scores.shape[0], k), INT_POISON, dtype=torch.int32, device="cuda")
        topk_long.long_topk(scores, seq_lens, table, out)
        torch.cuda.synchronize()
        assert_exact_topk(scores, seq_lens, table, out, k)
    scratch, _ = topk_long.scratch_for(scores.device, scores.shape[0], table.shape[1] * 64)
    assert not scratch.any()


@pytest.mark.gpu
@pytest.mark.parametrize(("k", "max_pages"), [(2048, 256), (512, 400), (2048, 1900)])
def test_cuda_cluster_topk_matches_torch_topk(k, max_pages):
    # Clusters of 2, 4 and 16 blocks (16 is past the portable cluster size).
    if topk_long.cluster_capacity(torch.device("cuda"), max_pages * 64) == 0:
        pytest.skip(f"this GPU cannot run the cluster top-k's cluster for {max_pages * 64} tokens")
    scores, seq_lens, table = cluster_rows(seed=13 + k, max_pages=max_pages)
    scores, seq_lens, table = scores.cuda(), seq_lens.cuda(), table.cuda()
    for _ in range(2):  # nothing carries over from one call to the next
        out = torch.full((scores.shape[0], k), INT_POISON, dtype=torch.int32, device="cuda")
        topk_long.cluster_topk(scores, seq_lens, table, out)
        torch.cuda.synchronize()
        assert_exact_topk(scores, seq_lens, table, out, k)


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["plain", "negative", "scaled_up", "scaled_down"])
def test_gpu_entry_on_long_rows_passes_the_checker(weights):
    lens = [70000, 33000, 16385, 2049, 100, 0]
    axes, inputs = make_inputs(lens, max_pages=1100, seed=5, num_pages=sum(-(-n // 64) for n in lens) + 8)
    assert entry_module.cuda_topk_for(len(lens), 1100, DEVICE) is topk_long.cluster_topk
    w = inputs["weights"]
    if weights == "negative":
        w.copy_(-w.abs())
    elif weights == "scaled_up":
        w.mul_(1e3)
    elif weights == "scaled_down":
        w.mul_(1e-4)
    assert_passes(axes, inputs, run(entry_module.kernel, inputs))


@pytest.mark.gpu
@pytest.mark.parametrize("distinct_keys", [None, 1, 3])
def test_gpu_entry_on_shared_memory_rows_passes_the_checker(distinct_keys):
    # MTP-like rows of 32K and 32K + 1 tokens and shorter ones: the filtered top-k with its rows in
    # shared memory; all-equal and three-key rows take the one-key threshold bin or the radix select.
    lens = [32769, 32768, 20000, 8193, 2049, 0]
    axes, inputs = make_inputs(lens, max_pages=513, seed=8, distinct_keys=distinct_keys, num_pages=sum(-(-n // 64) for n in lens) + 8)
    assert entry_module.cuda_topk_for(len(lens), 513, DEVICE) is entry_module.cuda_topk.filtered_topk
    assert_passes(axes, inputs, run(entry_module.kernel, inputs))


@pytest.mark.gpu
@pytest.mark.parametrize("distinct_keys", [None, 1, 3])
def test_gpu_entry_on_split_rows_passes_the_checker(distinct_keys):
    # A ragged batch of 32 rows up to 128K tokens (chunk boundaries, one past them, short and empty
    # rows): the split top-k, checked by the harness checker, eagerly and through the graph.
    lens = [131072, 131071, 98305, 65536, 65537, 32768, 32769, 40000, 2049, 2048, 0, 1, 9000, 70000, 100000, 36865] * 2
    pages = sum(-(-n // 64) for n in lens) + 8
    axes, inputs = make_inputs(lens, max_pages=2048, seed=12, distinct_keys=distinct_keys, num_pages=pages)
    assert entry_module.cuda_topk_for(len(lens), 2048, DEVICE) is entry_module._split_topk
    for _ in range(2):  # eager, then captured and replayed
        assert_passes(axes, inputs, run(entry_module.kernel, inputs))


@pytest.mark.gpu
def test_gpu_entry_on_long_rows_past_one_wave_of_clusters_takes_the_multi_pass_topk():
    # 17 rows of a 128K-token table: 17 x 16 cluster blocks is more than the two waves the policy
    # allows the cluster top-k (policy.CLUSTER_PATH_MAX_BLOCKS), so the multi-pass top-k.
    lens = [131072, 131000, 70000, 33000, 16385, 8193, 2049, 100, 0, 9000, 4097, 2048, 2047, 64, 1, 20000, 12345]
    assert len(lens) * policy.cluster_blocks(2048) > 2 * policy.CLUSTER_PATH_MAX_BLOCKS
    axes, inputs = make_inputs(lens, max_pages=2048, seed=6, num_pages=sum(-(-n // 64) for n in lens) + 8)
    assert entry_module.cuda_topk_for(len(lens), 2048, DEVICE) is topk_long.long_topk
    assert_passes(axes, inputs, run(entry_module.kernel, inputs))


@pytest.mark.gpu
def test_gpu_entry_long_rows_equal_scores_and_graph_replays():
    # One distinct key: every score of a row is equal (all three levels multi-block); then fresh
    # queries through the captured graph give fresh, correct answers.
    lens = [40000, 20000]
    axes, inputs = make_inputs(lens, max_pages=640, seed=9, distinct_keys=1, num_pages=1000)
    assert_passes(axes, inputs, run(entry_module.kernel, inputs))
    axes, inputs = make_inputs(lens, max_pages=640, seed=10, num_pages=1000)
    for step in range(3):  # eager (new signature), capture + replay, replay
        for name, value in indexer.draw_queries(axes, InputRng(200 + step, DEVICE)).items():
            inputs[name].copy_(value)
        assert_passes(axes, inputs, run(entry_module.kernel, inputs))


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU path")
def test_cpu_entry_on_a_long_row():
    # Without CUDA the long tables take the portable path (Triton scores, torch.topk) unchanged.
    axes, inputs = make_inputs([16500, 3000], max_pages=260, seed=4, num_pages=400)
    assert_passes(axes, inputs, run(entry_module.kernel, inputs))
