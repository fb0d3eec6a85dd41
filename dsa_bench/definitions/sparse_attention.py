"""``dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64``: sparse MLA attention over top-k slots.

Per token t over its valid indices (physical ids ``page * 64 + slot``, -1 = padding):
``logit = (q_nope·ckv + q_pe·kpe) · sm_scale`` in fp32, ``lse = log2(Σ exp(logit))`` (base 2),
``output = softmax(logit) @ ckv``. A token with no valid index has output 0 and lse -inf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from dsa_bench.definitions.base import Definition, InputRng, TensorSpec, Tolerance, Value, is_integer, unknown_params
from dsa_bench.definitions.checks import compare_close, compare_rows, row_tolerances, worst
from dsa_bench.definitions.status import CheckResult, Status

NAME = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
NUM_HEADS = 16
CKV_DIM = 512
KPE_DIM = 64
TOPK = 2048
PAGE_SIZE = 64
#: The contest's value: 192**-0.5 with a YaRN factor.
CONTEST_SM_SCALE = 0.1352337788608801
LN2 = math.log(2.0)
#: The largest softmax scale a case may give: 7.4 times the contest's, the largest the lse tolerance was
#: measured at (docs/checks.md); far above, float32 logits overflow and no tolerance tells rounding from a defect.
MAX_SM_SCALE = 1.0
#: Independent bf16 roundings in a correct kernel's output (checks.row_tolerances): the probabilities, and the
#: split partials, which split-K kernels may keep in bf16 (the shipped CUDA kernel does).
PARTIAL_ROUNDINGS = 2


def attend(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    sm_scale: float,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``output [T, 16, 512]`` and base-2 ``lse [T, 16]`` of every token at once, without a
    host sync: the 2048 slots of each token gathered (a -1 slot reads slot 0, then is masked), the
    logits of -1 slots set to -inf, the softmax normalised after the value product.

    ``noise``, a ``[T, 16]`` float32 tensor, receives each row's ``max_d sqrt(Σ_j w_j² ckv_jd²)`` (w the
    softmax weights): the scale of the error bf16-rounded probabilities leave in ``output``
    (:func:`dsa_bench.definitions.checks.row_tolerances`); 0 on an empty token.

    A token without a valid index: every exp is 0, its denominator is 0 (taken as 1 for the
    division, so output is exactly 0) and its lse log2(0) = -inf. A token with one has a
    denominator >= 1 (its largest logit contributes exp(0)), which the clamp leaves alone.
    """
    tokens, slots = sparse_indices.shape
    idx = sparse_indices.long()
    padding = idx < 0
    rows = idx.clamp_min(0).flatten()
    # Padding slots gather token 0, which may hold NaN: ckv is zeroed there so 0·NaN never appears in
    # the value product; kpe only feeds logits that are masked anyway.
    ckv = ckv_cache.reshape(-1, CKV_DIM).index_select(0, rows).view(tokens, slots, CKV_DIM).float()
    ckv.masked_fill_(padding[..., None], 0.0)
    kpe = kpe_cache.reshape(-1, KPE_DIM).index_select(0, rows).view(tokens, slots, KPE_DIM).float()
    scale = float(sm_scale)
    # (q_nope·ckv + q_pe·kpe)·sm_scale, the scale folded into both products
    logits = torch.baddbmm(torch.bmm(q_pe.float(), kpe.mT), q_nope.float(), ckv.mT, beta=scale, alpha=scale)
    logits.masked_fill_(padding[:, None, :], float("-inf"))  # [T, heads, slots]
    peak = logits.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # finite even when all -inf
    weights = torch.exp(logits - peak)
    denominator = weights.sum(dim=-1)
    output = torch.bmm(weights, ckv) / denominator.clamp_min(1.0)[..., None]
    lse = (torch.log(denominator) + peak[..., 0]) / LN2
    if noise is not None:
        noise.copy_(torch.bmm(weights.square(), ckv.square()).sqrt().amax(dim=-1) / denominator.clamp_min(1.0))
    return output, lse


def reference(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    sm_scale: float,
) -> dict[str, torch.Tensor]:
    output, lse = attend(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale)
    return {"output": output.to(torch.bfloat16), "lse": lse}


