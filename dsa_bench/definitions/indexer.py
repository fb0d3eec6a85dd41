"""``dsa_topk_indexer_fp8_h64_d128_topk{K}_ps64``: the lightning indexer with its top-k.

One contract, three selection sizes: K = 2048 (DeepSeek-V3.2), 512 and 1024 (DeepSeek-V4's two
model sizes) on the same FP8 key pages; every function takes ``topk`` and :data:`DEFINITIONS`
binds it. The text below says 2048 for K.

Per row b with L = seq_lens[b], token j < L lives on page ``block_table[b, j // 64]`` at slot
``j % 64``. Its score is ``Σ_h weights[b,h] · relu(q[b,h] · K[j])`` with K[j] the dequantised
FP8 key (value × per-token scale; the scale is applied after the head sum, which is exact
because scales are non-negative). The output row holds the physical ids
(``page * 64 + slot``) of the ``min(2048, L)`` best tokens in any order, then -1 padding
(L = 0: all -1). Block-table entries past a row's ``ceil(L / 64)`` pages are not part of the
input: they may hold any value and no kernel may read what they name.

The checker accepts a selected token scoring below the reference's k-th best by at most the
row's tie tolerance, derived from an error model of a correct FP8 kernel (see
:func:`tie_tolerances` and docs/checks.md#the-indexers-tie-tolerance).
"""

from __future__ import annotations

import functools
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
    is_finite_number,
    is_integer,
    unknown_params,
)
from dsa_bench.definitions.kv_records import INDEXER_KEY_PAGE
from dsa_bench.definitions.status import CheckResult, Status

NUM_HEADS = 64
HEAD_DIM = 128
TOPK = 2048
#: the selection sizes with a definition: V3.2's 2048, then V4's 512 and 1024
TOPKS = (2048, 512, 1024)
PAGE_SIZE = 64


def name_of(topk: int) -> str:
    """The definition name of the indexer that keeps ``topk`` tokens per row."""
    return f"dsa_topk_indexer_fp8_h64_d128_topk{topk}_ps64"


NAME = name_of(TOPK)
assert INDEXER_KEY_PAGE.block_size == PAGE_SIZE and INDEXER_KEY_PAGE.quant_dims == HEAD_DIM


def _pages_of(seq_len: int) -> int:
    return (seq_len + PAGE_SIZE - 1) // PAGE_SIZE


