"""KV insert definitions: the byte-exact whole-backing checker rejects each way a writer can go wrong."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, run_cli

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import kv_insert as kvi
from dsa_bench.definitions.base import Tolerance
from dsa_bench.definitions.kv_records import UE8M0_BIAS, V4, V41
from dsa_bench.definitions.status import Status
from dsa_bench.workloads import build_inputs, load_workload

CPU = torch.device("cpu")
NAMES = ("dsa_kv_insert_v32_fp8", "dsa_kv_insert_v4_fp8", "dsa_kv_insert_v41_fp8")


def _case(name: str, case_id: str):
    fmt = name.split("_")[3]
    wl = load_workload(ROOT / "workloads" / f"kv_insert_{fmt}_smoke.yaml")
    return wl.definition, next(c for c in wl.cases if c.id == case_id)


def _run_reference(name: str, case_id: str = "smoke_t17_bs32_padded_special"):
    definition, case = _case(name, case_id)
    inputs = build_inputs(definition, case, 3, CPU)
    outputs = definition.allocate_outputs(definition.axes(case.axes), CPU)
    definition.reference(*definition.input_args(inputs), outputs["kv_cache"])
    return definition, inputs, outputs, definition.expect(inputs)


def _verdict(definition, inputs, outputs, expected):
    return definition.check(inputs, outputs, expected, Tolerance())


@pytest.mark.parametrize("name", NAMES)
def test_reference_passes_and_poison_is_165(name):
    definition, inputs, outputs, expected = _run_reference(name)
    assert _verdict(definition, inputs, outputs, expected).status is Status.PASSED
    cache = outputs["kv_cache"]
    assert int((cache == kvi.CACHE_POISON_BYTE).sum()) > 0  # untouched bytes kept the poison
    assert int((cache != kvi.CACHE_POISON_BYTE).sum()) > 0  # records were written


@pytest.mark.parametrize("name", NAMES)
def test_changed_page_padding_byte_is_rejected(name):
    definition, inputs, outputs, expected = _run_reference(name)
    fmt = kvi.FORMAT_OF[name]
    packed = fmt.packed_page_bytes(expected.block_size)
    assert outputs["kv_cache"].shape[1] > packed  # the case has a padded page stride
    outputs["kv_cache"][1, packed + 3] = 0
    result = _verdict(definition, inputs, outputs, expected)
    assert result.status is Status.INCORRECT_NUMERICAL
    assert "block 1 page padding byte 3" in result.message and "expected 0xA5, got 0x00" in result.message


@pytest.mark.parametrize("name", NAMES)
def test_written_skipped_slot_is_rejected(name):
    definition, inputs, outputs, expected = _run_reference(name)
    fmt = kvi.FORMAT_OF[name]
    skipped = int(torch.nonzero(inputs["slot_mapping"] == -1)[0])
    # a writer that ignores -1 and stores the token at an unused slot
    used = set(inputs["slot_mapping"].tolist())
    free = next(s for s in range(outputs["kv_cache"].shape[0] * expected.block_size) if s not in used)
    parts = kvi.RecordParts(*(p[skipped : skipped + 1] for p in (expected.parts.values, expected.parts.scales, expected.parts.rope)))
    fmt.write(outputs["kv_cache"], expected.block_size, torch.tensor([free]), parts)
    result = _verdict(definition, inputs, outputs, expected)
    assert result.status is Status.INCORRECT_NUMERICAL
    bs = expected.block_size
    assert f"block {free // bs} slot {free % bs}" in result.message and "unwritten slot" in result.message


@pytest.mark.parametrize("name", NAMES)
def test_flipped_scale_exponent_is_rejected(name):
    definition, inputs, outputs, expected = _run_reference(name)
    fmt = kvi.FORMAT_OF[name]
    token = int(torch.nonzero(inputs["slot_mapping"] >= 0)[0])
    slot = int(inputs["slot_mapping"][token])
    block, offset = divmod(slot, expected.block_size)
    at = fmt.offsets(offset, expected.block_size)["scales"] + fmt.scale_element_bytes * 2
    if fmt.scale_dtype == "fp32":
        at += 3  # the fp32 scale's top byte: sign and exponent
    outputs["kv_cache"][block, at] ^= 0x01
    result = _verdict(definition, inputs, outputs, expected)
    assert result.status is Status.INCORRECT_NUMERICAL
    assert f"block {block} slot {offset} scale 2" in result.message and f"token {token}'s record" in result.message


def test_v4_scale_pad_byte_is_written_zero_and_checked():
    name = "dsa_kv_insert_v4_fp8"
    definition, inputs, outputs, expected = _run_reference(name)
    token = int(torch.nonzero(inputs["slot_mapping"] >= 0)[0])
    block, offset = divmod(int(inputs["slot_mapping"][token]), expected.block_size)
    pad = V4.offsets(offset, expected.block_size)["scales"] + V4.num_scales
    assert int(outputs["kv_cache"][block, pad]) == 0
    outputs["kv_cache"][block, pad] = kvi.CACHE_POISON_BYTE  # FlashMLA's writer leaves it untouched
    result = _verdict(definition, inputs, outputs, expected)
    assert result.status is Status.INCORRECT_NUMERICAL and "scale pad" in result.message


def test_v41_rope_rotated_after_quantization_is_rejected():
    name = "dsa_kv_insert_v41_fp8"
    definition, inputs, outputs, expected = _run_reference(name)
    # the wrong order: quantize the unrotated row, then rotate the dequantized RoPE dims and requantize them
    kv = inputs["kv"].float()
    parts = V41.quantize(kv, kvi.CONVENTION)
    deq = V41.dequantize(parts)
    rope = kvi.rotate_rope(deq[:, -kvi.ROPE_DIMS :], inputs["positions"], inputs["cos_sin_cache"])
    wrong = V41.quantize(torch.cat([deq[:, : -kvi.ROPE_DIMS], rope], dim=1), kvi.CONVENTION)
    cache = torch.full_like(outputs["kv_cache"], kvi.CACHE_POISON_BYTE)
    V41.write(cache, expected.block_size, inputs["slot_mapping"], wrong)
    result = _verdict(definition, inputs, {"kv_cache": cache}, expected)
    assert result.status is Status.INCORRECT_NUMERICAL
    assert "data byte" in result.message or "scale" in result.message


def test_special_tiles_hit_the_exponent_boundary():
    definition, inputs, _, expected = _run_reference("dsa_kv_insert_v41_fp8")
    nope_tiles = (kvi.LATENT_DIMS - kvi.ROPE_DIMS) // V41.scale_tile  # special tiles sit in the NoPE dims
    tiles = inputs["kv"][:, : nope_tiles * V41.scale_tile].float().reshape(-1, nope_tiles, V41.scale_tile)
    amax = tiles.abs().amax(dim=-1)
    exponents = expected.parts.scales[:, :nope_tiles].long() - UE8M0_BIAS
    assert bool((amax == 0).any()) and bool(((amax > 0) & (amax < 0.045)).any())
    boundary = (amax >= 1) & (torch.frexp(amax / 448.0).mantissa == 0.5)  # amax exactly 448 * 2^k
    assert bool(boundary.any())
    assert torch.equal(exponents[boundary], torch.log2(amax[boundary] / 448.0).round().long())


def test_non_finite_explicit_input_is_rejected():
    definition = get_definition("dsa_kv_insert_v32_fp8")
    axes = definition.axes({"num_tokens": 2, "num_blocks": 1, "block_size": 64, "page_bytes": kvi.V32.page_stride(64)})
    kv_c = torch.zeros(2, kvi.LATENT_DIMS, dtype=torch.bfloat16)
    kv_c[1, 7] = float("nan")
    problems = definition.validate(axes, {"kv_c": kv_c}, {})
    assert problems == ["kv_c[1, 7] is not finite: the insert contract covers finite inputs only"]


def test_short_page_and_duplicate_slots_are_rejected():
    definition = get_definition("dsa_kv_insert_v4_fp8")
    page = V4.packed_page_bytes(64) - BASE
    axes = definition.axes({"num_tokens": 2, "num_blocks": 2, "block_size": 64, "page_bytes": page, "max_position": 8})
    problems = definition.validate(axes, {"slot_mapping": torch.tensor([3, 3])}, {})
    assert any("below the packed V4 page" in p for p in problems)
    assert any("lists a slot twice" in p for p in problems)


BASE = 16


@pytest.mark.parametrize("fmt", ["v32", "v4", "v41"])
def test_reference_passes_the_smoke_workload(fmt):
    proc = run_cli("run", "-w", f"kv_insert_{fmt}_smoke", "-s", "reference", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3/3" in proc.stdout


def _time_insert(fn):
    """The timing protocol on the CPU (host clock): re-poisoning, redrawn KV rows and sampled checks."""
    from dsa_bench.run.case_context import CaseContext, decode_timing, trial_seeds
    from dsa_bench.run.protocol import TimingJob, parse_reply
    from dsa_bench.run.worker import _CaseRunner
    from dsa_bench.timing.events import HostClockTimer

    workload = load_workload(ROOT / "workloads" / "kv_insert_v4_smoke.yaml")
    case = next(c for c in workload.cases if c.id == "smoke_t17_bs32_padded_special")
    settings = workload.settings.replace(trials=1, iterations=4, input_sets=2)
    job = TimingJob(case, trial_seeds(settings, case), warmup=1, iterations=4, sample_seed=5)
    timer = HostClockTimer()
    header, blob = _CaseRunner(workload.definition, CPU, fn, dps=True).time(job, timer.time_iterations, lambda: None,
                                                                              lambda: None, timer.name)
    ctx = CaseContext(workload, case, CPU, settings.tolerance)
    result = decode_timing(parse_reply({**header, "notes": ""}, ("timing",)), blob, ctx, job)
    return result, [ctx.check(c.seed, c.outputs, c.redrawn_inputs) for c in result.checked]


def test_timed_calls_see_a_repoisoned_cache_and_redrawn_rows():
    definition = get_definition("dsa_kv_insert_v4_fp8")
    seen = []

    def honest(*args):
        seen.append(int((args[-1] != kvi.CACHE_POISON_BYTE).sum()))  # the cache as the call receives it
        definition.reference(*args)

    result, checks = _time_insert(honest)
    assert checks and all(c.passed for c in checks), [c.message for c in checks]
    assert set(result.checked[0].redrawn_inputs) == {"kv"}
    assert seen and all(n == 0 for n in seen), "every call starts from a cache that is all 0xA5"

    calls = []

    def writes_once(*args):
        if not calls:
            definition.reference(*args)
        calls.append(1)

    _, checks = _time_insert(writes_once)
    assert not checks[0].passed and "expected" in checks[0].message and "token" in checks[0].message


@pytest.mark.parametrize("fmt", ["v32", "v4", "v41"])
def test_shipped_insert_workloads_cover_the_issue_grid(fmt):
    small = load_workload(ROOT / "workloads" / f"kv_insert_{fmt}_small.yaml")
    record = kvi.FORMAT_OF[small.definition.name]
    assert {c.axes["num_tokens"] for c in small.cases} == {1, 17, 1023, 1024}
    assert {c.axes["block_size"] for c in small.cases} == {32, 64, 3, 61, 576}  # and not powers of two (issue 47)
    assert any(c.axes["page_bytes"] > record.packed_page_bytes(c.axes["block_size"]) for c in small.cases)
    params = [c.inputs.get("slot_mapping") for c in small.cases]
    assert any(p is not None and p.params == {"skip_all": True} for p in params)
    assert any(p is not None and p.params == {"skip_every": 5} for p in params)
    value = "kv_c" if fmt == "v32" else "kv"
    assert any(value in c.inputs and c.inputs[value].params == {"special_tiles": True} for c in small.cases)
    large = load_workload(ROOT / "workloads" / f"kv_insert_{fmt}_large.yaml")
    assert [c.axes["num_tokens"] for c in large.cases] == [16384, 32768, 65536, 262144]
