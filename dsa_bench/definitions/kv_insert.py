"""KV quantize-and-insert definitions (BRIEF §2.3): one per FP8 record format, byte-exact over the whole cache.

``dsa_kv_insert_v32_fp8``, ``dsa_kv_insert_v4_fp8`` and ``dsa_kv_insert_v41_fp8`` quantize each token's
latent KV row and store its record at physical slot ``slot_mapping[t] = block * block_size + offset``
(-1: skip the token) of a paged cache. The cache is the one output, ``kv_cache [num_blocks, page_bytes]``
uint8, whose page stride ``page_bytes`` may exceed the packed page; the harness pre-fills it with
:data:`CACHE_POISON_BYTE` (vLLM's convention), and every byte no record covers must keep it. The record
layout, offsets and the reference writer are :mod:`dsa_bench.definitions.kv_records`' descriptors: one
code path for the three formats. Scales follow the ``"source"`` convention (the source documents'
writers: amax clamped at 1e-4, exponent ceil(log2(amax/448))).

V4 and V4.1 rotate the last 64 of the 512 dims first (pairs (2i, 2i+1) as (e·c − o·s, o·c + e·s) with
c = cos_sin_cache[pos, i], s = cos_sin_cache[pos, 32 + i], in float32, each product rounded on its own before
the sum, never fused into an FMA, and not rounded to bf16 in between);
V4 stores them as bf16 beside 448 quantized dims (its pad scale byte written 0), V4.1 quantizes all 512.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dsa_bench.definitions.base import (
    Definition,
    InputRng,
    TensorSpec,
    Tolerance,
    Value,
    integer_param,
    unknown_params,
)
from dsa_bench.definitions.kv_records import (
    BASE_ALIGNMENT,
    V4,
    V32,
    V41,
    WRITE_SYNCS,
    KvRecordFormat,
    RecordParts,
    ScaleConvention,
)
from dsa_bench.definitions.status import CheckResult, Status

#: The byte the harness pre-fills the cache with (0xA5, vLLM's byte-exact tests); untouched bytes keep it.
CACHE_POISON_BYTE = 165
CONVENTION: ScaleConvention = "source"
LATENT_DIMS = 512
ROPE_DIMS = 64
#: Tile kinds of ``special_tiles``: zero, amax below 448·1e-4 (the two conventions differ there), amax
#: exactly 448·2^k (the exponent's boundary), and plain random.
TINY_AMAX = 0.02


@dataclass(frozen=True)
class Expected:
    """What the checker compares against: the reference's record bytes and where they go."""

    parts: RecordParts
    slots: torch.Tensor
    block_size: int


# --------------------------------------------------------------------------- reference


def rotate_rope(rope: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotated RoPE dims (float32) of ``rope`` [T, 64]: pairs (2i, 2i+1) as (e·c − o·s, o·c + e·s), each product
    rounded to float32 before the sum (separate tensor operations: no fused multiply-add, which the contract forbids)."""
    half = ROPE_DIMS // 2
    cs = cos_sin_cache.float()[positions.long()]
    c, s = cs[:, :half], cs[:, half:]
    even, odd = rope.float()[:, 0::2], rope.float()[:, 1::2]
    return torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).reshape(rope.shape[0], ROPE_DIMS)


def _rows(fmt: KvRecordFormat, inputs: Mapping[str, Value]) -> torch.Tensor:
    """The float32 [T, input_dims] rows the descriptor quantizes (RoPE dims last, already rotated)."""
    if fmt is V32:
        return torch.cat([inputs["kv_c"].float(), inputs["k_pe"].float()], dim=1)
    kv = inputs["kv"].float()
    rotated = rotate_rope(kv[:, LATENT_DIMS - ROPE_DIMS :], inputs["positions"], inputs["cos_sin_cache"])
    return torch.cat([kv[:, : LATENT_DIMS - ROPE_DIMS], rotated], dim=1)


def expected_records(fmt: KvRecordFormat, inputs: Mapping[str, Value]) -> Expected:
    """The reference writer's record bytes of every token (skipped ones included: :meth:`write` drops them)."""
    return Expected(fmt.quantize(_rows(fmt, inputs), CONVENTION), inputs["slot_mapping"].long(), int(inputs["block_size"]))


def insert(fmt: KvRecordFormat, inputs: Mapping[str, Value], kv_cache: torch.Tensor) -> None:
    """The reference: quantize every token and write its record into ``kv_cache`` in place."""
    e = expected_records(fmt, inputs)
    fmt.write(kv_cache, e.block_size, e.slots, e.parts)


# --------------------------------------------------------------------------- inputs


def cos_sin_table(max_position: int, device: torch.device) -> torch.Tensor:
    """A real RoPE table [max_position, 64] float32: cos in [0, 32), sin in [32, 64) (base 10000)."""
    inv_freq = 10000.0 ** (-torch.arange(0, ROPE_DIMS, 2, dtype=torch.float64) / ROPE_DIMS)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).float().to(device)


