"""The triton solution's KV insert writers: byte-exact against the reference writer, every byte of the backing.

On a CPU machine the kernel runs under the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1) with its integer rounding code, which is first checked against torch's casts;
the tests marked ``gpu`` run the compiled kernel (hardware conversions and the integer code) on the
large shapes.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl
from conftest import HAS_CUDA, ROOT, run_cli

from dsa_bench.definitions import kv_insert as kvi
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.kv_records import scale_exponents
from dsa_bench.definitions.status import Status
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution
from dsa_bench.workloads import build_inputs, load_workload

DEVICE = torch.device("cuda") if HAS_CUDA else torch.device("cpu")
SOLUTION = load_solution(ROOT / "solutions" / "triton")
ENTRIES = {d.name: import_entry(SOLUTION, d.name) for d in kvi.DEFINITIONS}
_, _entry_module = ENTRIES["dsa_kv_insert_v4_fp8"]
K = importlib.import_module(f"{_entry_module.__package__}.triton_kernels")
policy = importlib.import_module(f"{_entry_module.__package__}.policy")
shapes = importlib.import_module(f"{_entry_module.__package__}.shapes")
NAMES = tuple(ENTRIES)


# --------------------------------------------------------------------------- the rounding helpers


@triton.jit
def _helpers_kernel(x_ptr, e4m3_ptr, pair_ptr, bf16_ptr, exp_ptr, N: tl.constexpr, SOFT: tl.constexpr, MIN_AMAX: tl.constexpr,
                    MAX_EXPONENT: tl.constexpr, MAX_MANTISSA: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(e4m3_ptr + i, K._e4m3_bits(x, SOFT))
    # word i: x[i] in the low byte, x[N - 1 - i] in the high one
    tl.store(pair_ptr + i, K._e4m3_pair_words(x, tl.load(x_ptr + N - 1 - i), SOFT))
    tl.store(bf16_ptr + i, K._bf16_bits(x, SOFT))
    tl.store(exp_ptr + i, K._exponents(tl.abs(x), MIN_AMAX, MAX_EXPONENT, MAX_MANTISSA, True, 0, 0))


def _from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def _rounding_cases() -> torch.Tensor:
    """fp32 values around every e4m3 and bf16 rounding point (ties, one ulp either side), the e4m3
    subnormal range, the exponent boundaries 448 * 2^k, and random values over many binades."""
    tails = [0, 1, 0x7FFFF, 0x80000, 0x80001, 0xFFFFF, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x17FFF]
    bits = [(e << 23) | (m << 20) | t for e in range(0, 136) for m in range(8) for t in tails]
    values = [_from_bits(bits)]
    sub = torch.arange(0, 40, dtype=torch.float64) * 2.0**-11  # the e4m3 subnormal grid and its midpoints
    values.append(sub.float())
    boundary = torch.tensor([448.0 * 2.0**k for k in range(-30, 30)])
    bb = boundary.view(torch.int32)
    values += [boundary, (bb + 1).view(torch.float32), (bb - 1).view(torch.float32), torch.tensor([1e-4, 0.0, 448.0])]
    g = torch.Generator().manual_seed(1)
    values.append(torch.randn(20000, generator=g) * torch.exp2(torch.randint(-30, 8, (20000,), generator=g).float()))
    x = torch.cat(values)
    x = x[x.abs() <= 448.0]
    return torch.cat([x, -x])


@pytest.mark.parametrize("soft", [True, *([False] if HAS_CUDA else [])], ids=lambda s: "integer" if s else "hardware")
def test_rounding_matches_torch_casts_and_the_exponent_is_exact(soft):
    """The integer code on every machine, the GPU's conversions where there is one."""
    x = _rounding_cases().to(DEVICE)
    n = triton.next_power_of_2(x.numel())
    padded = torch.zeros(n, device=DEVICE)
    padded[: x.numel()] = x
    e4m3 = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    bf16 = torch.empty(n, dtype=torch.int32, device=DEVICE)
    exps = torch.empty(n, dtype=torch.int32, device=DEVICE)
    pairs = torch.empty(n, dtype=torch.int16, device=DEVICE)
    layout = shapes.kernel_layout(kvi.V4, True, 64)
    _helpers_kernel[(1,)](padded, e4m3, pairs, bf16, exps, N=n, SOFT=soft, MIN_AMAX=layout["MIN_AMAX"],
                          MAX_EXPONENT=layout["MAX_EXPONENT"], MAX_MANTISSA=layout["MAX_MANTISSA"])
    m = x.numel()
    want8 = x.to(torch.float8_e4m3fn).view(torch.uint8)
    bad = torch.nonzero(e4m3[:m] != want8).flatten()
    assert bad.numel() == 0, f"e4m3 of {x[bad[:5]].tolist()}: got {e4m3[bad[:5]].tolist()}, torch {want8[bad[:5]].tolist()}"
    all8 = padded.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    want_pairs = (all8 | (all8.flip(0) << 8)).to(torch.int16)  # little-endian: low byte first in memory
    bad = torch.nonzero(pairs != want_pairs).flatten()
    assert bad.numel() == 0, f"e4m3 pair words at {bad[:5].tolist()}: got {pairs[bad[:5]].tolist()}, want {want_pairs[bad[:5]].tolist()}"
    want16 = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    bad = torch.nonzero(bf16[:m] != want16).flatten()
    assert bad.numel() == 0, f"bf16 of {x[bad[:5]].tolist()}"
    # the kernel's exponent from the float bits equals the reference's (IEEE division, frexp)
    want_e = scale_exponents(x.abs(), "source")
    assert torch.equal(exps[:m], want_e.to(torch.int32))
    # exact in float64 on the CPU (a GPU's float64 log2 is not correctly rounded); the reference
    # gives the same integers on this device and on the CPU
    host = x.abs().cpu()
    exact = torch.ceil(torch.log2(host.double().clamp_min(float(torch.tensor(1e-4))) / 448.0))
    assert torch.equal(want_e.cpu(), scale_exponents(host, "source")), "the reference's exponents do not depend on the device"
    assert torch.equal(want_e.cpu().double(), exact), "the reference's own formulation is exact on these values"
    assert bool((e4m3[:m] == 0x7E).any()) and bool((e4m3[:m] == 0x80).any())  # 448 and -0 were covered


