"""Generic output checks shared by every definition.

A definition's own checker handles its semantics (top-k sets, empty attention rows); this
module holds what they share: spec conformance, the element-wise tolerance test in which an
element fails only when ``|diff| > atol`` AND ``|diff| > rtol·|ref|``, NaN always fails and an
infinity fails unless the reference holds the same infinity at an allowed place, and the
attention rows' test, in which each row's largest error is judged against that row's own
magnitude (:func:`row_tolerances`, :func:`compare_rows`; docs/checks.md derives the bound).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from typing import Any

import torch

from dsa_bench.definitions.base import DTYPE_NAMES, Definition, Tolerance, Value
from dsa_bench.definitions.status import CheckResult, Status


def check_specs(definition: Definition, outputs: Mapping[str, torch.Tensor], axes: Mapping[str, int]) -> CheckResult | None:
    """Shape and dtype of every output (observed ones included); None when all match."""
    for spec in definition.checked_outputs:
        out = outputs.get(spec.name)
        if not isinstance(out, torch.Tensor):
            return CheckResult(Status.INCORRECT_SHAPE, f"output {spec.name!r} is missing or not a tensor")
        want = spec.concrete_shape(axes)
        if tuple(out.shape) != want:
            return CheckResult(Status.INCORRECT_SHAPE, f"output {spec.name!r} has shape {tuple(out.shape)}, expected {want}")
        if out.dtype != spec.dtype:
            got = DTYPE_NAMES.get(out.dtype, str(out.dtype))
            return CheckResult(Status.INCORRECT_DTYPE, f"output {spec.name!r} has dtype {got}, expected {DTYPE_NAMES[spec.dtype]}")
    return None


def compare_close(
    name: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    tol: Tolerance,
    allow_neg_inf: torch.Tensor | None = None,
) -> CheckResult:
    """Element-wise tolerance test of ``out`` against ``ref``.

    With ``tol.rtol == 0`` the test is absolute: an element fails when ``|diff| > tol.atol``.
    ``allow_neg_inf`` marks elements where -inf is the correct value: there the output must be
    exactly -inf (and the reference must be too). Everywhere else any infinity fails.
    """
    out32 = out.float()
    ref32 = ref.float()
    diff = (out32 - ref32).abs()
    finite_ref = torch.isfinite(ref32)
    # Where both are the same infinity diff is NaN; treat those separately below.
    bad = (diff > tol.atol) & (diff > tol.rtol * ref32.abs())
    bad |= torch.isnan(out32)
    bad |= torch.isinf(out32) & finite_ref
    if allow_neg_inf is not None:
        expect_inf = allow_neg_inf
        bad |= expect_inf & ~(out32 == float("-inf"))
        bad |= ~expect_inf & torch.isinf(out32)
        bad |= ~expect_inf & ~finite_ref  # reference itself misbehaved; never pass silently
    else:
        bad |= ~finite_ref
    compared = finite_ref & torch.isfinite(out32)
    max_abs = float(diff[compared].max()) if compared.any() else 0.0
    rel = diff / ref32.abs().clamp_min(1e-12)
    max_rel = float(rel[compared].max()) if compared.any() else 0.0
    n_bad = int(bad.sum())
    if n_bad == 0:
        return CheckResult(Status.PASSED, "", max_abs, max_rel)
    first = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
    allowed = f"atol={tol.atol:g}, rtol={tol.rtol:g}" if tol.rtol else f"absolute, |diff| <= {tol.atol:g}"
    message = (
        f"{name}: {n_bad} of {bad.numel()} elements out of tolerance "
        f"({allowed}); first at {first}: "
        f"got {float(out32[first]):.6g}, expected {float(ref32[first]):.6g}"
    )
    return CheckResult(Status.INCORRECT_NUMERICAL, message, max_abs, max_rel)


#: bf16 keeps 8 significant bits: rounding to it moves a value by at most 2^-8 of itself
BF16_UNIT_ROUNDOFF = 2.0**-8
#: the RMS of one such rounding's relative error, at most u/sqrt(3) (uniform over ±u)
BF16_ROUNDING_RMS = BF16_UNIT_ROUNDOFF / math.sqrt(3)
#: how many standard deviations of the probabilities' rounding noise a row may show (a sum of
#: bounded independent errors is sub-Gaussian; the indexer's tie tolerance takes the same 6)
ROW_TAIL_SIGMAS = 6.0
#: an absolute floor under every row's tolerance: the float32 resolution of unit-scale values, for
#: rows that the weights or a sink shrink to (almost) nothing
ROW_ABS_FLOOR = 2.0**-20


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values at |x| (0 at 0): for |x| = m·2^e, m in [1/2, 1), it is 2^(e-8)."""
    _, exponent = torch.frexp(x.float().abs())
    return torch.where(x != 0, torch.ldexp(torch.ones_like(x, dtype=torch.float32), exponent - 8), 0.0)


