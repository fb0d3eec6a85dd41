"""The indexer's derived tie tolerance against emulated correct kernels and planted defects (CPU).

For every case and input set, each variant below computes its own scores of the scored rows
(seq_len > 2048), takes its top 2048 (rows up to 2048 tokens pass every token through, as the
contract says), and the definition's checker judges the ids exactly as a run does, with the
derived per-row tie tolerance (``indexer.tie_tolerances``; no ``score_rtol`` set).

Correct kernels (each must pass every case):

- ``fp32_reordered``: fp32 throughout in another order than the reference: the 128 products of
  each dot added one by one from the last dimension down, the scale applied to each head's
  term before the head sum, the heads added one by one from the last.
- ``tensor_core_rz``: an FP8 tensor core's accumulator as commonly modelled for Hopper's wgmma:
  4 steps of 32 exact products each, every step's result truncated to 13 fraction bits.
- ``tensor_core_aligned``: DeepGEMM's logits as emulated here: per step of 32 products, each
  product and the running sum aligned to the largest one's exponent and truncated to 13 fraction
  bits below it, then the sum truncated again; relu·weight in fp32 over 4 groups of 16 heads,
  each group's sum times the token scale, the 4 partial sums added in a butterfly (DeepGEMM's
  ``sm90_fp8_paged_mqa_logits`` order). Its per-token errors (up to 3.5e-4 of the row's
  largest score over indexer_h64) are of the size of DeepGEMM's measured 2.8e-4.

Planted defects (each must fail every case where it changes the selection beyond ties):

- ``swap_best_for_worst``: the reference's selection with, in every scored row, the best token
  replaced by the worst token left out;
- ``swap_64_ranks``: the reference's selection with the 2048-th best token replaced by the
  (2048 + 64)-th (the lowest-ranked token when fewer are left out);
- ``no_scale``: scores without the token scale; ``no_relu``: scores without the ReLU.

Outside the model (reported, not required): ``bf16_weights``, fp32 scores from weights rounded
to bf16 (2^-9 relative per head, 16 times DeepGEMM's per-head error); and
``tensor_core_floor``, the aligned emulation with two's-complement truncation (toward -inf),
whose errors (up to 1.0e-3 of the row's largest score) exceed what DeepGEMM measured.

Usage (a CPU is enough; all 128 cases and 3 input sets took 3 minutes on 2 idle cores):

    python benchmarks/kernels/indexer_tolerance.py [--workload workloads/indexer_h64.yaml]
        [--case PATTERN ...] [--input-sets 3] [--max-rows N] [--out result.json]

Each case uses the run's correctness seeds of the workload (``--input-sets`` of them, the
workload's seed), so the inputs are those a ``dsa-bench run`` checks. ``--max-rows`` applies
the variants to at most N scored rows per case (the others get the reference's ids).
"""

from __future__ import annotations

import fnmatch
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import typer
from tabulate import tabulate

from dsa_bench.definitions import indexer
from dsa_bench.definitions.base import Tolerance
from dsa_bench.definitions.status import Status
from dsa_bench.run.case_context import correctness_seeds
from dsa_bench.workloads import build_inputs, load_workload

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
TOPK = indexer.TOPK

#: A row's operands: q [64, 128], FP8 key values [L, 128] and scales [L] (float64), weights [64].
Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def row_operands(inputs: dict[str, Any], b: int) -> Operands:
    seq_len = int(inputs["seq_lens"][b])
    keys, scales, _ = indexer._gathered_keys(inputs["k_index_cache_fp8"], inputs["seq_lens"][b : b + 1], inputs["block_table"][b : b + 1])
    return inputs["q_index_fp8"][b].double(), keys[0, :seq_len].double(), scales[0, :seq_len].double(), inputs["weights"][b].double()


# --------------------------------------------------------------------------- arithmetic


def truncate(x: torch.Tensor, fraction_bits: int = 13) -> torch.Tensor:
    """``x`` rounded toward zero to ``fraction_bits`` bits after the leading one."""
    mantissa, exponent = torch.frexp(x)  # x = m·2^e, 0.5 <= |m| < 1
    scale = 2.0 ** (fraction_bits + 1)
    return torch.ldexp(torch.trunc(mantissa * scale), exponent - (fraction_bits + 1))


