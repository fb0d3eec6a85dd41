"""The solution's sparse attention (solutions/triton/attention/): CUDA kernel and Triton kernels.

CPU tests run the Triton kernels, the solution's interpreter path, under the Triton interpreter
(conftest sets TRITON_INTERPRET=1 before the solution is imported) with small caches. The CUDA
kernel (attention_sm90.cu) cannot run on a CPU: there it is compiled with nvcc for sm_90a. GPU
tests (``-m gpu``) cover the CUDA kernel at every split count and combine on realistic caches,
its barrier words' reuse across many calls, calls on a second stream, and the refusal of the
Triton plans on a GPU. Every check is the harness's own ``judge``: outputs
start as NaN poison, the caches hold NaN wherever no index points, atol = rtol = 1e-2, and an
empty row must give output 0 and lse exactly -inf.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import random
import re

import pytest
import torch
from conftest import HAS_CUDA, ROOT, exported_symbols

from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.checks import judge
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution

SOLUTION_DIR = ROOT / "solutions" / "triton"


_, entry = import_entry(load_solution(SOLUTION_DIR), attn.NAME)  # attention/entry.py
policy = importlib.import_module(f"{entry.__package__}.policy")  # attention/policy.py
cuda_ext = importlib.import_module(f"{entry.__package__}.cuda")  # attention/cuda.py
cuda_build = importlib.import_module(f"{entry.__package__.rsplit('.', 1)[0]}.common.cuda_build")
CPU = torch.device("cpu")
FULL = attn.TOPK


def make_inputs(counts: list[int], padding: str = "tail", num_pages: int = 96, seed: int = 0, device=CPU) -> tuple[dict, dict]:
    axes = attn.DEFINITION.axes({"num_tokens": len(counts), "num_pages": num_pages})
    params = {"sparse_indices": {"valid_counts": counts, "padding": padding}}
    return axes, attn.generate(axes, {}, params, InputRng(seed, device))


def run_solution(axes, inputs, plan=None, device=CPU) -> tuple[dict, object]:
    outputs = attn.DEFINITION.allocate_outputs(axes, device)  # NaN poison
    used = entry.sparse_attention(*attn.DEFINITION.input_args(inputs), outputs["output"], outputs["lse"], plan=plan)
    return outputs, used


def assert_correct(axes, inputs, outputs, device=CPU) -> None:
    result = judge(attn.DEFINITION, axes, inputs, outputs, attn.expect(inputs), Tolerance(), device)
    assert result.passed, f"{result.status.value}: {result.message}"


def check(counts, padding="tail", num_pages=96, seed=0, plan=None, device=CPU):
    axes, inputs = make_inputs(counts, padding, num_pages, seed, device)
    outputs, used = run_solution(axes, inputs, plan, device)
    assert_correct(axes, inputs, outputs, device)
    return outputs, used


# --------------------------------------------------------------------------- CPU (interpreter)

# (valid counts per row, padding): every count the brief names, empty and near-empty rows,
# block and page boundaries (63/64/65), full rows, mostly-padding rows and scattered padding.
INTERPRETER_CASES = [
    ([FULL], "tail"),
    ([0], "tail"),
    ([1], "scattered"),
    ([2047, 65], "scattered"),
    ([63, 64], "tail"),
    ([0, 1, 65], "tail"),
    ([2048, 0, 3, 64, 2047, 9], "tail"),
    ([5, 63, 64, 65, 1, 0, 700], "scattered"),
    ([1, 2, 3, 4, 5, 6, 7, FULL], "tail"),
]


@pytest.mark.parametrize("counts,padding", INTERPRETER_CASES, ids=lambda v: str(v) if isinstance(v, str) else "-".join(map(str, v)))
def test_default_path_under_interpreter(counts, padding):
    outputs, used = check(counts, padding, num_pages=160)
    assert used.path == ("dsplit" if len(counts) <= policy.DSPLIT_MAX_TOKENS_INTERPRETER else "two_launch")
    if 0 in counts:
        row = counts.index(0)
        assert torch.isneginf(outputs["lse"][row]).all() and outputs["output"][row].eq(0).all()


@pytest.mark.slow  # over 10 s on 2 CPU cores: make test-all (make test stays under 5 min)
def test_gpu_tilings_under_interpreter():
    """The GPU's block and split sizes (not just the interpreter's large ones) compute the same thing."""
    counts = [FULL, 0, 65, 2047]
    for plan in (
        policy.Plan("two_launch", splits=64, block_n=32),
        policy.Plan("two_launch", splits=16, block_n=128),
        policy.Plan("two_launch", splits=8, block_n=64, partial_dtype=torch.bfloat16),  # two blocks per split
    ):
        check(counts, "scattered", num_pages=128, seed=3, plan=plan)
    check([FULL, 64], "tail", num_pages=128, seed=4, plan=policy.Plan("dsplit", splits=16, block_n=64))


def test_split_path_for_short_rows_and_dsplit_for_many_tokens():
    # Both kernels must be correct for any T, whatever the default dispatch.
    check([1, FULL], "tail", num_pages=96, seed=5, plan=policy.Plan("two_launch", splits=4, block_n=256))
    check([0, 1, 63, 64, 65], "scattered", num_pages=96, seed=6, plan=policy.Plan("dsplit", splits=4, block_n=256))


def test_strided_views_of_a_combined_cache():
    """ckv and kpe as views into one [P, 64, ckv + kpe] cache (rows not contiguous), q as slices."""
    axes, inputs = make_inputs([FULL, 40, 0], "tail", num_pages=96, seed=7)
    combined = torch.cat([inputs["ckv_cache"], inputs["kpe_cache"]], dim=-1)  # [P, 64, ckv + kpe]
    q = torch.cat([inputs["q_nope"], inputs["q_pe"]], dim=-1)  # [T, 16, ckv + kpe]
    views = dict(inputs, ckv_cache=combined[..., :512], kpe_cache=combined[..., 512:], q_nope=q[..., :512], q_pe=q[..., 512:])
    assert not views["ckv_cache"].is_contiguous() and views["ckv_cache"].stride(1) == combined.shape[-1]
    outputs, _ = run_solution(axes, views)
    assert_correct(axes, inputs, outputs)


def test_other_scale_and_large_logits():
    axes, inputs = make_inputs([FULL, 2, 64], "tail", num_pages=96, seed=8)
    for scale in (1.0, 0.01):  # 1.0 makes logits ~ +-60: exp overflows without the running max
        inputs["sm_scale"] = scale
        outputs, _ = run_solution(axes, inputs)
        assert_correct(axes, inputs, outputs)


def test_plans_check_their_tiling():
    with pytest.raises(ValueError, match="unknown path 'fused'"):
        policy.Plan("fused", splits=16, block_n=64).validate()  # a path of neither kernel
    with pytest.raises(ValueError, match="read out of range"):
        policy.Plan("two_launch", splits=32, block_n=128).validate()  # BLOCK_N > split size of 64
    with pytest.raises(ValueError, match="powers of two"):
        policy.Plan("two_launch", splits=12, block_n=32).validate()
    with pytest.raises(ValueError, match="value slices"):
        policy.Plan("dsplit", splits=64, block_n=64).validate()  # 8-column slices are too narrow for tl.dot
    with pytest.raises(ValueError, match="at least 16"):
        policy.Plan("two_launch", splits=4, block_n=8).validate()


def test_cuda_policy_keeps_grids_coresident():
    """Whatever the tuned split counts and lags (CUDA_POLICY_*): every plan the GPU policy picks
    passes its checks, its splits cover the 2048 slots in whole tiles, its lag is non-negative, a
    barrier grid is co-resident unless even the fewest splits are not, a cluster plan is taken
    only where one cluster per token fits, and forcing two launches is obeyed."""
    # the H200 (132 programs, 7 clusters of 16), a smaller GPU, and GPUs without clusters
    for resident, clusters in ((132, 7), (40, 2), (132, 0), (16, 0)):
        for tokens in range(1, 200):
            for forced in (False, True):
                plan = policy.cuda_plan(tokens, resident, clusters, force_two_launch=forced)
                plan.validate()
                where = (resident, clusters, tokens, forced, plan)
                assert plan.block_n == cuda_ext.TILE_SLOTS and plan.num_stages == cuda_ext.STAGES, where
                assert attn.TOPK % plan.splits == 0 and (attn.TOPK // plan.splits) % plan.block_n == 0, where
                assert plan.gather_lag >= 0, where
                if forced:
                    assert plan.path == "cuda_two_launch", where
                elif plan.path == "cuda_cluster":
                    assert tokens <= clusters and plan.splits <= cuda_ext.MAX_CLUSTER_SPLITS, where
                else:
                    assert plan.path == "cuda", where
                if plan.path != "cuda_cluster":  # the launcher takes two launches when even this is not co-resident
                    assert tokens * plan.splits <= resident or plan.splits == cuda_ext.MIN_SPLITS, where
    with pytest.raises(ValueError, match=r"power-of-two splits in \[8, 16\]"):
        policy.cuda_kernel_plan("cuda_cluster", 32)  # a cluster holds at most 16 programs
    with pytest.raises(ValueError, match="gather lag"):
        policy.cuda_kernel_plan("cuda", 16, gather_lag=-1)
    with pytest.raises(ValueError, match="only the CUDA kernel has a gather lag"):
        policy.Plan("two_launch", 16, 64, 8, 2, gather_lag=1000).validate()
    with pytest.raises(ValueError, match="bfloat16 partials"):
        policy.Plan("cuda_cluster", 16, cuda_ext.TILE_SLOTS, 8, cuda_ext.STAGES, partial_dtype=torch.float32).validate()
    assert policy.cuda_kernel_plan("cuda_cluster", 8, 1000).partial_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="power-of-two splits"):
        policy.Plan("cuda", splits=4, block_n=64, partial_dtype=torch.bfloat16).validate()
    with pytest.raises(ValueError, match=f"tile is {cuda_ext.TILE_SLOTS} slots"):
        policy.Plan("cuda", splits=16, block_n=2 * cuda_ext.TILE_SLOTS, partial_dtype=torch.bfloat16).validate()
    with pytest.raises(ValueError, match=f"has {cuda_ext.STAGES} gather stages"):
        policy.Plan("cuda", splits=16, block_n=cuda_ext.TILE_SLOTS, num_stages=1, partial_dtype=torch.bfloat16).validate()


def test_ticket_barrier_arithmetic_releases_exactly_at_the_last_arrival():
    """A model of the CUDA kernel's ticket barrier (split_kernel: entry read, rounded down;
    arrival adds TICKETS_PER_CALL / S; wait until the word reaches the episode end), run over
    random split counts and interleavings from just below 2^32: no program may be released
    before the call's last arrival, every one must be released by it, and each call must leave
    the word on a multiple of TICKETS_PER_CALL. (The kernel itself runs in the GPU tests.)"""
    per_call, wrap = cuda_ext.TICKETS_PER_CALL, 2**32
    rng = random.Random(7)
    word = wrap - 3 * per_call
    for _ in range(400):
        splits = rng.choice([8, 16, 32, 64])
        pending = {p: ["read", "arrive"] for p in range(splits)}  # a program reads before it arrives
        episode_end: dict[int, int] = {}
        arrived = 0
        while pending:
            program = rng.choice(list(pending))
            step = pending[program].pop(0)
            if not pending[program]:
                del pending[program]
            if step == "read":
                episode_end[program] = (word // per_call * per_call + per_call) % wrap
                continue
            word = (word + per_call // splits) % wrap
            arrived += 1
            # the programs a poll would release now (the kernel compares as a signed difference)
            released = [p for p, e in episode_end.items() if (word - e + 2**31) % wrap - 2**31 >= 0]
            assert released == [] if arrived < splits else len(released) == splits
        assert word % per_call == 0


def test_cuda_path_is_refused_under_interpreter():
    axes, inputs = make_inputs([3], num_pages=16)
    with pytest.raises(ValueError, match="not the Triton interpreter"):
        plan = policy.Plan("cuda", splits=16, block_n=cuda_ext.TILE_SLOTS, num_stages=cuda_ext.STAGES, partial_dtype=torch.bfloat16)
        run_solution(axes, inputs, plan)


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal of CPU tensors on a machine without CUDA")
def test_cuda_entry_refuses_cpu_tensors_before_the_binding():
    axes, inputs = make_inputs([3, 0], num_pages=8)
    outputs = attn.DEFINITION.allocate_outputs(axes, CPU)
    scratch = torch.empty(2 * 16 * 16 * 512, dtype=torch.bfloat16), torch.empty(2 * 16 * 16), torch.zeros(64, dtype=torch.int32)
    with pytest.raises(ValueError, match="q_nope must be a CUDA tensor") as info:
        cuda_ext.run(*attn.DEFINITION.input_args(inputs), outputs["output"], outputs["lse"], *scratch, 16)
    assert "sync must be a CUDA tensor" in str(info.value)  # every bad argument is named, not just the first


@pytest.mark.slow
def test_cuda_library_builds_for_sm90a_without_a_gpu(tmp_path):
    """The whole shared library, built by the command a GPU machine runs (plus ``-Xptxas -v`` for
    its report): kernels without spills, all three entry functions, and a C ABI that exports its
    functions and the header's constants, and nothing else."""
    if cuda_build.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    build = (cuda_ext.STEM, cuda_ext.WHAT, cuda_ext.HERE, cuda_ext.SOURCES, cuda_ext.HEADERS, "sm_90a")
    compiled = cuda_build.compile_library(*build, root=tmp_path, extra_flags=("-Xptxas", "-v"))
    assert compiled.path.is_file() and compiled.path.parent.name == compiled.name and compiled.seconds_built > 0
    assert "arch=compute_90a,code=sm_90a" in compiled.command
    assert "spill stores" in compiled.log, "ptxas -v reports spills"
    assert not re.search(r"[1-9]\d* bytes spill stores", compiled.log), compiled.log
    entries = re.findall(r"Compiling entry function '\w*?(split_kernel|combine_kernel|cluster_kernel)\w*'", compiled.log)
    assert sorted(entries) == ["cluster_kernel", "combine_kernel", "split_kernel"], compiled.log

    library = cuda_build.CudaLibrary(compiled, cuda_ext.WHAT, cuda_ext.PREFIX, cuda_ext.SIGNATURES)  # opens without a GPU
    assert library.mismatched(cuda_ext.EXPECTED_CONSTANTS) == []
    assert library.mismatched(dict(cuda_ext.EXPECTED_CONSTANTS, HEADS=17)) == ["HEADS"]
    assert library.error_message(1) == "invalid argument"  # cudaErrorInvalidValue, named by the CUDA runtime
    assert library.error_message(-3).startswith("splits must be a power of two")
    with pytest.raises(RuntimeError, match=r"dsa_attention_resident_clusters failed: splits must be a power of two"):
        library.call("resident_clusters", 0, 12, ctypes.byref(ctypes.c_int()))  # refused before any CUDA call
    # launch's argument errors come back before any CUDA call (T = 1, 16 splits, the barrier combine)
    sizes = {"part_out": 16 * 16 * 512, "part_lse": 16 * 16, "sync": cuda_ext.SYNC_STRIDE, "phase_clocks": 16 * cuda_ext.PHASE_SLOTS}

    def launch_args(**change):
        counts = dict(sizes, **change)
        return [
            0, None, *[0, 0, 0] * 4, 0, 0, 0, 0, 0, 0, 0, *[x for name in sizes for x in (0, counts[name])],
            1, 0.1, 16, cuda_ext.COMBINES["barrier"], 0, ctypes.byref(ctypes.c_int()),
        ]  # fmt: skip

    with pytest.raises(RuntimeError, match="part_out, part_lse or sync too small"):
        library.call("launch", *launch_args(sync=cuda_ext.SYNC_STRIDE - 1))
    with pytest.raises(RuntimeError, match="null tensor pointer"):
        library.call("launch", *launch_args())
    if ctypes.util.find_library("cuda") is None:  # no driver: the CUDA runtime's own error comes back as a RuntimeError
        with pytest.raises(RuntimeError, match=r"dsa_attention_resident_programs failed: .*CUDA.* \(code [1-9]\d*\)"):
            library.call("resident_programs", 0, ctypes.byref(ctypes.c_int()))
    exported = exported_symbols(compiled.path)
    if exported is not None:
        wanted = {cuda_ext.PREFIX + name for name in [*cuda_ext.SIGNATURES, "error_string", *cuda_ext.EXPECTED_CONSTANTS]}
        assert exported == wanted, "the C ABI alone is exported (the static CUDA runtime stays hidden)"

    again = cuda_build.compile_library(*build, root=tmp_path, extra_flags=("-Xptxas", "-v"))
    assert (again.path, again.seconds_built, again.log) == (compiled.path, 0.0, ""), "the second build comes from the cache"