# --------------------------------------------------------------------------- inputs


def _row_indices(valid: int, context: int, pages: np.ndarray, padding: str, rng: np.random.Generator) -> np.ndarray:
    """One row of -1 padded physical ids: ``valid`` distinct tokens out of a ``context``-token sequence."""
    positions = rng.choice(context, valid, replace=False) if valid else np.empty(0, dtype=np.int64)
    ids = pages[positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
    row = np.full(TOPK, -1, dtype=np.int64)
    if padding == "scattered":
        slots = np.sort(rng.choice(TOPK, valid, replace=False))
        row[slots] = ids
    else:
        row[:valid] = ids
    return row


def _context_tokens(counts: list[int], p: Mapping[str, Any], num_pages: int, rng: np.random.Generator) -> list[int]:
    """Sequence length behind each row. A row with fewer than 2048 valid slots is a sequence
    shorter than 2048 (top-k kept all of it); a full row comes from a longer sequence, shortened
    to 2048 when the cache has too few pages for the drawn lengths."""
    if "context_tokens" in p:
        return [int(c) for c in p["context_tokens"]]
    contexts = [c if c < TOPK else int(rng.integers(TOPK, 3 * TOPK + 1)) for c in counts]
    if sum(-(-c // PAGE_SIZE) for c in contexts) > num_pages:
        contexts = list(counts)
    return contexts


def draw_queries(axes: Mapping[str, int], rng: InputRng) -> dict[str, torch.Tensor]:
    """The cheap per-call inputs (the queries); timing redraws them before every call."""
    tokens = axes["num_tokens"]
    return {
        "q_nope": rng.randn(tokens, NUM_HEADS, CKV_DIM).to(torch.bfloat16),
        "q_pe": rng.randn(tokens, NUM_HEADS, KPE_DIM).to(torch.bfloat16),
    }


def generate(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict], rng: InputRng) -> dict[str, Value]:
    tokens, num_pages = axes["num_tokens"], axes["num_pages"]
    device = rng.device
    if "sparse_indices" in given:
        indices = given["sparse_indices"].to(device)
    else:
        p = params.get("sparse_indices", {})
        counts = [int(c) for c in p["valid_counts"]] if "valid_counts" in p else rng.structure.integers(1, TOPK + 1, tokens).tolist()
        contexts = _context_tokens(counts, p, num_pages, rng.structure)
        pool = rng.structure.permutation(num_pages)
        rows, start = [], 0
        for c, ctx in zip(counts, contexts, strict=True):
            n_pages = -(-ctx // PAGE_SIZE)
            rows.append(_row_indices(c, ctx, pool[start : start + n_pages], p.get("padding", "tail"), rng.structure))
            start += n_pages
        indices = torch.from_numpy(np.stack(rows)).to(torch.int32).to(device)
    queries = draw_queries(axes, rng)
    q_nope = given["q_nope"].to(device) if "q_nope" in given else queries["q_nope"]
    q_pe = given["q_pe"].to(device) if "q_pe" in given else queries["q_pe"]
    read = torch.unique(indices[indices >= 0].long())
    if "ckv_cache" in given:
        ckv = given["ckv_cache"].to(device)
    else:  # random values only where some index points; NaN everywhere else
        ckv = torch.full((num_pages, PAGE_SIZE, CKV_DIM), float("nan"), dtype=torch.bfloat16, device=device)
        ckv.view(-1, CKV_DIM)[read] = rng.randn(read.numel(), CKV_DIM).to(torch.bfloat16)
    if "kpe_cache" in given:
        kpe = given["kpe_cache"].to(device)
    else:
        kpe = torch.full((num_pages, PAGE_SIZE, KPE_DIM), float("nan"), dtype=torch.bfloat16, device=device)
        kpe.view(-1, KPE_DIM)[read] = rng.randn(read.numel(), KPE_DIM).to(torch.bfloat16)
    sm_scale = float(given.get("sm_scale", CONTEST_SM_SCALE))
    return {"q_nope": q_nope, "q_pe": q_pe, "ckv_cache": ckv, "kpe_cache": kpe, "sparse_indices": indices, "sm_scale": sm_scale}


#: The generator parameters each random input takes (the others take none).
GENERATOR_PARAMS = {"sparse_indices": ("valid_counts", "context_tokens", "padding")}
PADDINGS = ("tail", "scattered")


def validate(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
    """Everything in a case that would make input generation or the reference fail.

    Without ``valid_counts`` each token draws up to 2048 valid slots, so the page pool must hold
    2048 tokens for every token of the case whatever the seed.
    """
    problems = unknown_params(params, GENERATOR_PARAMS)
    tokens, num_pages = axes["num_tokens"], axes["num_pages"]
    if "sparse_indices" not in given:
        problems += _random_indices_problems(params.get("sparse_indices", {}), tokens, num_pages)
    else:
        idx = given["sparse_indices"].long()
        limit = num_pages * PAGE_SIZE
        for t in range(idx.shape[0]):
            row = idx[t]
            bad = (row < -1) | (row >= limit)
            if bool(bad.any()):
                j = int(torch.nonzero(bad)[0])
                problems.append(
                    f"sparse_indices[{t}][{j}] = {int(row[j])} is neither -1 nor a token id below num_pages*{PAGE_SIZE} = {limit}"
                )
                continue
            valid = row[row >= 0]
            if torch.unique(valid).numel() != valid.numel():
                problems.append(f"sparse_indices[{t}] lists a token id twice")
    scale = given.get("sm_scale")
    if scale is not None and not 0 < float(scale) <= MAX_SM_SCALE:
        problems.append(f"sm_scale = {scale!r} must be in (0, {MAX_SM_SCALE:g}] (the contest's is {CONTEST_SM_SCALE:.3g}); "
                        "far larger scales overflow the float32 logits")
    return problems


def _random_indices_problems(p: Mapping[str, Any], tokens: int, num_pages: int) -> list[str]:
    """Problems with the parameters of random sparse indices (see :func:`generate`)."""
    problems: list[str] = []
    label = "sparse_indices.params"
    if p.get("padding", "tail") not in PADDINGS:
        problems.append(f"{label}.padding = {p.get('padding')!r}, expected 'tail' or 'scattered'")
    # as the trace gave them: each is checked below before it is used
    counts: Any = p.get("valid_counts")
    contexts: Any = p.get("context_tokens")
    if "valid_counts" not in p:
        if "context_tokens" in p:
            problems.append(f"{label}.context_tokens needs valid_counts (each token's context must hold its valid slots)")
        needed = tokens * (TOPK // PAGE_SIZE)
        if needed > num_pages:
            problems.append(
                f"random valid counts (up to {TOPK} per token) may need {tokens} x {TOPK // PAGE_SIZE} = {needed} pages "
                f"of {PAGE_SIZE} tokens but num_pages = {num_pages}; give {label}.valid_counts or raise num_pages"
            )
        return problems
    if not _integer_list_problems(counts, "valid_counts", tokens, problems):
        return problems
    for b, c in enumerate(counts):
        if not 0 <= c <= TOPK:
            problems.append(f"{label}.valid_counts[{b}] = {c} is not in [0, {TOPK}]")
    if "context_tokens" in p and _integer_list_problems(contexts, "context_tokens", tokens, problems):
        for b, (c, ctx) in enumerate(zip(counts, contexts, strict=True)):
            if ctx < c:
                problems.append(f"{label}.context_tokens[{b}] = {ctx} is below valid_counts[{b}] = {c}")
    if not problems:
        needed = sum(-(-ctx // PAGE_SIZE) for ctx in (contexts if "context_tokens" in p else counts))
        if needed > num_pages:
            problems.append(f"the rows need {needed} pages of {PAGE_SIZE} tokens but num_pages = {num_pages}")
    return problems


def _integer_list_problems(values: Any, key: str, tokens: int, problems: list[str]) -> bool:
    """Whether ``values`` is a list of ``tokens`` integers; a problem is added where it is not."""
    label = f"sparse_indices.params.{key}"
    if not isinstance(values, list):
        problems.append(f"{label} = {values!r}, expected a list of num_tokens = {tokens} integers")
        return False
    if len(values) != tokens:
        problems.append(f"{label} has {len(values)} entries, expected num_tokens = {tokens} integers")
        return False
    bad = [(b, v) for b, v in enumerate(values) if not is_integer(v)]
    for b, v in bad:
        problems.append(f"{label}[{b}] = {v!r} must be an integer")
    return not bad


# --------------------------------------------------------------------------- checking


def expect(inputs: Mapping[str, Value]) -> dict[str, torch.Tensor]:
    """The reference's ``output`` and ``lse``, and ``output_noise``: each row's scale of the bf16-probability
    error (:func:`attend`'s ``noise``), for the row check."""
    noise = torch.zeros(inputs["q_nope"].shape[:2], dtype=torch.float32, device=inputs["q_nope"].device)
    output, lse = attend(**inputs, noise=noise)
    return {"output": output.to(torch.bfloat16), "lse": lse, "output_noise": noise}


def _check_empty_tokens(sparse_indices: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> CheckResult:
    """A token with no valid index has output exactly 0 and lse exactly -inf: no tolerance."""
    empty = torch.nonzero((sparse_indices < 0).all(dim=1)).flatten()
    if empty.numel() == 0:
        return CheckResult(Status.PASSED)
    out, lse = outputs["output"][empty].float(), outputs["lse"][empty]
    bad_out = out != 0  # NaN too
    if bool(bad_out.any()):
        k, h, d = (int(i) for i in torch.nonzero(bad_out)[0])
        return CheckResult(
            Status.INCORRECT_NUMERICAL,
            f"output: token {int(empty[k])} has no valid index, so its output must be exactly 0; "
            f"head {h} column {d} holds {float(out[k, h, d]):.6g}",
        )
    bad_lse = ~torch.isneginf(lse)
    if bool(bad_lse.any()):
        k, h = (int(i) for i in torch.nonzero(bad_lse)[0])
        return CheckResult(
            Status.INCORRECT_NUMERICAL,
            f"lse: token {int(empty[k])} has no valid index, so its lse must be exactly -inf; head {h} holds {float(lse[k, h]):.6g}",
        )
    return CheckResult(Status.PASSED)


def check(inputs: Mapping[str, Value], outputs: Mapping[str, torch.Tensor], expected: Any, tol: Tolerance) -> CheckResult:
    """Empty tokens exactly; output element-wise (atol/rtol) and row by row (each (token, head) row against its
    own bound, checks.row_tolerances); lse with the absolute lse_atol. A token is empty when its indices hold
    no valid id, whatever the reference's lse."""
    empty = (inputs["sparse_indices"] < 0).all(dim=1).to(expected["lse"].device)[:, None].expand_as(expected["lse"])
    lse_tol = replace(tol, atol=tol.lse_atol, rtol=0.0)  # absolute only: see Tolerance.lse_atol
    return worst(
        [
            _check_empty_tokens(inputs["sparse_indices"], outputs),
            compare_close("output", outputs["output"], expected["output"], tol),
            compare_rows("output", outputs["output"], expected["output"], row_tolerances(expected["output"], expected["output_noise"],
                         roundings=PARTIAL_ROUNDINGS), skip=empty, row_label=lambda at: f"token {at[0]} head {at[1]}"),
            compare_close("lse", outputs["lse"], expected["lse"], lse_tol, allow_neg_inf=empty),
        ]
    )


# --------------------------------------------------------------------------- traffic

SLOT_BYTES = (CKV_DIM + KPE_DIM) * 2  # one cache slot's ckv and kpe rows, bf16
QUERY_BYTES = NUM_HEADS * (CKV_DIM + KPE_DIM) * 2  # q_nope and q_pe of one token, bf16
INDEX_ROW_BYTES = TOPK * 4  # int32
OUTPUT_TOKEN_BYTES = NUM_HEADS * CKV_DIM * 2 + NUM_HEADS * 4  # output (bf16) and lse (float32)


def min_traffic_bytes(axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
    """Bytes any correct kernel must at least move between DRAM and the chip for one call.

        reads   8192 · T                          every token's 2048 int32 indices (padding may sit anywhere)
              + 18432 · T_valid                   q_nope (16×512 bf16) and q_pe (16×64 bf16) of each token
                                                  with at least one valid index
              + 1152 · |distinct valid ids|       ckv (512 bf16) and kpe (64 bf16) of every slot some token
                                                  reads; a slot several tokens read counts once
        writes  (16384 + 64) · T                  output (16×512 bf16) and lse (16 float32) of every token

    A token without a valid index needs no query (its output is 0 and its lse -inf); sm_scale
    is a host scalar. The count is a lower bound: each byte once, at byte granularity (DRAM
    moves 32-byte sectors).
    """
    indices = inputs["sparse_indices"]
    tokens = indices.shape[0]
    valid = indices >= 0
    with_valid = int(valid.any(dim=1).sum())
    distinct_slots = int(torch.unique(indices[valid]).numel())
    reads = INDEX_ROW_BYTES * tokens + QUERY_BYTES * with_valid + SLOT_BYTES * distinct_slots
    return reads + OUTPUT_TOKEN_BYTES * tokens


def useful_flops(axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
    """Tensor-core FLOPs: ``2 · 16 · ((512 + 64) + 512)`` per valid index of every token (Q·Kᵀ over
    the ckv and kpe dims, then P·V over the 512 ckv dims, for each of the 16 heads).

    Only valid (>= 0) indices count: a -1 slot needs no math, whatever a kernel does with it.
    The softmax is not tensor-core math and is not counted.
    """
    valid = int((inputs["sparse_indices"] >= 0).sum())
    return 2 * NUM_HEADS * (CKV_DIM + KPE_DIM + CKV_DIM) * valid


DEFINITION = Definition(
    name=NAME,
    description="Sparse MLA attention of 16 heads over up to 2048 selected cache slots (base-2 lse).",
    const_axes={"num_qo_heads": NUM_HEADS, "head_dim_ckv": CKV_DIM, "head_dim_kpe": KPE_DIM, "page_size": PAGE_SIZE, "topk": TOPK},
    var_axes=("num_tokens", "num_pages"),
    inputs=(
        TensorSpec("q_nope", ("num_tokens", "num_qo_heads", "head_dim_ckv"), torch.bfloat16),
        TensorSpec("q_pe", ("num_tokens", "num_qo_heads", "head_dim_kpe"), torch.bfloat16),
        TensorSpec("ckv_cache", ("num_pages", "page_size", "head_dim_ckv"), torch.bfloat16, "compressed KV; also the value"),
        TensorSpec("kpe_cache", ("num_pages", "page_size", "head_dim_kpe"), torch.bfloat16, "RoPE part of the key"),
        TensorSpec("sparse_indices", ("num_tokens", "topk"), torch.int32, "physical ids, -1 padded"),
        TensorSpec("sm_scale", (), torch.float32, "softmax scale"),
    ),
    outputs=(
        TensorSpec("output", ("num_tokens", "num_qo_heads", "head_dim_ckv"), torch.bfloat16),
        TensorSpec("lse", ("num_tokens", "num_qo_heads"), torch.float32, "log2 of the softmax denominator"),
    ),
    reference=reference,
    generate=generate,
    validate=validate,
    redraw=draw_queries,
    expect=expect,
    check=check,
    key_axes=("num_tokens",),
    tolerance_fields=("atol", "rtol", "lse_atol"),
    notes=(
        "lse is base 2.",
        "output is compared element-wise with atol/rtol (an element fails only when |diff| > atol and |diff| > rtol·|ref|) "
        "and row by row, each (token, head) row's largest |diff| against a bound in proportion to that row (docs/checks.md); "
        "lse with the absolute lse_atol alone (|diff| <= lse_atol, no relative part).",
        "A token with no valid index must have output exactly 0 and lse exactly -inf (no tolerance).",
    ),
    min_traffic_bytes=min_traffic_bytes,
    useful_flops=useful_flops,
    math_precision="bf16",  # bf16 operands, fp32 accumulation (solutions/triton/attention/csrc/attention_sm90.cu)
)
