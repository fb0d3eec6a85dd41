"""Generic output checks shared by every definition.

A definition's own checker handles its semantics (top-k sets, empty attention rows); this
module holds what they share: spec conformance and the element-wise tolerance test in which an
element fails only when ``|diff| > atol`` AND ``|diff| > rtol·|ref|``, NaN always fails and an
infinity fails unless the reference holds the same infinity at an allowed place.
"""

from __future__ import annotations

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