def test_rejects_wrong_shapes_and_dtypes():
    axes, inputs = make_inputs([5], num_pages=8)
    outputs = attn.DEFINITION.allocate_outputs(axes, CPU)
    args = attn.DEFINITION.input_args(inputs)
    with pytest.raises(ValueError, match="lse"):
        entry.kernel(*args, outputs["output"], outputs["lse"].double())
    bad = list(args)
    bad[4] = bad[4].long()
    with pytest.raises(ValueError, match="sparse_indices"):
        entry.kernel(*bad, outputs["output"], outputs["lse"])


# --------------------------------------------------------------------------- GPU

GPU_CONTEST_PAGES = 8462
GPU_CASES = [
    ([FULL], "tail"),
    ([0], "tail"),
    ([1], "tail"),
    ([668], "scattered"),
    ([FULL, FULL], "tail"),
    ([63, 0], "scattered"),
    ([0, 1, 65], "tail"),
    ([FULL, 64, 2047], "scattered"),
    ([484, 1155, 1734, 250, 358, 559], "tail"),
    ([FULL] * 6, "tail"),
    ([228, 107, 0, 126, 11, 214, 23], "scattered"),
    ([FULL] * 7, "tail"),
    ([FULL] * 8, "tail"),
    ([1548, 39, 806, 411, 892, 1082, 789, 166], "tail"),
    ([0, 1, 63, 64, 65, 2047, FULL, 5], "scattered"),
]
_ids = [f"T{len(c)}-{'-'.join(map(str, c)) if len(c) < 4 else 'mix'}-{p}" for c, p in GPU_CASES]