def token_ids(block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Physical ids of positions ``0..seq_len-1`` of one row, as int64."""
    pos = torch.arange(seq_len, device=block_table_row.device)
    pages = block_table_row[: _pages_of(seq_len)].long()
    return pages[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE


def _gathered_keys(
    k_index_cache_fp8: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row's FP8 key values as float32 ``[batch, max_num_pages * 64, 128]``, their scales
    ``[batch, max_num_pages * 64]`` and which positions lie below the row's seq_len.

    Each row's pages are gathered through its block table (padded to the table's width), so
    nothing waits on the host. Block-table entries past a row's last page are never read (they
    may hold anything): their positions read page 0, and callers mask them.
    """
    batch, max_pages = block_table.shape
    lens = seq_lens.long()[:, None]
    page_used = torch.arange(max_pages, device=block_table.device) * PAGE_SIZE < lens  # [batch, max_pages]
    pages = torch.where(page_used, block_table.long(), 0)
    # gather bytes: fp8 has no index kernel
    keys = INDEXER_KEY_PAGE.values(k_index_cache_fp8).view(torch.uint8)[pages].view(torch.float8_e4m3fn)
    keys = keys.reshape(batch, max_pages * PAGE_SIZE, HEAD_DIM).float()
    token_scales = INDEXER_KEY_PAGE.scales(k_index_cache_fp8)[pages].reshape(batch, max_pages * PAGE_SIZE)
    in_row = torch.arange(max_pages * PAGE_SIZE, device=keys.device) < lens
    return keys, token_scales, in_row


def scores(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> torch.Tensor:
    """``[batch, max_num_pages * 64]`` float32 scores of every row's tokens in position order,
    -inf at positions ``>= seq_lens[b]``.

    All rows at once (:func:`_gathered_keys`); an invalid position's score is masked, never
    computed into a valid one.
    """
    return _scores_and_tie_tolerances(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, with_tolerances=False)[0]


def row_scores(
    q_row: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights_row: torch.Tensor,
    block_table_row: torch.Tensor,
    seq_len: int,
) -> torch.Tensor:
    """``[seq_len]`` float32 scores of one row's tokens, in position order (:func:`scores` of one row)."""
    lens = torch.tensor([seq_len], dtype=torch.int32, device=q_row.device)
    table = block_table_row[None, : _pages_of(seq_len)]
    return scores(q_row[None], k_index_cache_fp8, weights_row[None], lens, table)[0, :seq_len]


# --------------------------------------------------------------------------- the tie tolerance
#
# A correct kernel computes each token's score with rounding errors of its own, so its top-k may
# hold a token the reference ranks just below the k-th best. If every score a kernel computes is
# within delta of the true one, each rank of its selection scores at most 2·delta below the same
# rank of the true top-k (the checker compares the two sorted lists). delta comes from this model
# (the derivation and its checks: docs/checks.md#the-indexers-tie-tolerance):
#
# - q and the key values are FP8, so every product q[h,i]·k[j,i] is exact; the errors are in the
#   sums. The coarsest accumulator a correct kernel uses for the 128-term dot is an FP8 tensor
#   core's (Hopper's wgmma keeps 13 fraction bits and truncates: unit 2^-13; DeepGEMM's logits
#   accumulate the whole dot there, in 4 steps of 32 products). Its error on one dot has an RMS
#   of DOT_ERROR_RMS · 2^-13 · ||q_h ∘ k_j||_2 (the partial sums it truncates grow like a random
#   walk of the products); fp32 accumulation is 2^11 times finer.
# - Heads have independent queries, so their errors add in quadrature through the weights:
#   sigma_j = DOT_ERROR_RMS · 2^-13 · s_j · sqrt(Σ_h w_h² ||q_h ∘ k_j||²), and relu only shrinks an error.
# - The fp32 rounding of relu·weight, the head sum in any order, the scale before or after it:
#   at most HEAD_SUM_GAMMA · s_j · Σ_h |w_h| relu(q_h·k_j).
# - delta_j = TAIL_SIGMAS · sigma_j + that; the row's tolerance is 2 · max_j delta_j.

#: unit roundoff of the coarsest accumulator of the model: an FP8 tensor core's 13 fraction bits, truncated
ACCUMULATOR_UNIT = 2.0**-13
#: RMS error of one dot product, in units of ACCUMULATOR_UNIT · ||q_h ∘ k_j||_2 (derived 1.1 for a
#: truncating 13-fraction-bit accumulator over 4 steps; emulations measure 0.93 to 1.02)
DOT_ERROR_RMS = 1.1
#: standard deviations of a token's score error the tolerance allows
TAIL_SIGMAS = 6.0
#: fp32 rounding bound (γ_n = n·2^-24) of relu·weight, the 64-head sum in any order and the scale
HEAD_SUM_GAMMA = (NUM_HEADS + 2) * 2.0**-24


@dataclass(frozen=True)
class ScoredRow:
    """What the checker needs of a row that must be ranked (seq_len > 2048)."""

    scores: torch.Tensor  # [seq_len] float32 reference scores, in position order
    tie_tolerance: float  # how far below the k-th best a correct kernel's pick may score (the model's bound)


def _tolerance_terms(
    q: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor, relu_logits: torch.Tensor, in_row: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two maxima over a row's positions that :func:`tie_tolerances` combines (``[batch]`` each):
    ``s_j sqrt(Σ_h w_h² ||q_h ∘ k_j||²)`` and ``s_j Σ_h |w_h| relu(q_h·k_j)``. Maxima of chunks of
    a row combine into the row's by another maximum, so the reference may score a row in chunks."""
    w = weights.float()  # a bound needs no more precision than float32 gives it
    query_weight = (w.square()[:, :, None] * q.float().square()).sum(dim=1)  # Σ_h w_h² q_hi², [batch, 128]
    spread = scales * torch.bmm(keys.square(), query_weight[:, :, None])[:, :, 0].sqrt()  # s_j sqrt(Σ_h w_h² ||q_h ∘ k_j||²)
    magnitude = torch.bmm(w.abs()[:, None, :], relu_logits)[:, 0] * scales  # s_j Σ_h |w_h| relu(q_h·k_j)
    return torch.where(in_row, spread, 0.0).amax(dim=1), torch.where(in_row, magnitude, 0.0).amax(dim=1)


def _tolerance_of(spread: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """The row's tolerance from its :func:`_tolerance_terms`: 2 · (TAIL_SIGMAS · sigma + the fp32 rounding bound)."""
    sigma = DOT_ERROR_RMS * ACCUMULATOR_UNIT * spread
    return 2.0 * (TAIL_SIGMAS * sigma + HEAD_SUM_GAMMA * magnitude)


def tie_tolerances(
    q: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor, relu_logits: torch.Tensor, in_row: torch.Tensor
) -> torch.Tensor:
    """The model's bound per row (``[batch]``) on how far below the true k-th best a correct
    kernel's pick may score. ``q`` ``[batch, 64, 128]`` and ``weights`` ``[batch, 64]``; ``keys``
    the FP8 key values as float ``[batch, n, 128]`` and their ``scales`` ``[batch, n]``;
    ``relu_logits`` = relu(q @ keys^T) ``[batch, 64, n]``; ``in_row`` the positions that count."""
    return _tolerance_of(*_tolerance_terms(q, keys, scales, weights, relu_logits, in_row))


#: Largest float32 intermediate (elements) of one scoring step: the gathered keys [rows, n, 128]
#: and the logits [rows, 64, n] of n positions. Rows longer than this allows are scored a chunk
#: of pages at a time (128 rows of 128K tokens would otherwise need 13 GB); every contest-shaped
#: case fits in one chunk, so its scores are computed exactly as before.
SCORE_CHUNK_ELEMENTS = 2**26


def _chunk_pages(batch: int, max_pages: int) -> int:
    """Block-table columns scored together so that one chunk stays within SCORE_CHUNK_ELEMENTS."""
    per_page = max(batch, 1) * PAGE_SIZE * (HEAD_DIM + NUM_HEADS)
    return max(1, min(max_pages, SCORE_CHUNK_ELEMENTS // per_page))


def _scores_and_tie_tolerances(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    with_tolerances: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`scores`, and each row's :func:`tie_tolerances` from the same gathered keys.

    Chunks of :func:`_chunk_pages` block-table columns are scored one after another (no host
    sync: the chunks follow from the table's shape); the tolerance's two maxima are taken over
    the chunks, so it is the one the whole row gives.
    """
    batch, max_pages = block_table.shape
    step = _chunk_pages(batch, max_pages)
    lens = seq_lens.long()
    q = q_index_fp8.float()
    w = weights.float()[:, None, :]
    parts, spreads, magnitudes = [], [], []
    for first in range(0, max(max_pages, 1), step):
        table = block_table[:, first : first + step]
        chunk_lens = (lens - first * PAGE_SIZE).clamp(0, table.shape[1] * PAGE_SIZE)
        keys, token_scales, in_row = _gathered_keys(k_index_cache_fp8, chunk_lens, table)
        logits = torch.bmm(q, keys.mT).relu_()  # [batch, heads, positions]
        row = torch.bmm(w, logits)[:, 0] * token_scales  # the weighted head sum
        parts.append(row.masked_fill(~in_row, float("-inf")))
        if with_tolerances:
            spread, magnitude = _tolerance_terms(q_index_fp8, keys, token_scales, weights, logits, in_row)
            spreads.append(spread)
            magnitudes.append(magnitude)
        del keys, logits, row
    row_scores = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    if not with_tolerances:
        return row_scores, None
    spread, magnitude = (torch.stack(x).amax(dim=0) for x in (spreads, magnitudes))
    return row_scores, _tolerance_of(spread, magnitude)


def reference(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    topk: int = TOPK,
) -> dict[str, torch.Tensor]:
    """The contract on the whole batch, without a host sync.

    A row of L <= topk tokens is its block table expanded in position order (then -1); a longer
    row holds the ids of its topk best scores, best first (``torch.topk`` over the row padded to
    the table's width with -inf, so a padded position is never picked). L = 0 gives all -1.
    """
    batch, max_pages = block_table.shape
    width = max_pages * PAGE_SIZE
    pos = torch.arange(width, device=block_table.device)
    lens = seq_lens.long()[:, None]
    in_row = pos < lens
    # a position past the row's pages maps through an entry that may hold anything: never used
    ids = torch.where(in_row, block_table.long()[:, pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE, -1)
    if width < topk:
        ids = torch.nn.functional.pad(ids, (0, topk - width), value=-1)
    passthrough = ids[:, :topk]
    if width <= topk:  # no row can hold more than topk tokens
        return {"topk_indices": passthrough.to(torch.int32)}
    best = torch.topk(scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table), topk, dim=1).indices
    chosen = torch.where(lens > topk, ids.gather(1, best), passthrough)
    return {"topk_indices": chosen.to(torch.int32)}


# --------------------------------------------------------------------------- inputs


def allocate_block_table(seq_lens: np.ndarray, max_num_pages: int, num_pages: int, rng: np.random.Generator) -> np.ndarray:
    """Block table from a page allocator that never gives one page to two rows.

    Entries past a row's last page hold pages no row owns (their bytes are NaN), so a kernel
    that reads past seq_len gets NaN instead of another row's data.
    """
    needed = [_pages_of(int(n)) for n in seq_lens]
    pool = rng.permutation(num_pages)
    table = np.empty((len(seq_lens), max_num_pages), dtype=np.int64)
    used = sum(needed)
    free = pool[used:]
    start = 0
    for b, n in enumerate(needed):
        table[b, :n] = pool[start : start + n]
        start += n
        pad = max_num_pages - n
        table[b, n:] = rng.choice(free, pad) if len(free) else 0
    return table


def _first_occurrences(ids: torch.Tensor) -> torch.Tensor:
    """Ascending positions in the 1-D ``ids`` of the first occurrence of each distinct value."""
    distinct, inverse = torch.unique(ids, return_inverse=True)
    positions = torch.arange(ids.numel(), device=ids.device)
    first = torch.full((distinct.numel(),), ids.numel(), dtype=torch.long, device=ids.device)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")  # a minimum: the same in any order
    return torch.sort(first).values


#: default relative spread of a near-constant row's scores
NEAR_CONSTANT_SPREAD = 1e-3
#: Keys are drawn this many tokens at a time when a case has more (64 rows of 128K tokens
#: would otherwise need a 4 GB float32 draw); every case with fewer draws them at once, as
#: before this limit existed, so its recorded seeds keep their inputs.
KEY_DRAW_CHUNK = 2**18


@dataclass(frozen=True)
class KeyOptions:
    """The generator parameters of ``k_index_cache_fp8`` (see :data:`GENERATOR_PARAMS`)."""

    distinct_keys: int | None = None  # a pool of this many keys, picked at random: exact score ties
    near_constant_rows: tuple[int, ...] = ()  # rows whose tokens get one key times 1 + spread · N(0, 1)
    near_constant_spread: float = NEAR_CONSTANT_SPREAD


def _fill_keys(cache: torch.Tensor, seq_lens: list[int], block_table: torch.Tensor, rng: InputRng, options: KeyOptions) -> None:
    """Give random FP8 keys to exactly the tokens some row can read; all else stays NaN.

    Keys are drawn for every (row, position) in row order, as always, so recorded seeds keep
    their inputs. A page two rows share (prefix caching) lists its tokens more than once; each
    token is written once, with the key of its first occurrence, because which of two writes to
    one place lands last varies with thread scheduling and the harness and the worker would
    build different caches.

    A near-constant row's tokens get one shared key scaled by 1 + spread · N(0, 1) each (drawn
    before the other keys): FP8 values identical, per-token scales (and so scores) a relative
    ``spread`` apart. A token such a row shares with an earlier row keeps that row's key.
    """
    rows = [(b, n) for b, n in enumerate(seq_lens) if n > 0]
    if not rows:
        return
    ids_all = torch.cat([token_ids(block_table[b], n) for b, n in rows]).to(rng.device)
    total = ids_all.numel()
    once = _first_occurrences(ids_all)  # all positions, in order, when no page is shared
    pick = None
    if options.distinct_keys is not None:  # a small pool of keys makes exact score ties
        pool = rng.randn(options.distinct_keys, HEAD_DIM)
        pick = torch.randint(0, options.distinct_keys, (total,), generator=rng.values, device=rng.device)
    flat = None
    if options.near_constant_rows:
        chosen = set(options.near_constant_rows)
        row_of = torch.repeat_interleave(torch.tensor([b for b, _ in rows]), torch.tensor([n for _, n in rows])).to(rng.device)
        flat = torch.isin(row_of, torch.tensor(sorted(chosen), device=rng.device))
    base = factors = None
    if flat is not None:  # drawn first: the keys are drawn and written a chunk at a time
        base = rng.randn(1, HEAD_DIM)
        factors = 1.0 + options.near_constant_spread * rng.randn(total)
    step = total if total <= KEY_DRAW_CHUNK else KEY_DRAW_CHUNK
    for first in range(0, total, step):
        last = min(first + step, total)
        keys = rng.randn(last - first, HEAD_DIM) if pick is None else pool[pick[first:last]]
        mine = once[(once >= first) & (once < last)]
        chunk = keys[mine - first]
        if flat is not None:
            assert base is not None and factors is not None
            sel = flat[mine]
            chunk[sel] = base * factors[mine][sel][:, None]
        INDEXER_KEY_PAGE.write(cache, PAGE_SIZE, ids_all[mine], INDEXER_KEY_PAGE.quantize(chunk, "raw"))
        del keys, chunk


#: the signs ``weights.params.sign`` may give every head weight ("mixed": the N(0, 1) draw's own)
WEIGHT_SIGNS = ("mixed", "positive", "negative")


def draw_queries(axes: Mapping[str, int], rng: InputRng, params: Mapping[str, dict] | None = None) -> dict[str, torch.Tensor]:
    """The cheap per-call inputs (queries and head weights); timing redraws them before every call.

    Weights are N(0, 1/64); ``params["weights"]`` may set their ``sign`` (every weight made
    positive or negative by its absolute value) and a ``scale`` (a multiplier), so the scores'
    distribution moves while the draw stays the same.
    """
    batch = axes["batch_size"]
    q = rng.randn(batch, NUM_HEADS, HEAD_DIM).to(torch.float8_e4m3fn)
    weights = rng.randn(batch, NUM_HEADS) * NUM_HEADS**-0.5
    p = (params or {}).get("weights", {})
    sign = p.get("sign", "mixed")
    if sign != "mixed":
        weights = weights.abs() if sign == "positive" else -weights.abs()
    if "scale" in p:
        weights = weights * float(p["scale"])
    return {"q_index_fp8": q, "weights": weights}


def given_or_drawn_seq_lens(given: Mapping[str, Value], params: Mapping[str, dict], rows: int, max_tokens: int,
                            rng: InputRng) -> torch.Tensor:
    """``seq_lens [rows]`` int32 on the generator's device: the trace's, else uniform in the trace's
    ``seq_lens.params`` ``[min, max]`` (default ``[1, max_tokens]``)."""
    if "seq_lens" in given:
        return given["seq_lens"].to(rng.device)
    p = params.get("seq_lens", {})
    lo, hi = int(p.get("min", 1)), int(p.get("max", max_tokens))
    return torch.from_numpy(rng.structure.integers(lo, hi + 1, rows)).to(torch.int32).to(rng.device)


def generate(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict], rng: InputRng) -> dict[str, Value]:
    batch, max_pages, num_pages = axes["batch_size"], axes["max_num_pages"], axes["num_pages"]
    device = rng.device
    seq_lens = given_or_drawn_seq_lens(given, params, batch, max_pages * PAGE_SIZE, rng)
    lens = seq_lens.tolist()
    if "block_table" in given:
        block_table = given["block_table"].to(device)
    else:
        group = int(params.get("block_table", {}).get("rows_per_sequence", 1))
        # MTP: each sequence's consecutive rows read one table row, allocated for the longest of them
        longest = np.asarray(lens, dtype=np.int64).reshape(-1, group).max(axis=1) if lens else np.asarray(lens)
        table = np.repeat(allocate_block_table(longest, max_pages, num_pages, rng.structure), group, axis=0)
        block_table = torch.from_numpy(table).to(torch.int32).to(device)
    queries = draw_queries(axes, rng, params)
    q = given["q_index_fp8"].to(device) if "q_index_fp8" in given else queries["q_index_fp8"]
    weights = given["weights"].to(device) if "weights" in given else queries["weights"]
    if "k_index_cache_fp8" in given:
        cache = given["k_index_cache_fp8"].to(device)
    else:
        cache = INDEXER_KEY_PAGE.empty_cache(num_pages, device)
        _fill_keys(cache, lens, block_table, rng, key_options(params))
    return {
        "q_index_fp8": q,
        "k_index_cache_fp8": cache,
        "weights": weights,
        "seq_lens": seq_lens,
        "block_table": block_table,
    }


def key_options(params: Mapping[str, dict]) -> KeyOptions:
    """The key generator's options from a (validated) case's parameters."""
    p = params.get("k_index_cache_fp8", {})
    distinct = p.get("distinct_keys")
    return KeyOptions(
        None if distinct is None else int(distinct),
        tuple(int(b) for b in p.get("near_constant_rows", ())),
        float(p.get("near_constant_spread", NEAR_CONSTANT_SPREAD)),
    )


#: The generator parameters each random input takes (the others take none).
GENERATOR_PARAMS = {
    "seq_lens": ("min", "max"),
    "k_index_cache_fp8": ("distinct_keys", "near_constant_rows", "near_constant_spread"),
    "weights": ("sign", "scale"),
    "block_table": ("rows_per_sequence",),
}


def _option_problems(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
    """Problems with the weights, near-constant-key and MTP block-table parameters."""
    problems: list[str] = []
    batch = axes["batch_size"]
    w = params.get("weights", {})
    if "sign" in w and w["sign"] not in WEIGHT_SIGNS:
        problems.append(f"weights.params.sign = {w['sign']!r} must be one of {', '.join(WEIGHT_SIGNS)}")
    if "scale" in w and not (is_finite_number(w["scale"]) and w["scale"] > 0):
        problems.append(f"weights.params.scale = {w['scale']!r} must be a finite number above 0")
    k = params.get("k_index_cache_fp8", {})
    rows = k.get("near_constant_rows")
    if rows is not None:
        if not isinstance(rows, list) or not all(is_integer(b) for b in rows):
            problems.append(f"k_index_cache_fp8.params.near_constant_rows = {rows!r} must be a list of row indices")
        else:
            for b in rows:
                if not 0 <= b < batch:
                    problems.append(f"k_index_cache_fp8.params.near_constant_rows holds {b}, not a row of batch_size = {batch}")
                    break
            if len(set(rows)) != len(rows):
                problems.append("k_index_cache_fp8.params.near_constant_rows lists a row twice")
    if "near_constant_spread" in k:
        spread = k["near_constant_spread"]
        if not (is_finite_number(spread) and 0 < spread <= 0.1):
            problems.append(f"k_index_cache_fp8.params.near_constant_spread = {spread!r} must be a number in (0, 0.1]")
        elif rows is None:
            problems.append("k_index_cache_fp8.params.near_constant_spread needs near_constant_rows (the rows it applies to)")
    group = integer_param(params.get("block_table", {}), "block_table", "rows_per_sequence", None, problems)
    if group is not None:
        if group < 1:
            problems.append(f"block_table.params.rows_per_sequence = {group} must be at least 1")
        elif batch % group:
            problems.append(f"block_table.params.rows_per_sequence = {group} does not divide batch_size = {batch}")
        elif "seq_lens" not in given:
            problems.append("block_table.params.rows_per_sequence needs explicit seq_lens (the rows of one sequence share pages)")
    return problems


def _sequence_reach(reach: list[int], params: Mapping[str, dict]) -> list[int]:
    """Pages each allocated table row needs: one per row, or per MTP sequence its longest row's."""
    group = params.get("block_table", {}).get("rows_per_sequence", 1)
    if not is_integer(group) or group < 1 or len(reach) % group:
        return reach
    return [max(reach[i : i + group]) for i in range(0, len(reach), group)]


def validate(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
    """Everything in a case that would make input generation or the reference fail.

    With random seq_lens the checks cover every length the parameters allow (up to ``max``), so
    no seed can draw a case the block table or the page pool cannot serve.
    """
    problems = unknown_params(params, GENERATOR_PARAMS) + _option_problems(axes, given, params)
    batch, max_pages, num_pages = axes["batch_size"], axes["max_num_pages"], axes["num_pages"]
    capacity = max_pages * PAGE_SIZE
    longest: int | None = None  # the largest seq_len the random parameters allow
    if "seq_lens" not in given:
        before = len(problems)
        p = params.get("seq_lens", {})
        lo = integer_param(p, "seq_lens", "min", 1, problems)
        hi = integer_param(p, "seq_lens", "max", capacity, problems)
        if lo is not None and lo < 0:
            problems.append(f"seq_lens.params.min = {lo} is negative")
        if hi is not None and hi > capacity:
            problems.append(f"seq_lens.params.max = {hi} exceeds max_num_pages*{PAGE_SIZE} = {capacity}")
        if lo is not None and hi is not None and lo > hi:
            lo_text = f"min = {lo}" if "min" in p else f"min = {lo} (the default)"
            hi_text = f"max = {hi}" if "max" in p else f"max = {hi} (the default, max_num_pages*{PAGE_SIZE})"
            problems.append(f"seq_lens.params: {lo_text} is above {hi_text}")
        if len(problems) == before:
            longest = hi
    distinct = integer_param(params.get("k_index_cache_fp8", {}), "k_index_cache_fp8", "distinct_keys", None, problems)
    if distinct is not None and not 1 <= distinct <= num_pages * PAGE_SIZE:
        problems.append(
            f"k_index_cache_fp8.params.distinct_keys = {distinct} must be in [1, num_pages*{PAGE_SIZE} = {num_pages * PAGE_SIZE}]"
        )
    if "seq_lens" in given:
        lens = given["seq_lens"].tolist()
        for b, n in enumerate(lens):
            if n < 0 or n > capacity:
                problems.append(f"seq_lens[{b}] = {n} is outside [0, max_num_pages*{PAGE_SIZE} = {capacity}]")
        reach = [_pages_of(max(0, min(n, capacity))) for n in lens]
        why = ""
    elif longest is not None:
        reach = [_pages_of(longest)] * batch
        why = f" (random seq_lens up to max = {longest} reach the first {_pages_of(longest)} entries of every row)"
    else:
        return problems
    if "block_table" in given:
        table = given["block_table"].tolist()
        for b, n_pages in enumerate(reach):
            entries = table[b][:n_pages]
            for j, page in enumerate(entries):
                if not 0 <= page < num_pages:
                    problems.append(f"block_table[{b}][{j}] = {page} is not a page id in [0, num_pages = {num_pages}){why}")
                    break
            if len(set(entries)) != len(entries):
                problems.append(f"block_table[{b}] lists a page twice among its first {len(entries)} entries{why}")
    elif sum(_sequence_reach(reach, params)) > num_pages:
        if "seq_lens" in given:
            problems.append(f"the rows need {sum(_sequence_reach(reach, params))} pages but num_pages = {num_pages}")
        else:
            problems.append(
                f"random seq_lens up to max = {longest} may need {batch} x {reach[0]} = {sum(reach)} pages but num_pages = {num_pages}; "
                "lower seq_lens.params.max or raise num_pages"
            )
    return problems


# --------------------------------------------------------------------------- checking


def expect(inputs: Mapping[str, Value], *, topk: int = TOPK) -> list[ScoredRow | None]:
    """Reference scores and tie tolerance of each row that must be ranked (None where every token is selected).

    One batched call over the rows with more than ``topk`` tokens, the block table cut to the pages
    the longest of them reaches (scored a chunk of pages at a time when large: :data:`SCORE_CHUNK_ELEMENTS`).
    """
    lens = inputs["seq_lens"].tolist()
    scored = [b for b, n in enumerate(lens) if n > topk]
    rows: list[ScoredRow | None] = [None] * len(lens)
    if not scored:
        return rows
    pick = torch.tensor(scored, device=inputs["seq_lens"].device)
    table = inputs["block_table"][pick, : _pages_of(max(lens[b] for b in scored))]
    q = inputs["q_index_fp8"].view(torch.uint8)[pick].view(torch.float8_e4m3fn)  # fp8 has no index kernel
    batch_scores, tolerances = _scores_and_tie_tolerances(
        q, inputs["k_index_cache_fp8"], inputs["weights"][pick], inputs["seq_lens"][pick], table
    )
    assert tolerances is not None
    for k, b in enumerate(scored):
        rows[b] = ScoredRow(batch_scores[k, : lens[b]], float(tolerances[k]))
    return rows


def _check_row(
    b: int, row: torch.Tensor, seq_len: int, table_row: torch.Tensor, num_pages: int, expected: ScoredRow | None, tol: Tolerance,
    topk: int = TOPK,
) -> tuple[str | None, float]:
    """Problem with one output row (None if fine) and its top-k score gap."""
    want = min(topk, seq_len)
    strange = row < -1
    if bool(strange.any()):
        j = int(torch.nonzero(strange)[0])
        return f"row {b}: entry {j} holds {int(row[j])}, neither -1 nor a token id (unwritten output?)", 0.0
    valid = row >= 0
    count = int(valid.sum())
    if count != want:
        return f"row {b}: {count} valid ids, expected min({topk}, seq_len = {seq_len}) = {want}", 0.0
    if count == 0:
        return None, 0.0
    ids = row[valid].long()
    uniq, counts = torch.unique(ids, return_counts=True)
    if uniq.numel() != ids.numel():
        return f"row {b}: id {int(uniq[counts > 1][0])} appears more than once", 0.0
    n_pages = _pages_of(seq_len)
    position_of_page = torch.full((num_pages,), -1, dtype=torch.long, device=row.device)
    position_of_page[table_row[:n_pages].long()] = torch.arange(n_pages, device=row.device)
    page = ids // PAGE_SIZE
    off_cache = page >= num_pages
    if bool(off_cache.any()):
        bad = int(ids[off_cache][0])
        return f"row {b}: id {bad} is on page {bad // PAGE_SIZE}, beyond num_pages = {num_pages}", 0.0
    page_pos = position_of_page[page]
    unreachable = page_pos < 0
    if bool(unreachable.any()):
        bad = int(ids[unreachable][0])
        return f"row {b}: id {bad} is on page {bad // PAGE_SIZE}, not among the row's first {n_pages} block-table entries", 0.0
    pos = page_pos * PAGE_SIZE + ids % PAGE_SIZE
    beyond = pos >= seq_len
    if bool(beyond.any()):
        k = int(torch.nonzero(beyond)[0])
        return f"row {b}: id {int(ids[k])} is token position {int(pos[k])}, not below seq_len = {seq_len}", 0.0
    if expected is None:
        return None, 0.0
    scores = expected.scores
    best = torch.topk(scores, want).values  # sorted, descending
    chosen = torch.sort(scores[pos], descending=True).values
    gaps = best - chosen
    gap = float(gaps.max())
    if tol.score_rtol is None:  # the error model's bound for this row
        allowed, rule = expected.tie_tolerance, "derived"
    else:  # a fixed fraction of the row's largest |score|, when a run sets score_rtol
        allowed, rule = tol.score_rtol * float(scores.abs().max()), f"score_rtol {tol.score_rtol:g}"
    if gap > allowed + 1e-30:
        i = int(torch.argmax(gaps))
        return (
            f"row {b}: not a top-{want} set: its {i + 1}-th best score {float(chosen[i]):.6g} is below the "
            f"reference's {float(best[i]):.6g} by {gap:.3g} (tie tolerance {allowed:.3g}, {rule})"
        ), gap
    return None, gap


def _batched_verdicts(
    out: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, num_pages: int, expected: Any, tol: Tolerance,
    topk: int = TOPK,
) -> torch.Tensor:
    """``[4, batch]`` float64 on the outputs' device: each row's seq_len, whether it passes every test
    of :func:`_check_row` but the score gap's, its score gap (0 for an unscored row) and its largest
    |reference score| (0 unless ``tol.score_rtol`` is set), without a host sync.

    A row whose reached block-table entries are not all page ids counts as failing, so
    :func:`_check_row` judges it (it reads such a table in its own way).
    """
    batch = out.shape[0]
    device = out.device
    # sorted rows: -1 padding first, then the ids; a repeat is a pair of equal neighbours, and the
    # ids of one page are a run that a search for the page's first id finds. One flat sort, each
    # row shifted into its own 2^32-wide range of int64 (CPUs sort 1-D integers much faster).
    shift = torch.arange(batch, device=device)[:, None] << 32
    ordered = torch.sort((out.long() + shift).flatten()).values.view(batch, topk) - shift  # [batch, topk]
    lens = seq_lens.long().to(device)
    want = lens.clamp(max=topk)
    valid = ordered >= 0
    strange = ordered[:, 0] < -1
    miscounted = valid.sum(dim=1) != want
    repeated = ((ordered[:, 1:] == ordered[:, :-1]) & valid[:, 1:]).any(dim=1)
    page = torch.where(valid, ordered // PAGE_SIZE, 0)
    off_cache = valid & (page >= num_pages)
    # which reached block-table entry holds each id's page: the entries sorted by page (stably, so
    # of equal pages the last is the highest position, as _check_row's last write), and for each
    # id the last entry whose page is <= its own (counted by marking where each entry's page
    # starts in the sorted row: few searches, not one per id)
    n_pages = (lens + PAGE_SIZE - 1) // PAGE_SIZE
    table = block_table.long().to(device)
    reached = torch.arange(table.shape[1], device=device) < n_pages[:, None]
    foreign = reached & ((table < 0) | (table >= num_pages))
    keyed = torch.nn.functional.pad(torch.where(reached & ~foreign, table, num_pages), (0, 1), value=num_pages)
    sorted_pages, entry = torch.sort(keyed, dim=1, stable=True)
    starts = torch.searchsorted(ordered, sorted_pages * PAGE_SIZE)  # [batch, entries] in [0, topk]
    marks = torch.zeros(batch, topk + 1, dtype=torch.long, device=device).scatter_add_(1, starts, torch.ones_like(starts))
    last = marks.cumsum(dim=1)[:, :topk] - 1  # per id: entries with a page <= its own, less one
    held = last.clamp(min=0)
    on_row = valid & ~off_cache & (last >= 0) & (sorted_pages.gather(1, held) == page)
    pos = entry.gather(1, held) * PAGE_SIZE + ordered % PAGE_SIZE
    beyond = on_row & (pos >= lens[:, None])
    unreachable = valid & ~off_cache & ~on_row
    failing = strange | miscounted | repeated | off_cache.any(dim=1) | unreachable.any(dim=1) | beyond.any(dim=1) | foreign.any(dim=1)
    gaps = torch.zeros(batch, dtype=torch.float32, device=device)
    magnitudes = torch.zeros(batch, dtype=torch.float32, device=device)
    scored = [b for b in range(batch) if expected[b] is not None and expected[b].scores.numel() > 0]
    if scored:
        pick = torch.tensor(scored)
        # a copy from pinned memory does not wait for the device (a pageable one synchronises)
        pick = pick.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else pick
        # -inf after each row's scores: below every score, so never among a row's best `want`
        # (want <= its length) and never a selected position's score (positions are below seq_len)
        row_scores = torch.nn.utils.rnn.pad_sequence(
            [expected[b].scores.to(device) for b in scored], batch_first=True, padding_value=float("-inf")
        )
        width = row_scores.shape[1]
        k = min(topk, width)
        best = torch.topk(row_scores, k, dim=1).values  # descending
        picked = row_scores.gather(1, pos[pick].clamp(0, width - 1))
        chosen = torch.sort(torch.where(valid[pick], picked, float("-inf")), dim=1, descending=True).values[:, :k]
        ranked = torch.arange(k, device=device) < want[pick][:, None]
        row_gaps = torch.where(ranked, best - chosen, float("-inf")).amax(dim=1)
        gaps[pick] = torch.where(want[pick] > 0, row_gaps, 0.0)
        if tol.score_rtol is not None:  # 0 after a row's scores never raises its largest |score|
            magnitudes[pick] = torch.nn.utils.rnn.pad_sequence([expected[b].scores.abs() for b in scored], batch_first=True).amax(dim=1)
    return torch.stack([lens.double(), (~failing).double(), gaps.double(), magnitudes.double()])


def check(
    inputs: Mapping[str, Value], outputs: Mapping[str, torch.Tensor], expected: Any, tol: Tolerance, *, topk: int = TOPK
) -> CheckResult:
    """Every row at once on the outputs' device (:func:`_batched_verdicts`, one host sync); a row
    that fails there is judged again by :func:`_check_row`, the spec, whose message is reported.

    The first failing row decides; ``max_abs_error`` is the largest score gap of the rows up to it
    (of all rows on a pass).
    """
    out = outputs["topk_indices"]
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    verdicts = _batched_verdicts(out, inputs["seq_lens"], inputs["block_table"], num_pages, expected, tol, topk)
    lens, passing, gaps, magnitudes = verdicts.tolist()
    worst_gap = 0.0
    for b, seq_len in enumerate(int(n) for n in lens):
        gap, row_expected = gaps[b], expected[b]
        if passing[b] and row_expected is not None and seq_len > 0:
            if row_expected.scores.numel() != seq_len:
                passing[b] = 0.0  # scores that do not fit the row: _check_row reads them as they are
            elif tol.score_rtol is None:
                passing[b] = float(not gap > row_expected.tie_tolerance + 1e-30)
            else:
                passing[b] = float(not gap > tol.score_rtol * magnitudes[b] + 1e-30)
        if not passing[b]:
            problem, gap = _check_row(b, out[b], seq_len, inputs["block_table"][b], num_pages, row_expected, tol, topk)
            if problem is not None:
                return CheckResult(Status.INCORRECT_INDICES, problem, max_abs_error=max(worst_gap, gap))
        worst_gap = max(worst_gap, gap)
    return CheckResult(Status.PASSED, max_abs_error=worst_gap)


# --------------------------------------------------------------------------- traffic

KEY_RECORD_BYTES = INDEXER_KEY_PAGE.bytes_per_token  # 128 FP8 values + one float32 scale
QUERY_BYTES = NUM_HEADS * HEAD_DIM  # FP8
WEIGHTS_BYTES = NUM_HEADS * 4  # float32
OUTPUT_ROW_BYTES = TOPK * 4  # int32


def min_traffic_bytes(axes: Mapping[str, int], inputs: Mapping[str, Value], *, topk: int = TOPK) -> int:
    """Bytes any correct kernel must at least move between DRAM and the chip for one call.

    With L = seq_lens[b] and P(L) = ceil(L / 64):

        reads   4 · batch                                   seq_lens
              + 4 · Σ_b P(L_b)                              the block-table entries each row reaches
              + Σ_{b: L_b > 2048} (8192 + 256)              query (64×128 FP8) and weights (64 float32) of scored rows
              + 132 · |∪_{b: L_b > 2048} tokens(b)|         key record (128 FP8 + 4-byte scale) of every distinct token
                                                            of a scored row; a page rows share counts once
        writes  8192 · batch                                every row's 2048 int32 ids

    Only a row with more than 2048 tokens has to be scored: a passthrough row (L <= 2048)
    selects all its tokens, so its ids come from its block-table entries alone. Every token of
    a scored row may be among its best 2048, so each key record must be read. The count is a
    lower bound: each byte once, at byte granularity (DRAM moves 32-byte sectors), nothing
    counted that a correct kernel could skip on inputs without special structure (it could
    skip a head whose weight is exactly 0; generated weights never are).
    """
    lens = inputs["seq_lens"].tolist()
    batch = len(lens)
    reads = 4 * batch + 4 * sum(_pages_of(n) for n in lens if n > 0)
    scored = [b for b, n in enumerate(lens) if n > topk]
    if scored:
        reads += len(scored) * (QUERY_BYTES + WEIGHTS_BYTES)
        tokens = torch.cat([token_ids(inputs["block_table"][b], lens[b]) for b in scored])
        reads += KEY_RECORD_BYTES * int(torch.unique(tokens).numel())
    return reads + 4 * topk * batch


def useful_flops(axes: Mapping[str, int], inputs: Mapping[str, Value], *, topk: int = TOPK) -> int:
    """Tensor-core FLOPs of the scores: ``2 · 64 · 128 · L`` for every row with L > topk tokens
    (the FP8 products of its 64 head queries with each of its L keys).

    A passthrough row (L <= topk) selects all its tokens without scoring them: 0 FLOPs. The
    ReLU, the weighted sum over heads and the top-k selection are not tensor-core math and are
    not counted (they are small next to the products: 64 multiply-adds per token against 8192).
    """
    return sum(2 * NUM_HEADS * HEAD_DIM * n for n in inputs["seq_lens"].tolist() if n > topk)


def make_definition(topk: int) -> Definition:
    """The indexer that keeps ``topk`` tokens per row: every function of this module with ``topk`` bound."""
    bind = functools.partial
    return Definition(
        name=name_of(topk),
        description=f"Lightning indexer: FP8 scores of every cached token, then the {topk} best as physical ids.",
        const_axes={
            "num_index_heads": NUM_HEADS,
            "index_head_dim": HEAD_DIM,
            "page_size": PAGE_SIZE,
            "topk": topk,
            "kv_cache_num_heads": 1,
            "head_dim_with_scale": INDEXER_KEY_PAGE.bytes_per_token,
        },
        var_axes=("batch_size", "max_num_pages", "num_pages"),
        inputs=(
            TensorSpec("q_index_fp8", ("batch_size", "num_index_heads", "index_head_dim"), torch.float8_e4m3fn, "index queries"),
            TensorSpec(
                "k_index_cache_fp8",
                ("num_pages", "page_size", "kv_cache_num_heads", "head_dim_with_scale"),
                torch.int8,
                "FP8 keys in the DeepGEMM paged layout (read as bytes)",
            ),
            TensorSpec("weights", ("batch_size", "num_index_heads"), torch.float32, "per-head weights"),
            TensorSpec("seq_lens", ("batch_size",), torch.int32, "tokens per row"),
            TensorSpec("block_table", ("batch_size", "max_num_pages"), torch.int32, "page ids per row"),
        ),
        outputs=(TensorSpec("topk_indices", ("batch_size", "topk"), torch.int32, "physical ids of the best tokens, -1 padded"),),
        reference=bind(reference, topk=topk),
        generate=generate,
        validate=validate,
        redraw=draw_queries,
        redraw_takes_params=True,
        expect=bind(expect, topk=topk),
        check=bind(check, topk=topk),
        key_axes=("batch_size", "max_num_pages"),
        tolerance_fields=("score_rtol",),
        notes=(
            "Order inside a row is free; the checker compares the selected set's sorted scores with the reference's, "
            "within a per-row tie tolerance derived from an FP8 kernel's rounding errors.",
            f"Rows with seq_len <= {topk} select every token (passthrough); a row with seq_len 0 is all -1.",
            "Block-table entries past a row's first ceil(seq_len/64) are never read: they may hold any int32 (-1, a page no row owns).",
        ),
        min_traffic_bytes=bind(min_traffic_bytes, topk=topk),
        useful_flops=bind(useful_flops, topk=topk),
        math_precision="fp8",  # the score products run as FP8 MMA (solutions/triton/indexer/triton_kernels.py, DeepGEMM's peers)
    )


#: one definition per selection size of TOPKS; DEFINITION is V3.2's (top-2048)
DEFINITIONS = tuple(make_definition(k) for k in TOPKS)
DEFINITION = DEFINITIONS[0]