def row_tolerances(reference: torch.Tensor, noise: torch.Tensor, roundings: int = 1) -> torch.Tensor:
    """Per row (the last dim of ``reference`` is the row), the largest |out - reference| a correct
    kernel may show: one bf16 ulp of the row's largest |reference| (both sides round to bf16),
    plus ROW_TAIL_SIGMAS standard deviations of the error that probabilities rounded to bf16 before
    the value product leave, ``noise`` being ``max_d sqrt(Σ_j w_j² V_jd²)`` of the row (its softmax
    weights w, sink included, and values V), plus ROW_ABS_FLOOR. ``roundings`` counts independent
    bf16 roundings of that size (2 where split partials are kept in bf16 too): their errors add in
    quadrature."""
    peak = reference.float().abs().amax(dim=-1)
    return bf16_ulp(peak) + ROW_TAIL_SIGMAS * BF16_ROUNDING_RMS * math.sqrt(roundings) * noise.float() + ROW_ABS_FLOOR


def compare_rows(name: str, out: torch.Tensor, ref: torch.Tensor, tolerance: torch.Tensor, skip: torch.Tensor | None = None,
                 row_label: Any = None) -> CheckResult:  # fmt: skip
    """Each row of ``out`` (the last dim) against the same row of ``ref``: it fails when its largest
    |diff| exceeds the row's ``tolerance`` (:func:`row_tolerances`), or when it holds a NaN or an
    infinity, or the reference does. Rows marked in ``skip`` (empty rows, judged exactly elsewhere)
    are left out. ``row_label(index) -> str`` names a row in the message. The error figures are the
    largest |diff| and the largest row error over its row's largest |reference|."""
    out32, ref32 = out.float(), ref.float()
    diff = (out32 - ref32).abs()
    broken = (~torch.isfinite(out32) | ~torch.isfinite(ref32)).any(dim=-1)
    row_error = torch.where(broken, math.inf, diff.nan_to_num(0.0).amax(dim=-1))
    peak = ref32.abs().amax(dim=-1)
    judged = torch.ones_like(broken) if skip is None else ~skip
    bad = judged & (broken | (row_error > tolerance))
    finite = judged & ~broken
    max_abs = float(row_error[finite].max()) if bool(finite.any()) else 0.0
    relative = row_error / peak.clamp_min(1e-30)
    max_rel = float(relative[finite].max()) if bool(finite.any()) else 0.0
    n_bad = int(bad.sum())
    if n_bad == 0:
        return CheckResult(Status.PASSED, "", max_abs, max_rel)
    first = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
    column = int(torch.where(torch.isfinite(out32[first]) & torch.isfinite(ref32[first]), diff[first], math.inf).argmax())
    where = row_label(first) if row_label is not None else f"row {first}"
    message = (
        f"{name}: {n_bad} of {int(judged.sum())} rows out of tolerance (per row: max |diff| <= one bf16 ulp of the row's largest "
        f"|ref| + {ROW_TAIL_SIGMAS:g} sigma of bf16-rounded probabilities); first at {where}: max |diff| "
        f"{float(row_error[first]):.6g} > {float(tolerance[first]):.6g} allowed (largest |ref| {float(peak[first]):.6g}); "
        f"column {column}: got {float(out32[first][column]):.6g}, expected {float(ref32[first][column]):.6g}"
    )
    return CheckResult(Status.INCORRECT_NUMERICAL, message, max_abs, max_rel)


def worst(results: list[CheckResult]) -> CheckResult:
    """Combine per-output results: the first failure wins, error figures are the maxima."""
    failed = [r for r in results if not r.passed]
    chosen = failed[0] if failed else CheckResult(Status.PASSED)
    abs_errs = [r.max_abs_error for r in results if r.max_abs_error is not None]
    rel_errs = [r.max_rel_error for r in results if r.max_rel_error is not None]
    return CheckResult(
        chosen.status,
        chosen.message,
        max(abs_errs) if abs_errs else None,
        max(rel_errs) if rel_errs else None,
    )


def judge(
    definition: Definition,
    axes: Mapping[str, int],
    inputs: Mapping[str, Value],
    outputs: Mapping[str, torch.Tensor],
    expected: Any,
    tol: Tolerance,
    device: torch.device,
) -> CheckResult:
    """Full check of one set of outputs: specs first, then the definition's own checker.

    ``expected`` is what ``definition.expect(inputs)`` returned. Outputs are moved to ``device``
    (where the inputs live); a checker that itself fails is reported as an error, never a pass.
    """
    spec_problem = check_specs(definition, outputs, axes)
    if spec_problem is not None:
        return spec_problem
    moved = {k: v.to(device) for k, v in outputs.items()}
    try:
        return definition.check(inputs, moved, expected, tol)
    except Exception as exc:  # a checker bug must never turn into a pass
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return CheckResult(Status.RUNTIME_ERROR, f"checker failed on these outputs: {detail}")
