"""One DSA decode step over one FP8 cache: ``dsa_decode_step_v32`` and ``dsa_decode_step_v4`` (issue 51).

A decode step of a DeepSeek Sparse Attention layer, as a serving engine runs it, in four stages whose
contracts are the existing definitions (this module composes their references, it copies none):

1. **insert** each new token's MLA record into ``kv_cache`` (``kv_insert``'s writer and its ``source`` scale
   convention, byte for byte) and its indexer key into ``index_cache`` (the DeepGEMM key page of
   ``kv_records.INDEXER_KEY_PAGE``, ``raw`` scales, as the indexer's generator writes keys), at
   ``slot_mapping[b, s]`` (-1: not written, the token is already cached);
2. **score** every context token with the lightning indexer, one indexer row per query row: row ``(b, s)``
   sees the first ``L_b - (s_q - 1 - s)`` tokens of sequence b (MTP: the s_q query tokens are the last s_q
   positions, each attends causally), so ``L`` and ``L - 1`` at s_q = 2;
3. **select** the top-k of each row (``indexer``'s contract: ``min(k, L)`` physical ids ``page * 64 + slot``,
   -1 padded);
4. **decode** with those ids over the same (updated) cache (``mla_decode``'s contract; its V4 ``topk_length``
   is not an input here: every entry of ``topk_indices`` counts unless it is -1).

Both caches share one block table and block size 64 (``BLOCK_SIZE``, the indexer's page), so the ids the
top-k writes are the decode's physical ids unchanged. The two caches are separate tensors (one page of each
per block id); a block that holds both pages back to back (seed 000's shared physical block, BRIEF §2.3)
is a layout ``kv_records.check_block_geometry`` checks, not yet a case of this definition.

Outputs: ``out``, ``lse`` and ``topk_indices [b, s_q, topk]``; the caches are inputs the step updates in
place, and the harness reads back (``observed``) the page of every new token's slot in both caches.

Checks (:func:`check`), in order: the observed pages byte-exact against the reference's insert into the
given caches; the ids by the indexer's checker (set modulo ties, the indexer's tie tolerance, on the
reference-updated key cache); then ``out`` and ``lse`` by the decode's checker against the decode reference
run **on the solution's own ids** wherever a row's id set differs from the reference's (a tie choice the
indexer check accepts must not fail the decode), on the reference's where the sets agree (the same thing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from dsa_bench.definitions import indexer, kv_insert, mla_decode
from dsa_bench.definitions.base import (
    Definition,
    InputRng,
    TensorSpec,
    Tolerance,
    Value,
    integer_param,
    unknown_params,
)
from dsa_bench.definitions.kv_records import INDEXER_KEY_PAGE, V4, V32, WRITE_SYNCS, KvRecordFormat, ScaleConvention
from dsa_bench.definitions.status import CheckResult, Status

#: Tokens per page of both caches: the indexer's page, so its physical ids are the decode's.
BLOCK_SIZE = indexer.PAGE_SIZE
INDEX_HEADS = indexer.NUM_HEADS
INDEX_DIM = indexer.HEAD_DIM
INDEX_PAGE_BYTES = INDEXER_KEY_PAGE.packed_page_bytes()
#: The selection size of each definition is a constant of it (one definition per format and k, as the indexer's
#: are): V3.2 selects 2048; V4 models 2048, 512 (V4-Flash) and 1024 (V4-Pro), named by ``name_of``.
REGISTERED_TOPKS: dict[str, tuple[int, ...]] = {"V32": (indexer.TOPK,), "V4": (indexer.TOPK, 512, 1024)}
#: The scale convention of every record in the MLA cache: the insert's, so context and new records come from
#: one writer (power-of-two scales; FlashMLA's SM90 kernel reads V3.2's fp32 scales as bf16, exact for them).
MLA_CONVENTION = kv_insert.CONVENTION
#: The indexer keys' scale convention (the indexer generator's: amax / 448, not rounded).
KEY_CONVENTION: ScaleConvention = "raw"
#: Context records quantized and written per step while building a cache.
WRITE_CHUNK_TOKENS = 65536
GENERATOR_PARAMS = {"seq_lens": ("min", "max"), "slot_mapping": ("skip",), "attn_sink": ("off", "value")}


# --------------------------------------------------------------------------- the step's geometry


def row_lengths(seq_lens: torch.Tensor, s_q: int) -> torch.Tensor:
    """``[b, s_q]`` int32: the tokens query row ``(b, s)`` sees, ``max(0, L_b - (s_q - 1 - s))``."""
    shift = torch.arange(s_q, device=seq_lens.device) - (s_q - 1)
    return (seq_lens.long()[:, None] + shift[None, :]).clamp_min(0).to(torch.int32)


def new_positions(seq_lens: torch.Tensor, s_q: int) -> torch.Tensor:
    """``[b, s_q]`` int64: the position of each new token, ``L_b - s_q + s`` (negative: no such token)."""
    return seq_lens.long()[:, None] - s_q + torch.arange(s_q, device=seq_lens.device)[None, :]


def position_slots(block_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[b, s_q]`` int64 physical slots of ``positions`` through each row's block table; -1 where negative."""
    pos = positions.clamp_min(0)
    pages = block_table.long().gather(1, pos // BLOCK_SIZE)
    return torch.where(positions >= 0, pages * BLOCK_SIZE + pos % BLOCK_SIZE, -1)


def indexer_inputs(inputs: Mapping[str, Value], index_cache: torch.Tensor) -> dict[str, torch.Tensor]:
    """The indexer's inputs of a step: one row per query row (``b * s_q`` rows, sequence-major), each with
    its own length and its sequence's block table."""
    b, s_q = inputs["q_index_fp8"].shape[:2]
    return {
        "q_index_fp8": inputs["q_index_fp8"].reshape(b * s_q, INDEX_HEADS, INDEX_DIM),
        "k_index_cache_fp8": index_cache,
        "weights": inputs["weights"].reshape(b * s_q, INDEX_HEADS),
        "seq_lens": row_lengths(inputs["seq_lens"], s_q).reshape(b * s_q),
        "block_table": inputs["block_table"].repeat_interleave(s_q, dim=0),
    }


def kv_pages(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, page_bytes]`` uint8 view of the decode-layout cache (page stride included)."""
    return kv_cache.view(torch.uint8).as_strided((kv_cache.shape[0], kv_cache.stride(0)), (kv_cache.stride(0), 1))


# --------------------------------------------------------------------------- reference


def _mla_rows(fmt: KvRecordFormat, inputs: Mapping[str, Value]) -> dict[str, Value]:
    """The insert's inputs of the new tokens, flattened to ``b * s_q`` tokens."""
    t = inputs["slot_mapping"].numel()
    rows: dict[str, Value] = {"slot_mapping": inputs["slot_mapping"].reshape(t), "block_size": BLOCK_SIZE}
    if fmt is V32:
        rows.update(kv_c=inputs["kv_c"].reshape(t, -1), k_pe=inputs["k_pe"].reshape(t, -1))
    else:
        rows.update(kv=inputs["kv"].reshape(t, -1), positions=inputs["positions"].reshape(t),
                    cos_sin_cache=inputs["cos_sin_cache"])
    return rows


def insert(fmt: KvRecordFormat, inputs: Mapping[str, Value], kv_cache: torch.Tensor, index_cache: torch.Tensor) -> None:
    """Stage 1, the reference: the new tokens' MLA records (kv_insert's writer) and indexer keys, in place."""
    kv_insert.insert(fmt, _mla_rows(fmt, inputs), kv_cache)
    slots = inputs["slot_mapping"].reshape(-1).long()
    keys = inputs["index_k"].reshape(-1, INDEX_DIM).float()
    INDEXER_KEY_PAGE.write(index_cache, BLOCK_SIZE, slots, INDEXER_KEY_PAGE.quantize(keys, KEY_CONVENTION))


def select(inputs: Mapping[str, Value], index_cache: torch.Tensor, topk: int) -> torch.Tensor:
    """Stages 2 and 3, the reference: the indexer's reference on every query row, ``[b, s_q, topk]`` int32."""
    b, s_q = inputs["q_index_fp8"].shape[:2]
    ids = indexer.reference(**indexer_inputs(inputs, index_cache), topk=topk)["topk_indices"]
    return ids.reshape(b, s_q, topk)


def step(fmt: KvRecordFormat, inputs: Mapping[str, Value], topk: int) -> dict[str, torch.Tensor]:
    """The whole step on ``inputs``' own caches (updated in place): ``out``, ``lse``, ``topk_indices``."""
    insert(fmt, inputs, inputs["kv_cache"], inputs["index_cache"])
    ids = select(inputs, inputs["index_cache"], topk)
    decoded = mla_decode.decode(fmt, inputs["q"], inputs["kv_cache"], ids, inputs["sm_scale"], inputs["attn_sink"])
    return {**decoded, "topk_indices": ids}


# --------------------------------------------------------------------------- observed outputs


def observe_pages(inputs: Mapping[str, Value]) -> dict[str, torch.Tensor]:
    """The page of every new token's slot in both caches, as the call left them (zeros for a -1 slot)."""
    slots = inputs["slot_mapping"].long()
    kept = (slots >= 0)[..., None]
    page = slots.clamp_min(0) // BLOCK_SIZE
    kv = kv_pages(inputs["kv_cache"])[page]
    index = inputs["index_cache"].view(torch.uint8).reshape(-1, INDEX_PAGE_BYTES)[page]
    return {"kv_pages": torch.where(kept, kv, 0), "index_pages": torch.where(kept, index, 0)}


# --------------------------------------------------------------------------- inputs


def _write_context(fmt: KvRecordFormat, backing: torch.Tensor, index_cache: torch.Tensor, slots: torch.Tensor, rng: InputRng) -> None:
    """Random N(0, 1) records and keys at ``slots`` (the tokens already cached), in steps."""
    for chunk in torch.split(slots, WRITE_CHUNK_TOKENS):
        fmt.write(backing, BLOCK_SIZE, chunk, fmt.quantize(rng.randn(chunk.numel(), fmt.input_dims), MLA_CONVENTION))
        keys = rng.randn(chunk.numel(), INDEX_DIM)
        INDEXER_KEY_PAGE.write(index_cache, BLOCK_SIZE, chunk, INDEXER_KEY_PAGE.quantize(keys, KEY_CONVENTION))


@dataclass(frozen=True)
class _Step:
    """One record format's step definition at one selection size: its inputs, generator, validation and checks."""

    fmt: KvRecordFormat
    topk: int

    @property
    def rotates(self) -> bool:
        return self.fmt is not V32

    def draw_values(self, axes: Mapping[str, int], rng: InputRng) -> dict[str, torch.Tensor]:
        """The per-call inputs (queries, index queries and weights, the new tokens' rows); timing redraws them."""
        b, s_q, h_q = axes["b"], axes["s_q"], axes["h_q"]
        drawn = {
            "q": rng.randn(b, s_q, h_q, self.fmt.d_qk).to(torch.bfloat16),
            "q_index_fp8": rng.randn(b, s_q, INDEX_HEADS, INDEX_DIM).to(torch.float8_e4m3fn),
            "weights": rng.randn(b, s_q, INDEX_HEADS) * INDEX_HEADS**-0.5,
            "index_k": rng.randn(b, s_q, INDEX_DIM).to(torch.bfloat16),
        }
        if self.rotates:
            drawn["kv"] = rng.randn(b, s_q, kv_insert.LATENT_DIMS).to(torch.bfloat16)
        else:
            drawn["kv_c"] = rng.randn(b, s_q, kv_insert.LATENT_DIMS).to(torch.bfloat16)
            drawn["k_pe"] = rng.randn(b, s_q, kv_insert.ROPE_DIMS).to(torch.bfloat16)
        return drawn

    def generate(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict], rng: InputRng) -> dict[str, Value]:
        fmt, device = self.fmt, rng.device
        b, s_q, max_pages, blocks = axes["b"], axes["s_q"], axes["max_num_pages"], axes["num_blocks"]
        seq_lens = indexer.given_or_drawn_seq_lens(given, params, b, max_pages * BLOCK_SIZE, rng)
        lens = seq_lens.tolist()
        if "block_table" in given:
            block_table = given["block_table"].to(device)
        else:
            table = indexer.allocate_block_table(np.asarray(lens), max_pages, blocks, rng.structure)
            block_table = torch.from_numpy(table).to(torch.int32).to(device)
        positions = new_positions(seq_lens, s_q)
        if "slot_mapping" in given:
            slots = given["slot_mapping"].to(device).long()
        else:
            slots = position_slots(block_table, positions)
            skip = int(params.get("slot_mapping", {}).get("skip", 0))
            written = torch.nonzero(slots.reshape(-1) >= 0).flatten().cpu().numpy()
            if skip:
                chosen = rng.structure.permutation(written)[:skip]
                slots.view(-1)[torch.from_numpy(chosen).to(device)] = -1
        # every token a row can read: positions below L, minus the new tokens this call writes
        cached = [indexer.token_ids(block_table[i], n) for i, n in enumerate(lens) if n > 0]
        context = torch.cat(cached).to(device) if cached else torch.zeros(0, dtype=torch.long, device=device)
        if context.numel():
            fresh = torch.zeros(blocks * BLOCK_SIZE, dtype=torch.bool, device=device)
            fresh[slots[slots >= 0]] = True
            context = context[~fresh[context]]
        backing = mla_decode.nan_backing(fmt, blocks, BLOCK_SIZE, axes["page_bytes"], device)
        index_cache = INDEXER_KEY_PAGE.empty_cache(blocks, device)
        _write_context(fmt, backing, index_cache, context, rng)
        drawn = self.draw_values(axes, rng)
        out: dict[str, Value] = {name: given[name].to(device) if name in given else value for name, value in drawn.items()}
        sink_axes = {"h_q": axes["h_q"], "topk": axes["topk"], "s_k": max(1, max(lens, default=1))}
        out.update(
            kv_cache=mla_decode.cache_view(fmt, backing, BLOCK_SIZE),
            index_cache=index_cache,
            slot_mapping=slots,
            seq_lens=seq_lens,
            block_table=block_table,
            sm_scale=float(given.get("sm_scale", fmt.d_qk**-0.5)),
            attn_sink=given["attn_sink"].to(device) if "attn_sink" in given
            else mla_decode.draw_sink(sink_axes, params.get("attn_sink", {}), rng),
        )
        if self.rotates:
            max_pos = axes["max_position"]
            out["positions"] = given["positions"].to(device) if "positions" in given else positions.clamp_min(0)
            cos_sin = given.get("cos_sin_cache")
            out["cos_sin_cache"] = cos_sin.to(device) if cos_sin is not None else kv_insert.cos_sin_table(max_pos, device)
        return out

    # ------------------------------------------------------------------ validation
    def validate(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
        """Everything in a case that breaks the step's contract (its stages' rules) or its generator."""
        fmt = self.fmt
        problems = unknown_params(params, GENERATOR_PARAMS)
        b, s_q, h_q = axes["b"], axes["s_q"], axes["h_q"]
        max_pages, blocks, page = axes["max_num_pages"], axes["num_blocks"], axes["page_bytes"]
        if b < 1 or max_pages < 1 or blocks < 1:
            return [*problems, f"axes.b = {b}, axes.max_num_pages = {max_pages} and axes.num_blocks = {blocks} must be at least 1"]
        if h_q not in mla_decode.HEAD_COUNTS:
            problems.append(f"axes.h_q = {h_q} must be one of {', '.join(map(str, mla_decode.HEAD_COUNTS))}")
        if not 1 <= s_q <= mla_decode.MAX_S_Q:
            problems.append(f"axes.s_q = {s_q} must be in [1, {mla_decode.MAX_S_Q}] (the next token and MTP drafts)")
        problems += mla_decode.page_problems(fmt, page, blocks, BLOCK_SIZE)
        capacity = max_pages * BLOCK_SIZE
        if self.rotates and axes["max_position"] < capacity:
            problems.append(f"axes.max_position = {axes['max_position']} must cover every position: at least max_num_pages x "
                            f"{BLOCK_SIZE} = {capacity}")
        if self.rotates and "positions" in given:
            pos = given["positions"].long()
            bad = (pos < 0) | (pos >= axes["max_position"])
            if bool(bad.any()):
                i, j = (int(x) for x in torch.nonzero(bad)[0])
                problems.append(f"inputs.positions[{i}][{j}] = {int(pos[i, j])} is outside [0, max_position = {axes['max_position']})")
        for name in ("kv_cache", "index_cache"):
            if name in given:
                problems.append(f"inputs.{name} cannot be given explicitly: the generator writes every cached token's record "
                                "(give seq_lens and block_table to replay a layout)")
        if "slot_mapping" in given and not {"seq_lens", "block_table"} <= set(given):
            problems.append("inputs.slot_mapping is given explicitly, so inputs.seq_lens and inputs.block_table must be too")
        if "block_table" in given and "seq_lens" not in given:
            problems.append("inputs.block_table is given explicitly, so inputs.seq_lens must be too")
        mla_problems = mla_decode._Decode(fmt)._param_problems({"b": b, "s_q": s_q}, {"attn_sink": params.get("attn_sink", {})})
        problems += mla_problems
        skip = integer_param(params.get("slot_mapping", {}), "slot_mapping", "skip", 0, problems)
        if skip is not None and not 0 <= skip <= b * s_q:
            problems.append(f"slot_mapping.params.skip = {skip} must be in [0, b x s_q = {b * s_q}]")
        problems += self._length_problems(axes, given, params)
        return problems

    def _length_problems(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
        b, s_q, max_pages, blocks = axes["b"], axes["s_q"], axes["max_num_pages"], axes["num_blocks"]
        capacity = max_pages * BLOCK_SIZE
        problems: list[str] = []
        if "seq_lens" not in given:
            p = params.get("seq_lens", {})
            lo = integer_param(p, "seq_lens", "min", 1, problems)
            hi = integer_param(p, "seq_lens", "max", capacity, problems)
            if lo is None or hi is None:
                return problems
            if not 0 <= lo <= hi <= capacity:
                return [*problems, f"seq_lens.params: min = {lo} and max = {hi} must satisfy 0 <= min <= max <= max_num_pages x "
                                   f"{BLOCK_SIZE} = {capacity}"]
            need = b * -(-hi // BLOCK_SIZE)
            if need > blocks:
                problems.append(f"random seq_lens up to {hi} may need {need} pages but num_blocks = {blocks}")
            return problems
        lens = given["seq_lens"].long()
        bad = (lens < 0) | (lens > capacity)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            return [f"inputs.seq_lens[{i}] = {int(lens[i])} is outside [0, max_num_pages x {BLOCK_SIZE} = {capacity}]"]
        reach = [-(-int(n) // BLOCK_SIZE) for n in lens.tolist()]
        if "block_table" not in given:
            if sum(reach) > blocks:
                problems.append(f"the rows need {sum(reach)} pages but num_blocks = {blocks}")
            return problems
        table = given["block_table"].long()
        seen: set[int] = set()
        for row, n in enumerate(reach):
            entries = table[row, :n].tolist()
            outside = [e for e in entries if not 0 <= e < blocks]
            if outside:
                return [*problems, f"inputs.block_table[{row}] holds page {outside[0]}, outside [0, num_blocks = {blocks})"]
            if seen & set(entries) or len(set(entries)) != len(entries):
                return [*problems, f"inputs.block_table[{row}] lists a page another row (or itself) already holds: two "
                                   "sequences writing one page leave its records undefined"]
            seen |= set(entries)
        if "slot_mapping" in given:
            slots = given["slot_mapping"].long()
            want = position_slots(table, new_positions(lens, s_q))
            bad = (slots != -1) & (slots != want)
            if bool(bad.any()):
                i, s = (int(x) for x in torch.nonzero(bad)[0])
                problems.append(f"inputs.slot_mapping[{i}][{s}] = {int(slots[i, s])} must be -1 or the slot of position "
                                f"L - s_q + s = {int(lens[i]) - s_q + s} through block_table[{i}] ({int(want[i, s])})")
        return problems

    # ------------------------------------------------------------------ traffic
    def min_traffic_bytes(self, axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
        """A lower bound on the bytes one step moves between DRAM and the chip::

            reads   Σ_b 132 · (tokens of b's longest row - tokens written this call)     keys of every row scored (length > k)
                  + Σ_b record · (min(k, longest row of b) - tokens written this call)   MLA records the decode must read
                  + 2 · h_q · d_qk · b · s_q                                           the decode queries
            writes  (record + 132) · (tokens written)                                    the new records and keys
                  + (2 · 512 + 4) · h_q · b · s_q + 4 · k · b · s_q                     out, lse and the ids

        ``record`` counts the format's value, used scale and RoPE bytes. A new token's key and record may stay
        on chip between its write and its use, so neither is counted as read; rows of one sequence share their
        tokens, so only its longest row counts. Smaller inputs (seq_lens, tables, weights) are left out.
        """
        fmt, topk = self.fmt, self.topk
        slots = inputs["slot_mapping"]
        b, s_q = slots.shape
        h_q = axes["h_q"]
        written = (slots >= 0).sum(dim=1).tolist()
        longest = inputs["seq_lens"].tolist()
        record = fmt.value_bytes + fmt.num_scales * fmt.scale_element_bytes + fmt.rope_bytes
        key = INDEXER_KEY_PAGE.bytes_per_token
        reads = 2 * h_q * fmt.d_qk * b * s_q
        for length, new in zip(longest, written, strict=True):
            if length > topk:
                reads += key * max(0, length - new)
            reads += record * max(0, min(topk, length) - new)
        writes = (record + key) * sum(written) + ((2 * mla_decode.D_V + 4) * h_q + 4 * topk) * b * s_q
        return reads + writes

    def useful_flops(self, axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
        """Tensor-core FLOPs of one step in bf16 equivalents: per query row of visible length L' (row ``s`` of
        sequence ``b`` sees ``L_b - (s_q - 1 - s)`` tokens), the decode's bf16 products ``2 · h_q · (d_qk + 512) ·
        min(k, L')`` plus half the indexer's FP8 products ``2 · 64 · 128 · L'`` where ``L' > k`` (a passthrough
        row is not scored). The halving puts both on the bf16 roofline: the FP8 rate is twice the bf16 one.
        """
        h_q, s_q, topk = axes["h_q"], axes["s_q"], self.topk
        decode_per_entry = 2 * h_q * (self.fmt.d_qk + mla_decode.D_V)
        index_per_token = 2 * INDEX_HEADS * INDEX_DIM
        total = 0
        for length in inputs["seq_lens"].tolist():
            for s in range(s_q):
                visible = max(0, length - (s_q - 1 - s))
                total += decode_per_entry * min(topk, visible)
                if visible > topk:
                    total += index_per_token * visible // 2
        return total

    # ------------------------------------------------------------------ expectations and checking
    def expect(self, inputs: Mapping[str, Value]) -> StepExpected:
        """The reference step on copies of the caches (the harness's inputs stay as built)."""
        kv_backing = kv_pages(inputs["kv_cache"]).clone()
        kv_cache = mla_decode.cache_view(self.fmt, kv_backing, BLOCK_SIZE)
        index_cache = inputs["index_cache"].clone()
        topk = self.topk
        insert(self.fmt, inputs, kv_cache, index_cache)
        rows = indexer_inputs(inputs, index_cache)
        ids = select(inputs, index_cache, topk)
        decoded = mla_decode.expect(self.fmt, inputs["q"], kv_cache, ids, inputs["sm_scale"], inputs["attn_sink"])
        observed = observe_pages({**inputs, "kv_cache": kv_cache, "index_cache": index_cache})
        return StepExpected(observed["kv_pages"], observed["index_pages"], ids, decoded["out"], decoded["lse"],
                            indexer.expect(rows, topk=topk), rows, kv_cache, decoded["out_noise"])

    def check(self, inputs: Mapping[str, Value], outputs: Mapping[str, torch.Tensor], expected: Any, tol: Tolerance) -> CheckResult:
        """Records byte-exact, then the ids modulo ties, then out/lse against the decode of the solution's ids."""
        for name, fmt in (("kv_pages", self.fmt), ("index_pages", INDEXER_KEY_PAGE)):
            problem = _page_problem(name, fmt, inputs["slot_mapping"], outputs[name], getattr(expected, name))
            if problem is not None:
                return problem
        ids = outputs["topk_indices"]
        b, s_q, topk = ids.shape
        verdict = indexer.check(expected.rows, {"topk_indices": ids.reshape(b * s_q, topk)}, expected.indexer, tol,
                                topk=topk)
        if not verdict.passed:
            return replace(verdict, message=f"topk_indices (indexer row = b x s_q + s): {verdict.message}")
        same = torch.equal(torch.sort(ids.long(), dim=-1).values, torch.sort(expected.ids.long(), dim=-1).values)
        if same:
            want = {"out": expected.out, "lse": expected.lse, "out_noise": expected.out_noise}
        else:  # a tie choice the indexer accepted: the decode of the solution's own ids is the answer
            want = mla_decode.expect(self.fmt, inputs["q"], expected.kv_cache, ids.to(torch.int32), inputs["sm_scale"], inputs["attn_sink"])
        # empty rows follow from the ids the decode read (the solution's, equal to the reference's modulo ties)
        decoded = mla_decode.check_rows(ids, None, {"out": outputs["out"], "lse": outputs["lse"]}, want, tol)
        if not decoded.passed or same:
            return decoded
        return replace(decoded, message="ids differ from the reference's within the tie tolerance; out and lse were judged against "
                                        "the decode reference on the solution's ids")


@dataclass(frozen=True)
class StepExpected:
    """What the checker compares against (all from the reference on copies of the given caches)."""

    kv_pages: torch.Tensor
    index_pages: torch.Tensor
    ids: torch.Tensor  # [b, s_q, topk] the reference's selection
    out: torch.Tensor
    lse: torch.Tensor
    indexer: list  # indexer.expect of the rows: reference scores and tie tolerances
    rows: dict[str, torch.Tensor]  # the indexer's inputs on the updated key cache
    kv_cache: torch.Tensor  # the updated MLA cache, for the decode of a solution's own ids
    out_noise: torch.Tensor  # each decode row's scale of the bf16-probability error (mla_decode.expect, the row check)


def _page_problem(name: str, fmt: KvRecordFormat, slot_mapping: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> CheckResult | None:
    """The first differing byte of an observed page, named by token, block, slot and field (None: all equal)."""
    differ = got.view(torch.uint8) != want.to(got.device)
    if not bool(differ.any()):
        return None
    b, s, offset = (int(i) for i in torch.nonzero(differ)[0])
    slot = int(slot_mapping[b, s])
    where, rel, field = kv_insert.locate(fmt, BLOCK_SIZE, offset)
    place = "page padding" if where is None else f"slot {where} {field}"
    whose = "the new token's record" if where is not None and where == slot % BLOCK_SIZE else "another token's bytes (must stay as given)"
    return CheckResult(Status.INCORRECT_NUMERICAL,
                       f"{name}: new token (b {b}, s {s}) at slot {slot}: block {slot // BLOCK_SIZE} {place} byte {rel} "
                       f"({whose}): expected 0x{int(want[b, s, offset]):02X}, got 0x{int(got[b, s, offset]):02X}; "
                       f"{int(differ.sum())} byte(s) differ")


# --------------------------------------------------------------------------- definitions


def name_of(fmt: KvRecordFormat, topk: int) -> str:
    """``dsa_decode_step_v32``, ``dsa_decode_step_v4``; other selection sizes than 2048 get ``_topk{k}``."""
    base = f"dsa_decode_step_{fmt.kv_format.lower()}"
    return base if topk == indexer.TOPK else f"{base}_topk{topk}"


def _definition(fmt: KvRecordFormat, topk: int) -> Definition:
    family = _Step(fmt, topk)
    rows: tuple[TensorSpec, ...]
    if family.rotates:
        rows = (TensorSpec("kv", ("b", "s_q", "latent_dim"), torch.bfloat16, "new tokens' latent KV; last 64 dims RoPE, not rotated"),
                TensorSpec("positions", ("b", "s_q"), torch.int64, "new tokens' positions in cos_sin_cache"),
                TensorSpec("cos_sin_cache", ("max_position", "rope_dim"), torch.float32, "cos in [0,32), sin in [32,64)"))
    else:
        rows = (TensorSpec("kv_c", ("b", "s_q", "latent_dim"), torch.bfloat16, "new tokens' compressed latent KV (NoPE)"),
                TensorSpec("k_pe", ("b", "s_q", "rope_dim"), torch.bfloat16, "new tokens' RoPE key, already rotated"))
    specs = (
        TensorSpec("q", ("b", "s_q", "h_q", "d_qk"), torch.bfloat16, "decode queries; RoPE dims last"),
        *rows,
        TensorSpec("index_k", ("b", "s_q", "index_head_dim"), torch.bfloat16, "new tokens' indexer keys"),
        TensorSpec("slot_mapping", ("b", "s_q"), torch.int64, "new tokens' slots page*64+offset (both caches); -1: not written"),
        TensorSpec("kv_cache", ("num_blocks", "block_size", "h_kv", "bytes_per_token"), torch.uint8,
                   f"paged {fmt.kv_format} records (the decode's layout; stride(0) = page_bytes); updated in place"),
        TensorSpec("index_cache", ("num_blocks", "block_size", "h_kv", "index_bytes_per_token"), torch.int8,
                   "DeepGEMM indexer key pages (64 x 128 FP8, then 64 fp32 scales); updated in place"),
        TensorSpec("q_index_fp8", ("b", "s_q", "index_heads", "index_head_dim"), torch.float8_e4m3fn, "index queries"),
        TensorSpec("weights", ("b", "s_q", "index_heads"), torch.float32, "index head weights"),
        TensorSpec("seq_lens", ("b",), torch.int32, "context per sequence after this step's tokens"),
        TensorSpec("block_table", ("b", "max_num_pages"), torch.int32, "page ids per sequence, both caches"),
        TensorSpec("sm_scale", (), torch.float32, "softmax scale"),
        TensorSpec("attn_sink", ("h_q",), torch.float32, "per-head sink logit; -inf: none"),
    )
    names = [s.name for s in specs]

    def reference(*args: Value) -> dict[str, torch.Tensor]:
        given = dict(zip(names, args, strict=True))
        return step(fmt, given, topk)

    var = ("b", "s_q", "h_q", "max_num_pages", "num_blocks", "page_bytes", *(("max_position",) if family.rotates else ()))
    const = {"d_qk": fmt.d_qk, "h_kv": 1, "bytes_per_token": fmt.bytes_per_token, "d_v": mla_decode.D_V, "block_size": BLOCK_SIZE,
             "latent_dim": kv_insert.LATENT_DIMS, "rope_dim": kv_insert.ROPE_DIMS, "index_heads": INDEX_HEADS,
             "index_head_dim": INDEX_DIM, "index_bytes_per_token": INDEXER_KEY_PAGE.bytes_per_token,
             "index_page_bytes": INDEX_PAGE_BYTES, "topk": topk}
    return Definition(
        name=name_of(fmt, topk),
        description=f"One DSA decode step over {fmt.kv_format} FP8 caches: insert the new tokens' records and indexer keys, "
                    "score every context token, select the top-k, sparse-decode those ids.",
        const_axes=const,
        var_axes=var,
        inputs=specs,
        outputs=(
            TensorSpec("out", ("b", "s_q", "h_q", "d_v"), torch.bfloat16),
            TensorSpec("lse", ("b", "s_q", "h_q"), torch.float32, "natural log; +inf on an empty row"),
            TensorSpec("topk_indices", ("b", "s_q", "topk"), torch.int32, "selected physical ids page*64+slot, -1 padded"),
        ),
        reference=reference,
        generate=family.generate,
        validate=family.validate,
        redraw=family.draw_values,
        expect=family.expect,
        check=family.check,
        key_axes=("b", "h_q", "s_q", "max_num_pages"),
        reference_uncapturable=WRITE_SYNCS,
        notes=(
            "Caches are inputs updated in place; the harness reads back the page of every new token's slot in both caches "
            "(observed outputs kv_pages, index_pages) and compares them byte for byte.",
            "topk_indices are judged by the indexer's checker (a set, modulo its tie tolerance); out and lse by the decode's, "
            "against the decode reference on the solution's own ids where they differ from the reference's.",
            "Query row (b, s) sees the first L_b - (s_q - 1 - s) tokens; block size 64 for both caches, so the indexer's "
            "ids are the decode's.",
            "No state across calls: every call is one step from the given caches (scratch buffers only).",
        ),
        observed=(
            TensorSpec("kv_pages", ("b", "s_q", "page_bytes"), torch.uint8, "the MLA page of each new token's slot after the call"),
            TensorSpec("index_pages", ("b", "s_q", "index_page_bytes"), torch.uint8, "the key page of each new token's slot"),
        ),
        observe=observe_pages,
        min_traffic_bytes=family.min_traffic_bytes,
        useful_flops=family.useful_flops,
        math_precision="bf16",
    )


DEFINITIONS = tuple(_definition(fmt, k) for fmt in (V32, V4) for k in REGISTERED_TOPKS[fmt.kv_format])
FORMAT_OF = {name_of(fmt, k): fmt for fmt in (V32, V4) for k in REGISTERED_TOPKS[fmt.kv_format]}