def _special_tiles(x: torch.Tensor, tile: int, dims: int) -> torch.Tensor:
    """``x`` [T, >= dims] float32 with its first ``dims`` dims' tiles cycling through: all zero, amax
    TINY_AMAX, amax exactly 448·2^k (k from 0 down to -12), plain random."""
    x = x.clone()
    tiles = x[:, :dims].reshape(x.shape[0], dims // tile, tile)
    for t in range(x.shape[0]):
        for j in range(tiles.shape[1]):
            kind = (t + j) % 4
            row = tiles[t, j]
            if kind == 0:
                row.zero_()
            elif kind in (1, 2):
                target = TINY_AMAX if kind == 1 else 448.0 * 2.0 ** -((t + j) // 4 % 13)
                row.mul_(target / float(row.abs().max()))
                row[int(row.abs().argmax())] = target  # exactly, whatever the division rounded
    x[:, :dims] = tiles.reshape(x.shape[0], dims)
    return x


def _slot_mapping(axes: Mapping[str, int], p: Mapping[str, Any], rng: InputRng) -> torch.Tensor:
    tokens, capacity = axes["num_tokens"], axes["num_blocks"] * axes["block_size"]
    slots = rng.structure.permutation(capacity)[:tokens].astype(np.int64)
    if p.get("skip_all", False):
        slots[:] = -1
    elif p.get("skip_every", 0):
        k = int(p["skip_every"])
        slots[k - 1 :: k] = -1
    return torch.from_numpy(slots).to(rng.device)


@dataclass(frozen=True)
class _Family:
    """How one format's definition names and draws its inputs."""

    fmt: KvRecordFormat
    value_inputs: tuple[str, ...]  #: the bf16 rows (redrawn before every timed call)

    @property
    def rotates(self) -> bool:
        return self.fmt is not V32

    def draw_values(self, axes: Mapping[str, int], rng: InputRng) -> dict[str, torch.Tensor]:
        t = axes["num_tokens"]
        if self.rotates:
            return {"kv": rng.randn(t, LATENT_DIMS).to(torch.bfloat16)}
        return {"kv_c": rng.randn(t, LATENT_DIMS).to(torch.bfloat16), "k_pe": rng.randn(t, ROPE_DIMS).to(torch.bfloat16)}

    def generate(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict], rng: InputRng) -> dict[str, Value]:
        device = rng.device
        out: dict[str, Value] = {}
        if "slot_mapping" in given:
            out["slot_mapping"] = given["slot_mapping"].to(device)
        else:
            out["slot_mapping"] = _slot_mapping(axes, params.get("slot_mapping", {}), rng)
        drawn = self.draw_values(axes, rng)
        first = self.value_inputs[0]
        if params.get(first, {}).get("special_tiles", False):
            # NoPE dims only: rotation would move a RoPE tile's amax off its boundary
            drawn[first] = _special_tiles(drawn[first].float(), self.fmt.scale_tile, LATENT_DIMS - ROPE_DIMS
                                          if self.rotates else LATENT_DIMS).to(torch.bfloat16)
        for name in self.value_inputs:
            out[name] = given[name].to(device) if name in given else drawn[name]
        if self.rotates:
            max_pos = axes["max_position"]
            if "positions" in given:
                out["positions"] = given["positions"].to(device)
            else:
                out["positions"] = torch.from_numpy(rng.structure.integers(0, max_pos, axes["num_tokens"])).to(device)
            out["cos_sin_cache"] = given["cos_sin_cache"].to(device) if "cos_sin_cache" in given else cos_sin_table(max_pos, device)
        out["block_size"] = axes["block_size"]
        return out

    def validate(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
        fmt = self.fmt
        known = {"slot_mapping": ("skip_every", "skip_all"), self.value_inputs[0]: ("special_tiles",)}
        problems = unknown_params(params, known)
        tokens, blocks, bs, page = axes["num_tokens"], axes["num_blocks"], axes["block_size"], axes["page_bytes"]
        if bs < 1 or blocks < 1:
            return [*problems, f"block_size = {bs} and num_blocks = {blocks} must be at least 1"]
        packed = fmt.packed_page_bytes(bs)
        if page < packed:
            problems.append(f"page_bytes = {page} is below the packed {fmt.kv_format} page of block size {bs} ({packed} B)")
        if page % BASE_ALIGNMENT:
            problems.append(f"page_bytes = {page} is not a multiple of the {BASE_ALIGNMENT}-byte base alignment")
        if "block_size" in given and float(given["block_size"]) != bs:
            problems.append(f"block_size = {given['block_size']} must equal the block_size axis {bs}")
        p = params.get("slot_mapping", {})
        every = integer_param(p, "slot_mapping", "skip_every", 0, problems)
        if every is not None and every < 0:
            problems.append(f"slot_mapping.params.skip_every = {every} must be >= 0 (0: skip none)")
        if not isinstance(p.get("skip_all", False), bool):
            problems.append(f"slot_mapping.params.skip_all = {p['skip_all']!r} must be true or false")
        if not isinstance(params.get(self.value_inputs[0], {}).get("special_tiles", False), bool):
            problems.append(f"{self.value_inputs[0]}.params.special_tiles must be true or false")
        if "slot_mapping" in given:
            problems += _slot_problems(given["slot_mapping"].long(), blocks * bs)
        elif tokens > blocks * bs:
            problems.append(f"num_tokens = {tokens} exceeds the cache's {blocks} x {bs} slots (random slots are distinct)")
        for name in (*self.value_inputs, "cos_sin_cache"):
            if name in given and not bool(torch.isfinite(given[name].float()).all()):
                bad = torch.nonzero(~torch.isfinite(given[name].float()))[0].tolist()
                problems.append(f"{name}{bad} is not finite: the insert contract covers finite inputs only")
        if self.rotates and "positions" in given:
            pos = given["positions"].long()
            bad = (pos < 0) | (pos >= axes["max_position"])
            if bool(bad.any()):
                t = int(torch.nonzero(bad)[0])
                problems.append(f"positions[{t}] = {int(pos[t])} is outside [0, max_position = {axes['max_position']})")
        return problems

    def check(self, inputs: Mapping[str, Value], outputs: Mapping[str, torch.Tensor], expected: Any, tol: Tolerance) -> CheckResult:
        return check_cache(self.fmt, outputs["kv_cache"], expected)

    def min_traffic_bytes(self, axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
        """Reads: every token's slot (8 B); a written token's bf16 row (1152 B V3.2, 1024 B V4/V4.1),
        position (8 B) and, once per distinct position, its cos/sin row (256 B). Writes: one record per
        written token. Skipped tokens need only their slot."""
        slots = inputs["slot_mapping"].long()
        keep = slots >= 0
        written = int(keep.sum())
        row = 2 * (LATENT_DIMS + (0 if self.rotates else ROPE_DIMS))
        reads = 8 * slots.numel() + row * written
        if self.rotates:
            reads += 8 * written + 4 * ROPE_DIMS * int(torch.unique(inputs["positions"][keep]).numel())
        return reads + self.fmt.bytes_per_token * written

    def useful_flops(self, axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
        """0: quantizing and inserting records is no tensor-core math; the roofline is the bytes alone."""
        return 0


def _slot_problems(slots: torch.Tensor, capacity: int) -> list[str]:
    bad = (slots < -1) | (slots >= capacity)
    if bool(bad.any()):
        t = int(torch.nonzero(bad)[0])
        return [f"slot_mapping[{t}] = {int(slots[t])} is neither -1 nor a slot below num_blocks*block_size = {capacity}"]
    kept = slots[slots >= 0]
    if torch.unique(kept).numel() != kept.numel():
        return ["slot_mapping lists a slot twice (two tokens writing one record leave its bytes undefined)"]
    return []


# --------------------------------------------------------------------------- checking


def locate(fmt: KvRecordFormat, block_size: int, page_offset: int) -> tuple[int | None, int, str]:
    """Slot (None in page padding), byte inside that part and field name of a byte at ``page_offset``."""
    if page_offset >= fmt.packed_page_bytes(block_size):
        return None, page_offset - fmt.packed_page_bytes(block_size), "page padding"
    if fmt.layout == "per_token":
        slot = page_offset // fmt.bytes_per_token
    elif page_offset < block_size * fmt.data_row_bytes:
        slot = page_offset // fmt.data_row_bytes
    else:
        slot = (page_offset - block_size * fmt.data_row_bytes) // fmt.scale_bytes
    at = fmt.offsets(slot, block_size)
    scale_used = fmt.num_scales * fmt.scale_element_bytes
    spans = [("data", at["data"], fmt.value_bytes), ("scale", at["scales"], scale_used),
             ("scale pad", at["scales"] + scale_used, fmt.scale_bytes - scale_used), ("rope", at["rope"], fmt.rope_bytes)]
    for name, start, size in spans:
        if start >= 0 and start <= page_offset < start + size:
            rel = page_offset - start
            if name == "scale":
                return slot, rel, f"scale {rel // fmt.scale_element_bytes}"
            if name == "rope":
                return slot, rel, f"rope dim {rel // 2}"
            return slot, rel, name
    raise AssertionError(f"{fmt.kv_format}: byte {page_offset} of a page of {block_size} is in no field")


def check_cache(fmt: KvRecordFormat, kv_cache: torch.Tensor, expected: Expected) -> CheckResult:
    """Byte-exact over the whole backing: the reference's records where tokens write, the poison byte
    everywhere else (other slots, skipped tokens' slots, scale pad bytes no writer sets, page padding)."""
    want = torch.full(kv_cache.shape, CACHE_POISON_BYTE, dtype=torch.uint8, device=kv_cache.device)
    fmt.write(want, expected.block_size, expected.slots.to(kv_cache.device), expected.parts)
    got = kv_cache.view(torch.uint8)
    differ = got != want
    if not bool(differ.any()):
        return CheckResult(Status.PASSED)
    block, offset = (int(i) for i in torch.nonzero(differ)[0])
    slot, rel, field = locate(fmt, expected.block_size, offset)
    owner = "untouched (poison)"
    if slot is not None:
        hits = torch.nonzero(expected.slots.cpu() == block * expected.block_size + slot).flatten()
        owner = f"token {int(hits[0])}'s record" if hits.numel() else "an unwritten slot (must keep the poison)"
    where = f"block {block} page padding byte {rel}" if slot is None else f"block {block} slot {slot} {field} byte {rel}"
    return CheckResult(
        Status.INCORRECT_NUMERICAL,
        f"kv_cache: {where} (page byte {offset}, {owner}): expected 0x{int(want[block, offset]):02X}, "
        f"got 0x{int(got[block, offset]):02X}; {int(differ.sum())} byte(s) differ",
    )


# --------------------------------------------------------------------------- definitions


def _definition(fmt: KvRecordFormat, name: str) -> Definition:
    rotates = fmt is not V32
    family = _Family(fmt, ("kv",) if rotates else ("kv_c", "k_pe"))
    rows: tuple[TensorSpec, ...]
    if rotates:
        rows = (TensorSpec("kv", ("num_tokens", "latent_dim"), torch.bfloat16, "latent KV; the last 64 dims are RoPE dims, not rotated"),
                TensorSpec("positions", ("num_tokens",), torch.int64, "each token's position in cos_sin_cache"),
                TensorSpec("cos_sin_cache", ("max_position", "rope_dim"), torch.float32, "cos in [0,32), sin in [32,64)"))
        const = {"latent_dim": LATENT_DIMS, "rope_dim": ROPE_DIMS}
        var: tuple[str, ...] = ("num_tokens", "num_blocks", "block_size", "page_bytes", "max_position")
    else:
        rows = (TensorSpec("kv_c", ("num_tokens", "latent_dim"), torch.bfloat16, "compressed latent KV (NoPE)"),
                TensorSpec("k_pe", ("num_tokens", "rope_dim"), torch.bfloat16, "RoPE key, already rotated"))
        const = {"latent_dim": LATENT_DIMS, "rope_dim": ROPE_DIMS}
        var = ("num_tokens", "num_blocks", "block_size", "page_bytes")
    quantized = f"{fmt.quant_dims} dims in e4m3 with {fmt.scale_dtype} scales per {fmt.scale_tile}"
    what = {"V32": f"{quantized} and the RoPE dims as bf16, per token",
            "V4": f"RoPE rotated and stored as bf16; {quantized}; the pad scale byte written 0",
            "V41": f"RoPE rotated first, then all {quantized}"}[fmt.kv_format]

    def reference(*args: Value) -> dict[str, torch.Tensor]:
        """Destination-passing: the inputs in spec order, then the cache, written in place and returned."""
        *given, kv_cache = args
        insert(fmt, dict(zip((s.name for s in inputs), given, strict=True)), kv_cache)
        return {"kv_cache": kv_cache}

    inputs = (*rows,
              TensorSpec("slot_mapping", ("num_tokens",), torch.int64, "physical slot block*block_size+offset; -1: skip"),
              TensorSpec("block_size", (), torch.int64, "tokens per page (the block_size axis)"))
    return Definition(
        name=name,
        description=f"Quantize-and-insert into a paged {fmt.kv_format} FP8 KV cache: {what} ('source' scales).",
        const_axes=const,
        var_axes=var,
        inputs=inputs,
        outputs=(TensorSpec("kv_cache", ("num_blocks", "page_bytes"), torch.uint8,
                            f"{fmt.kv_format} pages; page_bytes >= block_size x {fmt.kv_format} bytes per token",
                            poison=CACHE_POISON_BYTE),),
        reference=reference,
        generate=family.generate,
        validate=family.validate,
        redraw=family.draw_values,
        expect=lambda inputs: expected_records(fmt, inputs),
        check=family.check,
        key_axes=("num_tokens", "block_size"),
        tolerance_fields=(),
        reference_uncapturable=WRITE_SYNCS,
        notes=(
            f"Scale convention 'source': amax clamped at 1e-4, exponent ceil(log2(amax/448)) ({fmt.kv_format}).",
            f"The harness pre-fills kv_cache with byte {CACHE_POISON_BYTE} (0xA5); the check is byte-exact over the whole "
            "backing: written records equal the reference's bytes, every other byte keeps the poison.",
            "Inputs must be finite (validation rejects NaN or inf in explicit inputs; generated ones are finite).",
            "The checker sees the harness's own copy of the inputs, so a solution that modifies its inputs in "
            "place is not detected by this definition.",
        ),
        min_traffic_bytes=family.min_traffic_bytes,
        useful_flops=family.useful_flops,
        math_precision=None,  # memory only
    )


DEFINITIONS = (
    _definition(V32, "dsa_kv_insert_v32_fp8"),
    _definition(V4, "dsa_kv_insert_v4_fp8"),
    _definition(V41, "dsa_kv_insert_v41_fp8"),
)
FORMAT_OF = {d.name: fmt for d, fmt in zip(DEFINITIONS, (V32, V4, V41), strict=True)}