def dots_step_truncated(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[64, L] dots: 4 steps of 32 exact products (float64 sums of FP8 products are exact), each
    step's result truncated to 13 fraction bits."""
    acc = torch.zeros(q.shape[0], keys.shape[0], dtype=torch.float64)
    for step in range(4):
        cols = slice(32 * step, 32 * step + 32)
        acc = truncate(acc + q[:, cols] @ keys[:, cols].T)
    return acc


def dots_aligned(q: torch.Tensor, keys: torch.Tensor, rounding: str = "zero", chunk: int = 1024) -> torch.Tensor:
    """[64, L] dots: per step of 32 products, every product and the running sum aligned to the
    largest one's exponent and truncated 13 fraction bits below it (toward zero, or toward -inf
    for ``rounding="floor"``), summed, and the sum truncated to 13 fraction bits."""
    cut = torch.trunc if rounding == "zero" else torch.floor
    q32, keys32 = q.float(), keys.float()  # FP8 products are exact in float32
    out = torch.empty(q.shape[0], keys.shape[0], dtype=torch.float64)
    for start in range(0, keys.shape[0], chunk):
        k = keys32[start : start + chunk]
        acc = torch.zeros(q.shape[0], k.shape[0])
        for step in range(4):
            cols = slice(32 * step, 32 * step + 32)
            terms = torch.cat([q32[:, None, cols] * k[None, :, cols], acc[..., None]], dim=-1)
            _, exponent = torch.frexp(terms.abs().amax(dim=-1, keepdim=True))
            unit = torch.ldexp(torch.ones_like(terms[..., :1]), exponent - 14)
            acc = truncate((cut(terms / unit) * unit).sum(dim=-1).double()).float()  # the aligned sum is exact in float32
        out[:, start : start + chunk] = acc.double()
    return out


def combine_deepgemm(dots: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """relu·weight in fp32 summed over 4 groups of 16 heads, each group times the scale, the 4
    partial sums added pairwise (the order of DeepGEMM's paged-logits epilogue)."""
    terms = dots.float().relu() * weights.float()[:, None]
    partial = [terms[16 * g : 16 * g + 16].sum(dim=0) * scales.float() for g in range(4)]
    return ((partial[0] + partial[1]) + (partial[2] + partial[3])).double()


def scores_fp32_reordered(q: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    q32, keys32 = q.float(), keys.float()
    acc = torch.zeros(q.shape[0], keys.shape[0])
    for i in reversed(range(q.shape[1])):
        acc = acc + q32[:, i, None] * keys32[None, :, i]
    terms = acc.relu() * weights.float()[:, None] * scales.float()[None, :]
    total = torch.zeros(keys.shape[0])
    for h in reversed(range(q.shape[0])):
        total = total + terms[h]
    return total.double()


def scores_plain(q, keys, scales, weights, relu: bool = True, scale: bool = True) -> torch.Tensor:
    dots = q @ keys.T
    out = ((dots.relu() if relu else dots) * weights[:, None]).sum(dim=0)
    return out * scales if scale else out


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "correct", "defect" or "outside" (outside the model: reported, not required)
    scores: Callable[[Operands], torch.Tensor] | None = None  # its own scores; None: edits the reference's selection
    edit: Callable[[torch.Tensor], torch.Tensor] | None = None  # reference positions sorted by score -> its 2048 positions


def _swap_best_for_worst(order: torch.Tensor) -> torch.Tensor:
    chosen = order[:TOPK].clone()
    chosen[0] = order[-1]
    return chosen


def _swap_64_ranks(order: torch.Tensor) -> torch.Tensor:
    chosen = order[:TOPK].clone()
    chosen[-1] = order[min(TOPK - 1 + 64, order.numel() - 1)]
    return chosen


VARIANTS = (
    Variant("fp32_reordered", "correct", scores=lambda ops: scores_fp32_reordered(*ops)),
    Variant("tensor_core_rz", "correct", scores=lambda ops: combine_deepgemm(dots_step_truncated(ops[0], ops[1]), ops[2], ops[3])),
    Variant("tensor_core_aligned", "correct", scores=lambda ops: combine_deepgemm(dots_aligned(ops[0], ops[1]), ops[2], ops[3])),
    Variant("swap_best_for_worst", "defect", edit=_swap_best_for_worst),
    Variant("swap_64_ranks", "defect", edit=_swap_64_ranks),
    Variant("no_scale", "defect", scores=lambda ops: scores_plain(*ops, scale=False)),
    Variant("no_relu", "defect", scores=lambda ops: scores_plain(*ops, relu=False)),
    Variant("bf16_weights", "outside", scores=lambda ops: scores_plain(ops[0], ops[1], ops[2], ops[3].to(torch.bfloat16).double())),
    Variant(
        "tensor_core_floor", "outside",
        scores=lambda ops: combine_deepgemm(dots_aligned(ops[0], ops[1], rounding="floor"), ops[2], ops[3]),
    ),  # fmt: skip
)


# --------------------------------------------------------------------------- judging


@dataclass
class Verdict:
    """One variant on one input set of one case."""

    status: Status
    message: str
    worst_ratio: float  # the largest row gap over that row's tie tolerance (0: the exact top-k sets)
    changed: bool  # whether its selection differs from the reference's in some row
    worst_error: float | None  # its largest |score - reference score| over the row's largest |score| (None: no scores of its own)


@dataclass
class CaseReport:
    case: str
    seeds: list[int]
    scored_rows: int
    verdicts: dict[str, list[Verdict]] = field(default_factory=dict)
    #: each scored row's tie tolerance over its largest |score|
    tolerance_ratios: list[float] = field(default_factory=list)


def gap_ratio(row: indexer.ScoredRow, positions: torch.Tensor) -> float:
    best = torch.topk(row.scores, TOPK).values
    chosen = torch.sort(row.scores[positions], descending=True).values
    return float((best - chosen).max()) / row.tie_tolerance


def judge_variant(variant: Variant, inputs: dict[str, Any], expected: list, reference_ids: torch.Tensor, rows: list[int]) -> Verdict:
    """``variant``'s ids for ``rows`` (the reference's elsewhere), judged by the definition's checker."""
    out = reference_ids.clone()
    worst, changed, error = 0.0, False, None
    for b in rows:
        row = expected[b]
        seq_len = int(inputs["seq_lens"][b])
        if variant.scores is not None:
            scores = variant.scores(row_operands(inputs, b))
            positions = torch.topk(scores, TOPK).indices
            largest = float(row.scores.abs().max())
            error = max(error or 0.0, float((scores - row.scores.double()).abs().max()) / largest)
        else:
            assert variant.edit is not None
            positions = variant.edit(torch.argsort(row.scores, descending=True))
        ids = indexer.token_ids(inputs["block_table"][b], seq_len)[positions]
        out[b] = ids.to(torch.int32)
        worst = max(worst, gap_ratio(row, positions))
        changed = changed or set(ids.tolist()) != set(reference_ids[b].tolist())
    result = indexer.check(inputs, {"topk_indices": out}, expected, Tolerance())
    return Verdict(result.status, result.message, worst, changed, error)


def sweep_case(workload: Any, case: Any, input_sets: int, variants: tuple[Variant, ...], max_rows: int | None) -> CaseReport:
    settings = workload.settings.replace(input_sets=input_sets)
    seeds = list(correctness_seeds(settings, case))
    report = CaseReport(case.id, seeds, 0, {v.name: [] for v in variants})
    for seed in seeds:
        inputs = build_inputs(workload.definition, case, seed, CPU)
        expected = indexer.expect(inputs)
        rows = [b for b, row in enumerate(expected) if row is not None][:max_rows]
        report.scored_rows = len(rows)
        report.tolerance_ratios += [expected[b].tie_tolerance / float(expected[b].scores.abs().max()) for b in rows]
        reference_ids = indexer.reference(**inputs)["topk_indices"]
        for variant in variants:
            if not rows and variant.kind != "correct":
                continue  # nothing is ranked: only the passthrough is checked, by the correct ones
            report.verdicts[variant.name].append(judge_variant(variant, inputs, expected, reference_ids, rows))
        del inputs, expected
    return report


def summarize(reports: list[CaseReport], variants: tuple[Variant, ...]) -> list[dict[str, Any]]:
    """Per variant: input sets judged, passed, failed; its largest gap ratio among passes, its
    smallest among failures; and the sets where a defect changed nothing or stayed within the tolerance."""
    table = []
    for variant in variants:
        verdicts = [(r.case, v) for r in reports for v in r.verdicts[variant.name]]
        passed = [(c, v) for c, v in verdicts if v.status is Status.PASSED]
        failed = [(c, v) for c, v in verdicts if v.status is not Status.PASSED]
        unchanged = [c for c, v in passed if not v.changed]
        within = [c for c, v in passed if v.changed]
        table.append({
            "variant": variant.name,
            "kind": variant.kind,
            "sets": len(verdicts),
            "passed": len(passed),
            "failed": len(failed),
            "largest_passing_ratio": max((v.worst_ratio for _, v in passed), default=None),
            "largest_score_error": max((v.worst_error for _, v in verdicts if v.worst_error is not None), default=None),
            "smallest_failing_ratio": min((v.worst_ratio for _, v in failed), default=None),
            "passed_unchanged": len(unchanged),
            "passed_changed_within_tolerance": sorted(set(within)),
            "failures": sorted({c for c, _ in failed}) if variant.kind != "defect" else [],
        })  # fmt: skip
    return table


def check_expectations(table: list[dict[str, Any]]) -> list[str]:
    """What breaks the claim: a correct variant that failed, a defect that passed with a changed selection."""
    problems = []
    for row in table:
        if row["kind"] == "correct" and row["failed"]:
            problems.append(f"{row['variant']} (a correct kernel) failed on {', '.join(row['failures'])}")
        if row["kind"] == "defect" and row["passed_changed_within_tolerance"]:
            cases = ", ".join(row["passed_changed_within_tolerance"])
            problems.append(f"{row['variant']} (a defect) passed with a changed selection on {cases}")
    return problems


def main(
    workload: Path = typer.Option(ROOT / "workloads" / "indexer_h64.yaml", help="workload YAML of the indexer definition"),
    case: list[str] = typer.Option([], help="case id patterns (fnmatch); default every case"),
    input_sets: int = typer.Option(3, min=1, help="input sets per case (the run's correctness seeds)"),
    max_rows: int | None = typer.Option(None, min=1, help="apply the variants to at most this many scored rows per case"),
    out: Path | None = typer.Option(None, help="write the per-case verdicts and the summary as JSON"),
) -> None:
    wl = load_workload(workload)
    if wl.definition.name != indexer.NAME:
        raise typer.BadParameter(f"{workload} is a workload of {wl.definition.name}, not {indexer.NAME}")
    cases = [c for c in wl.cases if not case or any(fnmatch.fnmatchcase(c.id, p) for p in case)]
    if not cases:
        raise typer.BadParameter(f"no case of {wl.name} matches {', '.join(case)}")
    print(f"workload {wl.name}: {len(cases)} cases x {input_sets} input sets; model: accumulator unit 2^-13, "
          f"dot RMS {indexer.DOT_ERROR_RMS} units, {indexer.TAIL_SIGMAS} sigmas, fp32 head sum {indexer.HEAD_SUM_GAMMA:.2e}")  # fmt: skip
    started = time.perf_counter()
    reports = []
    for c in cases:
        report = sweep_case(wl, c, input_sets, VARIANTS, max_rows)
        reports.append(report)
        cells = [
            f"{name} {sum(v.status is Status.PASSED for v in vs)}/{len(vs)} ({max((v.worst_ratio for v in vs), default=0):.2g})"
            for name, vs in report.verdicts.items() if vs
        ]  # fmt: skip
        print(f"{c.id} ({report.scored_rows} scored rows): passed/sets (largest gap/tolerance): " + ", ".join(cells), flush=True)
    table = summarize(reports, VARIANTS)
    headers = ["variant", "kind", "sets", "passed", "failed", "largest gap/tol. passing", "smallest gap/tol. failing", "passed, unchanged",
               "largest score error / row max"]  # fmt: skip
    print()
    print(tabulate(
        [[r["variant"], r["kind"], r["sets"], r["passed"], r["failed"], r["largest_passing_ratio"], r["smallest_failing_ratio"],
          r["passed_unchanged"], r["largest_score_error"]] for r in table],
        headers=headers, floatfmt=".3g", tablefmt="github",
    ))  # fmt: skip
    ratios = [x for r in reports for x in r.tolerance_ratios]
    if ratios:
        print(f"tie tolerance / row's largest |score| over {len(ratios)} scored rows: min {min(ratios):.3g}, "
              f"median {statistics.median(ratios):.3g}, max {max(ratios):.3g}")  # fmt: skip
    problems = check_expectations(table)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    outside = [r for r in table if r["kind"] == "outside"]
    for r in outside:
        print(f"outside the model: {r['variant']} passed {r['passed']} of {r['sets']} input sets")
    print(f"{'every correct variant passed and every defect failed where it changed the selection' if not problems else 'CLAIM BROKEN'}"
          f" ({time.perf_counter() - started:.0f} s)")  # fmt: skip
    if out is not None:
        document = {
            "workload": wl.name,
            "input_sets": input_sets,
            "max_rows": max_rows,
            "model": {"accumulator_unit": indexer.ACCUMULATOR_UNIT, "dot_error_rms": indexer.DOT_ERROR_RMS,
                      "tail_sigmas": indexer.TAIL_SIGMAS, "head_sum_gamma": indexer.HEAD_SUM_GAMMA},
            "summary": table,
            "cases": [{"case": r.case, "seeds": r.seeds, "scored_rows": r.scored_rows, "tolerance_ratios": r.tolerance_ratios,
                       "verdicts": {n: [{"status": v.status.value, "worst_ratio": v.worst_ratio, "changed": v.changed,
                                         "worst_error": v.worst_error} for v in vs]
                                    for n, vs in r.verdicts.items()}} for r in reports],
        }  # fmt: skip
        out.write_text(json.dumps(document, indent=1))
    raise typer.Exit(1 if problems else 0)


if __name__ == "__main__":
    typer.run(main)