@pytest.fixture
def cuda() -> torch.device:
    return torch.device("cuda")


@pytest.mark.gpu
def test_gpu_refuses_triton_plans(cuda):
    """On a GPU the CUDA kernel runs: the Triton kernels are the interpreter's path only."""
    axes, inputs = make_inputs([FULL, 3], "scattered", 64, seed=16, device=cuda)
    for plan in (policy.Plan("dsplit", 16, 64, 8, 2), policy.Plan("two_launch", 16, 64, 8, 2)):
        with pytest.raises(ValueError, match="the Triton kernels are this solution's interpreter path"):
            run_solution(axes, inputs, plan, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("counts,padding", GPU_CASES, ids=_ids)
def test_gpu_default_plan(cuda, counts, padding):
    _, used = check(counts, padding, GPU_CONTEST_PAGES, seed=11, device=cuda)
    assert used == policy.default_plan(len(counts), cuda)
    resident = cuda_ext.resident_programs() if used.path == "cuda" else cuda_ext.resident_clusters(used.splits) * used.splits
    assert len(counts) * used.splits <= resident, "T <= 8 fits one co-resident launch"


def run_cuda(axes, inputs, splits: int, combine: str, device, gather_lag: int = 0) -> tuple[dict, int]:
    """The CUDA kernel through its checked entry, with fresh NaN-poisoned scratch and outputs
    (no scratch for the cluster combine, which must not need any)."""
    T = axes["num_tokens"]
    outputs = attn.DEFINITION.allocate_outputs(axes, device)
    scratch = 0 if combine == "cluster" else T * splits
    part_out = torch.full((scratch * 16 * 512,), float("nan"), dtype=torch.bfloat16, device=device)
    part_lse = torch.full((scratch * 16,), float("nan"), dtype=torch.float32, device=device)
    sync = cuda_ext.sync_words_for(device).get(device, T)
    args = attn.DEFINITION.input_args(inputs)
    launch = cuda_ext.run(*args, outputs["output"], outputs["lse"], part_out, part_lse, sync, splits, combine, gather_lag)
    torch.cuda.synchronize()
    return outputs, launch


@pytest.mark.gpu
@pytest.mark.parametrize("counts,padding", GPU_CASES, ids=_ids)
def test_gpu_cuda_kernel_every_split_count(cuda, counts, padding):
    """Every split count with every combine and three gather lags (two tiles at once, a short
    lag, each tile only once the one before has landed)."""
    axes, inputs = make_inputs(counts, padding, GPU_CONTEST_PAGES, seed=13, device=cuda)
    expected = attn.expect(inputs)
    resident = cuda_ext.resident_programs()
    ext = cuda_ext
    lags = (0, 1500, ext.GATHER_LAG_ON_LANDING)
    runs = [(splits, combine, lag) for splits in (8, 16, 32, 64) for combine in ("barrier", "two_launch") for lag in lags]
    runs += [(splits, "cluster", lag) for splits in (8, 16) for lag in lags]
    for splits, combine, lag in runs:
        outputs, launch = run_cuda(axes, inputs, splits, combine, cuda, lag)
        fused = combine == "barrier" and len(counts) * splits <= resident
        assert launch == (ext.CLUSTER if combine == "cluster" else ext.FUSED if fused else ext.TWO_LAUNCH)
        result = judge(attn.DEFINITION, axes, inputs, outputs, expected, Tolerance(), cuda)
        assert result.passed, f"splits={splits} combine={combine} lag={lag}: {result.status.value}: {result.message}"
        empty = [t for t, n in enumerate(counts) if n == 0]
        assert torch.isneginf(outputs["lse"][empty]).all() and outputs["output"][empty].eq(0).all()


@pytest.mark.gpu
def test_gpu_cluster_combine_is_schedulable_and_refuses_large_clusters(cuda):
    ext = cuda_ext
    assert ext.resident_clusters(8) >= 1 and ext.resident_clusters(16) >= 1, "clusters of 8 and 16 programs must fit the H200"
    axes, inputs = make_inputs([FULL, 3], "scattered", 64, seed=15, device=cuda)
    with pytest.raises(ValueError, match=r"splits must be a power of two in \[8, 16\] for the cluster combine"):
        run_cuda(axes, inputs, 32, "cluster", cuda)
    with pytest.raises(ValueError, match="gather_lag must be an int number of cycles"):
        run_cuda(axes, inputs, 16, "cluster", cuda, gather_lag=-5)


@pytest.mark.gpu
def test_gpu_cuda_kernel_strided_views_scale_and_nan_cache(cuda):
    """Views into one [P, 64, ckv + kpe] cache, q as slices, two scales (1.0 makes logits ~ +-60)."""
    axes, inputs = make_inputs([FULL, 40, 0, 2047, 1], "scattered", 1024, seed=14, device=cuda)
    combined = torch.cat([inputs["ckv_cache"], inputs["kpe_cache"]], dim=-1)
    q = torch.cat([inputs["q_nope"], inputs["q_pe"]], dim=-1)
    for scale in (1.0, 0.01):
        views = dict(
            inputs, ckv_cache=combined[..., :512], kpe_cache=combined[..., 512:], q_nope=q[..., :512], q_pe=q[..., 512:], sm_scale=scale
        )
        outputs, _ = run_solution(axes, views, None, cuda)
        torch.cuda.synchronize()
        reference = dict(inputs, sm_scale=scale)
        result = judge(attn.DEFINITION, axes, reference, outputs, attn.expect(reference), Tolerance(), cuda)
        assert result.passed, f"scale {scale}: {result.message}"


@pytest.mark.gpu
def test_gpu_cuda_kernel_rejects_misaligned_views(cuda):
    axes, inputs = make_inputs([5], num_pages=8, device=cuda)
    outputs = attn.DEFINITION.allocate_outputs(axes, cuda)
    wide = torch.zeros((8, 64, 515), dtype=torch.bfloat16, device=cuda)  # row stride 515: not 16-byte rows
    bad = dict(inputs, ckv_cache=wide[..., :512])
    with pytest.raises(ValueError, match="ckv_cache must be 16-byte aligned"):
        entry.kernel(*attn.DEFINITION.input_args(bad), outputs["output"], outputs["lse"])


def cuda_barrier_plan(tokens: int, device: torch.device):
    """The CUDA kernel with its global-memory barrier (most splits up to 16 that stay co-resident)."""
    splits = 16
    while tokens * splits > cuda_ext.resident_programs():
        splits //= 2
    return policy.cuda_kernel_plan("cuda", splits)


BARRIER_ROWS = [[FULL] * 8, [1, 0, 2047], [FULL], [64, 65, 0, 1, 5, 7], [300] * 4, [0, 0, 0]]


@pytest.mark.gpu
def test_gpu_cuda_ticket_barrier_survives_many_calls_and_wraps(cuda):
    """Hundreds of CUDA calls with changing T and split counts reuse the same ticket words: each
    call advances its tokens' words by TICKETS_PER_CALL whatever its S and leaves the others
    alone, through the wrap at 2^32 (the words start just below it), and every result stays
    correct (a call misaligned by an earlier call's S would hang or pass its barrier early)."""
    cases = [make_inputs(counts, "tail", 1024, seed=20 + i, device=cuda) for i, counts in enumerate(BARRIER_ROWS)]
    expected = [attn.expect(inputs) for _, inputs in cases]
    buffers = cuda_ext.sync_words_for(cuda)
    words = buffers.get(cuda, 8).view(-1, cuda_ext.SYNC_STRIDE)
    per_call = cuda_ext.TICKETS_PER_CALL
    words[:, 0] = -2 * per_call  # 2^32 - 128 as the kernel's unsigned: the first calls wrap around
    wrapped = torch.zeros(words.shape[0], dtype=torch.bool, device=cuda)
    for call in range(600):
        axes, inputs = cases[call % len(cases)]
        T = axes["num_tokens"]
        plan = cuda_barrier_plan(T, cuda) if call % 3 else policy.cuda_kernel_plan("cuda", 8)  # split counts change
        before = words[:, 0].clone()
        outputs, _ = run_solution(axes, inputs, plan, cuda)
        assert words.data_ptr() == buffers.words.data_ptr(), "same words reused"
        step = (words[:, 0].long() - before.long()) % 2**32
        assert step[:T].eq(per_call).all() and step[T:].eq(0).all(), f"call {call}: tickets advance for the call's tokens only"
        wrapped |= (before < 0) & (words[:, 0] >= 0)
        if call % 7 == 0 or call >= 590:
            result = judge(attn.DEFINITION, axes, inputs, outputs, expected[call % len(cases)], Tolerance(), cuda)
            assert result.passed, f"call {call}: {result.message}"
    assert wrapped[:8].all(), "every token's word went through the wrap"


@pytest.mark.gpu
def test_gpu_back_to_back_calls_without_sync(cuda):
    """Queued launches (no host sync between them) must not disturb each other's barriers."""
    axes, inputs = make_inputs([FULL] * 8, "tail", 1024, seed=30, device=cuda)
    expected = attn.expect(inputs)
    results = [run_solution(axes, inputs, None, cuda)[0] for _ in range(50)]
    torch.cuda.synchronize()
    for outputs in results[::7] + results[-1:]:
        assert judge(attn.DEFINITION, axes, inputs, outputs, expected, Tolerance(), cuda).passed


@pytest.mark.gpu
def test_gpu_cuda_launch_is_captured_in_a_cuda_graph(cuda):
    """The C ABI launches on torch's current stream of the call, so a capturing stream records
    the launch: each replay recomputes from whatever the inputs hold then."""
    counts = [FULL, 3, 700]
    axes, inputs = make_inputs(counts, "scattered", 1024, seed=32, device=cuda)
    args = attn.DEFINITION.input_args(inputs)
    outputs = attn.DEFINITION.allocate_outputs(axes, cuda)
    assert cuda_ext.launch(*args, outputs["output"], outputs["lse"], 16, "cluster") == cuda_ext.CLUSTER  # eager first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_ext.launch(*args, outputs["output"], outputs["lse"], 16, "cluster")
    for seed in (33, 34):
        _, fresh = make_inputs(counts, "scattered", 1024, seed=seed, device=cuda)
        for name in ("q_nope", "q_pe"):
            inputs[name].copy_(fresh[name])
        outputs["output"].fill_(float("nan"))
        outputs["lse"].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_correct(axes, inputs, outputs, cuda)


@pytest.mark.gpu
def test_gpu_side_stream_has_its_own_buffers(cuda):
    axes, inputs = make_inputs([FULL, 3, 0, 700], "scattered", 1024, seed=31, device=cuda)
    expected = attn.expect(inputs)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    plan = cuda_barrier_plan(4, cuda)
    with torch.cuda.stream(side):
        on_side = [run_solution(axes, inputs, plan, cuda)[0] for _ in range(20)]
        side_buffers = cuda_ext.sync_words_for(cuda)
    on_main = [run_solution(axes, inputs, plan, cuda)[0] for _ in range(20)]
    torch.cuda.synchronize()
    assert side_buffers is not cuda_ext.sync_words_for(cuda)
    for outputs in on_side[-1:] + on_main[-1:]:
        assert judge(attn.DEFINITION, axes, inputs, outputs, expected, Tolerance(), cuda).passed


@pytest.mark.gpu
def test_gpu_env_forces_two_launch(cuda, monkeypatch):
    monkeypatch.setenv("DSA_ATTN_TWO_LAUNCH", "1")
    assert policy.default_plan(8, cuda).path == "cuda_two_launch"
    check([FULL, 0, 1], "tail", 256, seed=32, device=cuda)


@pytest.mark.gpu
def test_gpu_many_tokens_fall_back_to_two_launch(cuda):
    counts = [FULL if t % 3 == 0 else (t * 37) % 2048 for t in range(48)]
    axes, inputs = make_inputs(counts, "tail", GPU_CONTEST_PAGES, seed=33, device=cuda)
    plan = policy.default_plan(len(counts), cuda)
    assert plan.splits == cuda_ext.MIN_SPLITS and len(counts) * plan.splits > cuda_ext.resident_programs()
    outputs, launch = run_cuda(axes, inputs, plan.splits, "barrier", cuda)
    assert launch == cuda_ext.TWO_LAUNCH
    assert_correct(axes, inputs, outputs, cuda)
    # clusters need no co-residency with each other: more than fit at once still finish correctly
    assert len(counts) > cuda_ext.resident_clusters(8)
    outputs, launch = run_cuda(axes, inputs, 8, "cluster", cuda)
    assert launch == cuda_ext.CLUSTER
    assert_correct(axes, inputs, outputs, cuda)