# --------------------------------------------------------------------------- the entries


def _axes(definition, tokens: int, block_size: int, extra_page_bytes: int, blocks: int | None = None):
    fmt = kvi.FORMAT_OF[definition.name]
    axes = {"num_tokens": tokens, "num_blocks": blocks or tokens // block_size + 3, "block_size": block_size,
            "page_bytes": fmt.page_stride(block_size) + extra_page_bytes}
    if "max_position" in definition.var_axes:
        axes["max_position"] = 4096
    return definition.axes(axes)


def _insert(fn, definition, axes, inputs) -> torch.Tensor:
    cache = definition.allocate_outputs(axes, DEVICE)["kv_cache"]
    fn(*definition.input_args(inputs), cache)
    return cache


def _assert_byte_exact(definition, axes, inputs, cache: torch.Tensor) -> None:
    want = definition.allocate_outputs(axes, DEVICE)["kv_cache"]
    definition.reference(*definition.input_args(inputs), want)
    result = definition.check(inputs, {"kv_cache": cache}, definition.expect(inputs), Tolerance())
    assert result.status is Status.PASSED, result.message
    assert torch.equal(cache, want)


def _wide_range(definition, axes, inputs, seed: int) -> dict:
    """Rows whose tiles span 2^-40 .. 2^40 (many scale exponents), still finite in bf16."""
    name = definition.inputs[0].name
    rows = inputs[name].float()
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    scale = torch.exp2(torch.randint(-40, 40, (rows.shape[0], rows.shape[1] // 16), generator=g, device=DEVICE).float())
    return {**inputs, name: (rows * scale.repeat_interleave(16, dim=1)).to(torch.bfloat16)}


CASES = [  # (tokens, block size, extra page bytes, slot params, special tiles)
    (1, 64, 0, {}, False),
    (17, 64, 0, {"skip_every": 5}, True),
    (17, 32, 48, {"skip_every": 5}, True),
    (17, 64, 64, {"skip_all": True}, False),
    (300, 64, 16, {"skip_every": 3}, True),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"t{c[0]}_bs{c[1]}_pad{c[2]}_{'-'.join(c[3]) or 'noskip'}{'_sp' if c[4] else ''}")
def test_entry_is_byte_exact(name, case):
    tokens, bs, extra, slots, special = case
    fn, _ = ENTRIES[name]
    definition = next(d for d in kvi.DEFINITIONS if d.name == name)
    axes = _axes(definition, tokens, bs, extra)
    params = {"slot_mapping": slots}
    if special:
        params[definition.inputs[0].name] = {"special_tiles": True}
    inputs = definition.generate(axes, {}, params, InputRng(tokens * 7 + bs, DEVICE))
    cache = _insert(fn, definition, axes, inputs)
    _assert_byte_exact(definition, axes, inputs, cache)
    written = int((inputs["slot_mapping"] >= 0).sum())
    assert int((cache != kvi.CACHE_POISON_BYTE).sum()) > (written * 100 if written else -1)
    if not written:
        assert bool((cache == kvi.CACHE_POISON_BYTE).all())


@pytest.mark.parametrize("name", NAMES)
def test_gpu_tile_and_wide_exponent_range_under_the_interpreter(name):
    """The GPU's 16-token programs on 4 and 2 warps (several per call, a ragged last one), both row-read modes, and
    tiles over 80 binades, against the reference."""
    fmt = kvi.FORMAT_OF[name]
    definition = next(d for d in kvi.DEFINITIONS if d.name == name)
    axes = _axes(definition, 21, 32, 16)
    inputs = definition.generate(axes, {}, {"slot_mapping": {"skip_every": 4}}, InputRng(11, DEVICE))
    inputs = _wide_range(definition, axes, inputs, 5)
    args = definition.input_args(inputs)
    rotate = fmt is not kvi.V32
    for speculative in (False, True):
        rope = args[0] if rotate else args[1]
        pos, cs = (args[1], args[2]) if rotate else (None, None)
        for tile in (policy.GPU_TILE, policy.SMALL_CALL_TILE, policy.LaunchTile(16, 4)):
            cache = definition.allocate_outputs(axes, DEVICE)["kv_cache"]
            K.launch(fmt, args[0], rope, pos, cs, inputs["slot_mapping"], 32, cache, tile=tile, speculative=speculative)
            _assert_byte_exact(definition, axes, inputs, cache)


def test_layouts_come_from_the_descriptors():
    for fmt, rotate in ((kvi.V32, False), (kvi.V4, True), (kvi.V41, True)):
        for bs in (32, 64):
            layout = shapes.kernel_layout(fmt, rotate, bs)
            at0, at1 = fmt.offsets(0, bs), fmt.offsets(1, bs)
            assert layout["DATA_BASE"] == at0["data"] and layout["DATA_STEP"] == at1["data"] - at0["data"]
            assert layout["SCALE_BASE"] * fmt.scale_element_bytes == at0["scales"]
            assert layout["TILE"] == fmt.scale_tile and layout["NUM_SCALES"] == fmt.num_scales
    assert shapes.kernel_layout(kvi.V4, True, 64)["PAD_BYTE"] == kvi.V4.pad_byte
    assert shapes.kernel_layout(kvi.V41, True, 64)["ROPE_QUANTIZED"] and not shapes.kernel_layout(kvi.V4, True, 64)["ROPE_QUANTIZED"]
    with pytest.raises(ValueError, match="RoPE dims inside"):
        shapes.kernel_layout(kvi.V32, True, 64)


def test_entry_checks_its_inputs():
    fn, _ = ENTRIES["dsa_kv_insert_v4_fp8"]
    definition = next(d for d in kvi.DEFINITIONS if d.name == "dsa_kv_insert_v4_fp8")
    axes = _axes(definition, 4, 64, 0)
    inputs = definition.generate(axes, {}, {}, InputRng(1, DEVICE))
    args = definition.input_args(inputs)
    cache = definition.allocate_outputs(axes, DEVICE)["kv_cache"]
    with pytest.raises(ValueError, match=r"kv must be a contiguous torch.bfloat16 \[4, 512\] tensor, got torch.float32"):
        fn(args[0].float(), *args[1:], cache)
    with pytest.raises(ValueError, match="not contiguous"):
        fn(torch.cat([args[0], args[0]], dim=1)[:, ::2], *args[1:], cache)
    with pytest.raises(ValueError, match="slot_mapping must be a contiguous torch.int64"):
        fn(*args[:3], args[3].int(), *args[4:], cache)
    short = cache[:, : kvi.V4.packed_page_bytes(64) - 16].contiguous()
    with pytest.raises(ValueError, match="page stride .* must hold 64 V4 records"):
        fn(*args, short)
    assert bool((cache == kvi.CACHE_POISON_BYTE).all()), "a refused call writes nothing"


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_and_no_other_device_work_per_call(name, monkeypatch):
    """The entry launches the kernel once, with a grid that grows with T (no cap), and runs no torch
    op but views around it (an op would be a kernel launch on a GPU, and T = 1 must cost one launch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    fn, _ = ENTRIES[name]
    definition = next(d for d in kvi.DEFINITIONS if d.name == name)
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, kwargs["TOKENS"], kwargs["num_warps"], kwargs["SPECULATIVE"]))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(K, "kv_insert_kernel", Recorder())
    monkeypatch.setattr(policy, "INTERPRETED", False)  # the GPU's tile
    monkeypatch.setattr(K, "INTERPRETED", False)  # and its rounding
    for tokens in (1, 17, 4096, 262144):
        axes = _axes(definition, tokens, 64, 0, blocks=tokens // 64 + 1)
        args = []
        for spec in definition.inputs:  # metadata is all the entry reads: empty tensors of the right shapes
            args.append(axes["block_size"] if spec.is_scalar else torch.empty(spec.concrete_shape(axes), dtype=spec.dtype, device=DEVICE))
        cache = torch.empty(definition.outputs[0].concrete_shape(axes), dtype=torch.uint8, device=DEVICE)
        ops = []
        with Ops():
            fn(*args, cache)
        assert {op.split(".")[0] for op in ops} <= {"view", "alias", "detach"}, ops  # no-copy views only
        tile = policy.SMALL_CALL_TILE if tokens <= policy.SMALL_CALL_TOKENS else policy.GPU_TILE
        assert launches[-1] == ((triton.cdiv(tokens, tile.tokens),), tile.tokens, tile.num_warps, True)
    assert len(launches) == 4


def test_benchmark_script_dry_run(tmp_path):
    """benchmarks/kernels/kv_insert.py end to end without a GPU (interpreter, host clock)."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "kv.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/kernels/kv_insert.py"), "--dry-run", "--format", "v41",
                           "--tokens", "1", "--tokens", "17", "--tiles", "8x4,8x4d", "--sweep-tokens", "17", "--reference-tokens",
                           "17", "--warmup", "0", "--iterations", "1", "--trials", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert [(r["format"], r["tokens"], r["byte_exact"]) for r in doc["records"]] == [("v41", 1, True), ("v41", 17, True)]
    [sweep] = doc["tile_sweep"]["v41"]
    assert sweep["tokens"] == 17 and all(sweep["tiles"][t]["byte_exact"] for t in ("8x4", "8x4d"))
    assert doc["reference"]["v41"]["tokens"] == 17
    assert doc["records"][1]["bytes"] > 17 * kvi.V41.bytes_per_token and doc["dry_run"] and doc["command"].startswith("python")
    assert "t1_vs_empty" in doc["summary"]["v41"] and "dry run" in proc.stdout


@pytest.mark.parametrize("fmt", ["v32", "v4", "v41"])
def test_triton_passes_the_smoke_workload(fmt):
    proc = run_cli("run", "-w", f"kv_insert_{fmt}_smoke", "-s", "triton", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3/3" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["v32", "v4", "v41"])
def test_triton_passes_the_small_workload(fmt):
    proc = run_cli("run", "-w", f"kv_insert_{fmt}_small", "-s", "triton", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workload = load_workload(ROOT / "workloads" / f"kv_insert_{fmt}_small.yaml")
    assert f"{len(workload.cases)}/{len(workload.cases)}" in proc.stdout


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v4", "v41"])
@pytest.mark.parametrize("soft_round", [False, True], ids=["hardware_casts", "integer_rounding"])
def test_large_workload_is_byte_exact_on_the_gpu(fmt, soft_round):
    workload = load_workload(ROOT / "workloads" / f"kv_insert_{fmt}_large.yaml")
    definition = workload.definition
    record = kvi.FORMAT_OF[definition.name]
    for case in workload.cases:
        axes = definition.axes(case.axes)
        inputs = build_inputs(definition, case, 3, DEVICE)
        if case.axes["num_tokens"] == 16384:
            inputs = _wide_range(definition, axes, inputs, 9)
        args = definition.input_args(inputs)
        cache = definition.allocate_outputs(axes, DEVICE)["kv_cache"]
        rotate = record is not kvi.V32
        K.launch(record, args[0], args[0] if rotate else args[1], args[1] if rotate else None,
                 args[2] if rotate else None, inputs["slot_mapping"], axes["block_size"], cache, soft_round=soft_round)
        torch.cuda.synchronize()
        _assert_byte_exact(definition, axes, inputs, cache)
