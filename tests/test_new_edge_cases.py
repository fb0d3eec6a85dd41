"""The cases issue 47 added to the shipped traces: decode rows that repeat ids (each entry counts) and insert block
sizes that are not powers of two (3, 61, 576). A kernel that drops repeats, or addresses pages with shifts and
masks, fails them; the reference and the shipped solution pass them through the harness."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, cli, run_cli

from dsa_bench.definitions import mla_decode as md
from dsa_bench.definitions.base import Tolerance
from dsa_bench.definitions.status import Status
from dsa_bench.workloads import build_inputs, load_workload

CPU = torch.device("cpu")
FORMATS = ("v32", "v4", "v41")
REPEATED = "smoke_b2_sq2_k64_bs64_h64_repeated_ids"
ODD_BLOCKS = ("t17_bs3", "t1023_bs61_padded", "t1024_bs576")


def _inputs(workload: str, case_id: str):
    wl = load_workload(ROOT / "workloads" / f"{workload}.yaml")
    case = next(c for c in wl.cases if c.id == case_id)
    return wl, case, build_inputs(wl.definition, case, 3, CPU)


def _first_entries_only(indices: torch.Tensor) -> torch.Tensor:
    """Each row's indices with every repeat of an id set to -1 (a kernel that counts an id once)."""
    out = indices.clone()
    for row in out.view(-1, out.shape[-1]):
        seen: set[int] = set()
        for k, value in enumerate(row.tolist()):
            if value >= 0 and value in seen:
                row[k] = -1
            seen.add(value)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_that_repeat_ids_count_every_entry(fmt):
    wl, _, inputs = _inputs(f"mla_decode_{fmt}_smoke", REPEATED)
    indices = inputs["indices"]
    assert any(len(set(r)) < len([x for x in r if x >= 0]) for r in indices.view(-1, indices.shape[-1]).tolist()), "ids repeat"
    expected = wl.definition.expect(inputs)
    assert wl.definition.check(inputs, expected, expected, wl.settings.tolerance).passed
    record = md.FORMAT_OF[wl.definition.name]
    once = md.decode(record, inputs["q"], inputs["kv_cache"], _first_entries_only(indices), inputs["sm_scale"], inputs["attn_sink"],
                     inputs.get("topk_length"))  # fmt: skip
    result = wl.definition.check(inputs, once, expected, wl.settings.tolerance)
    assert result.status is Status.INCORRECT_NUMERICAL, "counting a repeated id once changes the softmax"


def _power_of_two_slots(slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """The slots a writer reaches when it splits an id with a shift and a mask, as if the block size were a power of two."""
    shift = max(0, (block_size - 1).bit_length())
    block, offset = slots >> shift, slots & ((1 << shift) - 1)
    return torch.where(slots >= 0, block * block_size + offset.clamp_max(block_size - 1), slots)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case_id", ODD_BLOCKS)
def test_odd_block_sizes_catch_a_power_of_two_address(fmt, case_id):
    wl, case, inputs = _inputs(f"kv_insert_{fmt}_small", case_id)
    definition = wl.definition
    expected = definition.expect(inputs)
    outputs = definition.allocate_outputs(definition.axes(case.axes), CPU)
    definition.reference(*definition.input_args(inputs), outputs["kv_cache"])
    assert definition.check(inputs, outputs, expected, Tolerance()).passed
    bs = case.axes["block_size"]
    wrong = _power_of_two_slots(inputs["slot_mapping"], bs)
    assert not torch.equal(wrong, inputs["slot_mapping"])
    mutant = definition.allocate_outputs(definition.axes(case.axes), CPU)
    capacity = case.axes["num_blocks"] * bs
    args = definition.input_args({**inputs, "slot_mapping": torch.where(wrong < capacity, wrong, -1)})
    definition.reference(*args, mutant["kv_cache"])
    assert definition.check(inputs, mutant, expected, Tolerance()).status is not Status.PASSED


def test_an_insert_of_no_tokens_is_refused(tmp_path):
    line = (ROOT / "traces" / "kv_insert_v32_smoke.jsonl").read_text().splitlines()[0].replace('"num_tokens":1', '"num_tokens":0')
    (tmp_path / "t.jsonl").write_text(line + "\n")
    (tmp_path / "w.yaml").write_text("name: t\ndefinition: dsa_kv_insert_v32_fp8\ntrace: t.jsonl\n")
    proc = cli("validate", str(tmp_path / "w.yaml"))
    assert proc.returncode == 2 and "axes.num_tokens: expected a number >= 1, got 0" in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_new_cases_pass_through_the_harness_on_cpu(fmt):
    """Reference and the shipped Triton solution (interpreter) on the new cases, as `dsa-bench run` runs them."""
    proc = run_cli("run", "-w", f"mla_decode_{fmt}_smoke", "-c", REPEATED, "-s", "reference", "-s", "triton", "--device", "cpu",
                   "--no-save")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("1/1") == 2, proc.stdout
    args = [arg for case_id in ODD_BLOCKS for arg in ("-c", case_id)]
    proc = run_cli("run", "-w", f"kv_insert_{fmt}_small", *args, "-s", "reference", "-s", "triton", "--device", "cpu", "--no-save")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("3/3") == 2, proc.stdout


def test_v32_scales_of_an_explicit_cache_must_be_powers_of_two():
    wl, case, inputs = _inputs("mla_decode_v32_smoke", "smoke_b2_sq1_k64_bs64_h64")
    definition, axes = wl.definition, wl.definition.axes(case.axes)
    record = md.FORMAT_OF[definition.name]
    cache = inputs["kv_cache"].clone()
    given = {"kv_cache": cache, "indices": inputs["indices"]}
    assert definition.validate(axes, given, {}) == []
    slot = int(inputs["indices"][0, 0, 5])
    block, offset = divmod(slot, case.axes["block_size"])
    # a V3.2 record is per token: 512 FP8 values, then its 4 fp32 scales
    cache[block, offset, 0, record.value_bytes : record.value_bytes + 4].view(torch.float32)[0] = 0.3
    problems = definition.validate(axes, given, {})
    assert problems == [f"inputs.kv_cache: the record at slot {slot} has scale 0 = 0.30000001192092896; V3.2 scales must be "
                        "positive powers of two (FlashMLA casts them to bf16, exact only for powers of two)"]  # fmt: skip


def test_the_rope_rotation_rounds_its_two_products_separately():
    """The contract: e·c − o·s is round(round(e·c) − round(o·s)) in float32, never a fused multiply-add."""
    from dsa_bench.definitions.kv_insert import rotate_rope

    gen = torch.Generator().manual_seed(47)
    rope = torch.randn(4096, 64, generator=gen).bfloat16()
    positions = torch.arange(4096) % 512
    angles = torch.rand(512, 32, generator=gen, dtype=torch.float64) * 6.3
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1).float()
    got = rotate_rope(rope, positions, cos_sin)
    e, o = rope.float()[:, 0::2], rope.float()[:, 1::2]
    c, s = cos_sin[positions, :32], cos_sin[positions, 32:]
    assert torch.equal(got[:, 0::2], (e * c) - (o * s)) and torch.equal(got[:, 1::2], (o * c) + (e * s))
    fused = (e.double() * c.double() - (o * s).double()).float()  # one product kept exact, as an FMA does
    assert not torch.equal(got[:, 0::2], fused), "an FMA rounds differently on some elements"
