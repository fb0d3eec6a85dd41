"""Where the SGLang peer's wrong top-k sets come from: its kernel, or our wrapper (issue 45, part 3).

Needs a CUDA GPU with the peer's packages (sgl-deep-gemm, sglang-kernel; tools/carry_peers.py).
Two kinds of probe, each printing one verdict line ``PROBE <name>: OK|WRONG|SKIPPED <detail>``:

1. ``kernel/<distribution>/L=<n>``: ``sgl_kernel``'s ``fast_topk_transform_fused`` alone, on
   hand-made fp32 logits whose top 2048 is known (distinct values: one right set), through an
   identity token table (id = position), called as the peer calls it (decode: ``cu_seqlens_q =
   arange(B + 1)``, no ``row_starts``). Distributions: distinct, all negative, scaled by 1e3
   and 1e-4, near-constant (every value within 2^-23 · L of 1: one coarse histogram bin holds
   the whole row), and a row followed by huge garbage past its length (the peer leaves
   DeepGEMM's logits past seq_len unmasked). Lengths 4K to 128K, one row per block and a
   ragged batch. A WRONG here is the kernel's own.
2. ``wrapper/<workload>:<case>``: the peer's exact calls on a workload case (inputs as a run
   builds them: the workload's seed, input set 0): the batch state of
   ``solutions/deepgemm_sglang/entry.py`` (token table, DeepGEMM schedule metadata, context
   lengths, cu_seqlens_q), then each step checked on its own: the token table against the
   block table; DeepGEMM's logits against the reference scores (in units of each row's tie
   tolerance); ``fast_topk_transform_fused`` on those very logits against ``torch.topk`` of
   the same logits; FlashInfer's top-k on the same logits (where installed) for contrast; and
   the whole entry judged by the definition's checker. The verdict names the first step that
   goes wrong.

A selection is judged as the checker does modulo exact ties: the row's selected logits,
sorted, must equal ``torch.topk``'s values of the same logits (no tolerance: both read the same
fp32 numbers). ``missing`` counts the ranks where the selection falls below the true top-k.

Usage:

    python benchmarks/kernels/peer_topk_probe.py [--case WORKLOAD:CASE ...] [--lengths 4096,32768,131072]
        [--skip-kernel] [--skip-wrapper] [--seed N]

Default wrapper cases: indexer_long b1_l128k, b32_ragged_4k_128k, b64_l128k and indexer_scaled
b1_l128k_neg, b1_l128k_x1e-4, b8_l64k_flat. Exit status 0 when every probe ran (whatever the
verdicts), 2 without a GPU or the peer's packages.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import typer

from dsa_bench.definitions import indexer
from dsa_bench.definitions.base import INT_POISON, Tolerance

ROOT = Path(__file__).resolve().parents[2]
TOPK = indexer.TOPK
DEFAULT_CASES = (
    "indexer_long:b1_l128k",
    "indexer_long:b32_ragged_4k_128k",
    "indexer_long:b64_l128k",
    "indexer_scaled:b1_l128k_neg",
    "indexer_scaled:b1_l128k_x1e-4",
    "indexer_scaled:b8_l64k_flat",
)
DISTRIBUTIONS = ("distinct", "negative", "x1e3", "x1e-4", "near_constant", "garbage_past_length")

#: select(logits [B, W] fp32, lengths [B] int32, table [B, W] int32) -> ids [B, 2048] int32 (table entries, -1 padded)
Select = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Verdict:
    name: str
    outcome: str  # OK, WRONG or SKIPPED
    detail: str

    def line(self) -> str:
        return f"PROBE {self.name}: {self.outcome} {self.detail}"


# --------------------------------------------------------------------------- judging a selection


def judge_positions(logits: torch.Tensor, lengths: list[int], positions: torch.Tensor) -> tuple[bool, str]:
    """Whether every row's selected positions are a top-min(2048, L) set of its own logits (exact,
    ties interchangeable); the first bad row in words otherwise."""
    logits, positions = logits.float().cpu(), positions.long().cpu()
    for b, n in enumerate(lengths):
        want = min(TOPK, n)
        row = positions[b]
        chosen = row[row >= 0]
        if chosen.numel() != want or bool((row < -1).any()):
            return False, f"row {b} (L={n}): {chosen.numel()} valid positions, expected {want}"
        if want == 0:
            continue
        if bool((chosen >= n).any()):
            return False, f"row {b} (L={n}): position {int(chosen[chosen >= n][0])} is not below the length"
        if chosen.unique().numel() != want:
            return False, f"row {b} (L={n}): a position appears twice"
        best = torch.topk(logits[b, :n], want).values
        got = torch.sort(logits[b, chosen], descending=True).values
        below = best > got
        if bool(below.any()):
            rank = int(torch.nonzero(below)[0])
            return False, (f"row {b} (L={n}): {int(below.sum())} of {want} ranks below the true top-{want} "
                           f"(first at rank {rank + 1}: {float(got[rank]):.9g} < {float(best[rank]):.9g})")  # fmt: skip
    return True, f"{len(lengths)} row(s) exact"


def positions_of(ids: torch.Tensor, token_tables: list[torch.Tensor]) -> torch.Tensor:
    """Positions of physical ids within each row's token table (-1 stays -1; an id not in the row: -2)."""
    out = torch.full(ids.shape, -1, dtype=torch.long)
    ids = ids.long().cpu()
    for b, table in enumerate(token_tables):
        table = table.long().cpu()
        order = torch.argsort(table)
        ranked = table[order]
        row = ids[b]
        valid = row >= 0
        at = torch.searchsorted(ranked, row[valid]).clamp(max=max(ranked.numel() - 1, 0))
        found = ranked[at] == row[valid] if ranked.numel() else torch.zeros_like(row[valid], dtype=torch.bool)
        out[b, valid] = torch.where(found, order[at], -2)
    return out


# --------------------------------------------------------------------------- probe 1: the kernel alone


def known_logits(kind: str, lengths: list[int], width: int, seed: int) -> torch.Tensor:
    """``[B, width]`` fp32 logits with distinct values in each row's first L positions."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        rank = torch.randperm(width, generator=gen).float()  # distinct integers, exact in fp32 below 2^24
        if kind == "negative":
            row = -rank - 1.0
        elif kind == "x1e3":
            row = rank * 1e3
        elif kind == "x1e-4":
            row = (rank - width / 2) * 1e-4
        elif kind == "near_constant":
            row = 1.0 + rank * 2.0**-23
        else:
            row = rank.clone()
        if kind == "garbage_past_length":
            row[n:] = 1e30  # larger than every real logit: a kernel reading past L picks it
        else:
            row[n:] = float("nan")
        rows.append(row)
    return torch.stack(rows)


def sglang_select(logits: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The peer's call: decode layout (cu_seqlens_q = arange(B + 1)), no row_starts."""
    batch = logits.shape[0]
    out = torch.full((batch, TOPK), INT_POISON, dtype=torch.int32, device=logits.device)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=logits.device)
    torch.ops.sgl_kernel.fast_topk_transform_fused(logits, lengths, out, table, cu_seqlens_q, None)
    torch.cuda.synchronize()
    return out


def kernel_probes(select: Select, lengths: list[int], device: torch.device, seed: int) -> list[Verdict]:
    """Probe 1 with ``select`` as the kernel (tests pass torch-made selections)."""
    verdicts = []
    batches = [[n] for n in lengths] + [sorted({max(1, n // d) for n in lengths for d in (1, 3, 7)})]
    for kind in DISTRIBUTIONS:
        for rows in batches:
            width = max(rows) + 64 - max(rows) % 64 if kind == "garbage_past_length" else -(-max(rows) // 64) * 64
            logits = known_logits(kind, rows, width, seed).to(device)
            table = torch.arange(width, dtype=torch.int32, device=device).expand(len(rows), width).contiguous()
            lens = torch.tensor(rows, dtype=torch.int32, device=device)
            name = f"kernel/{kind}/L={rows[0] if len(rows) == 1 else 'ragged ' + ','.join(map(str, rows))}"
            try:
                ids = select(logits, lens, table)
            except Exception as exc:  # the kernel refusing an input is a verdict too
                verdicts.append(Verdict(name, "WRONG", f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
                continue
            ok, detail = judge_positions(logits, rows, ids)  # identity table: ids are positions
            verdicts.append(Verdict(name, "OK" if ok else "WRONG", detail))
    return verdicts


# --------------------------------------------------------------------------- probe 2: the wrapper's calls


def wrapper_probe(spec: str, seed: int | None, device: torch.device) -> Verdict:
    """Probe 2 on one ``workload:case``."""
    import deep_gemm

    from dsa_bench.run.case_context import correctness_seeds
    from dsa_bench.run.loader import import_entry
    from dsa_bench.solution import load_solution
    from dsa_bench.workloads import build_inputs, load_workload

    workload_name, _, case_id = spec.partition(":")
    workload = load_workload(ROOT / "workloads" / f"{workload_name}.yaml")
    case = next((c for c in workload.cases if c.id == case_id), None)
    if case is None:
        return Verdict(f"wrapper/{spec}", "SKIPPED", f"no case {case_id!r} in workload {workload_name!r}")
    input_seed = seed if seed is not None else correctness_seeds(workload.settings, case)[0]
    inputs = build_inputs(workload.definition, case, input_seed, device)
    q, cache, weights, seq_lens, table = (inputs[s.name] for s in workload.definition.inputs)
    lens = seq_lens.tolist()
    batch = len(lens)
    fn, module = import_entry(load_solution(ROOT / "solutions" / "deepgemm_sglang"), workload.definition.name)
    meta = module._batch(seq_lens, table)  # the wrapper's own batch state
    steps = []
    # 1. token table
    token_tables = [indexer.token_ids(table[b], n) for b, n in enumerate(lens)]
    for b, n in enumerate(lens):
        if not torch.equal(meta.token_table[b, :n].long(), token_tables[b]):
            return Verdict(f"wrapper/{spec}", "WRONG", f"wrapper: token table row {b} differs from the block table's ids")
    steps.append("token table right")
    # 2. DeepGEMM's logits with the wrapper's schedule and context lengths
    logits = deep_gemm.fp8_paged_mqa_logits(q.view(batch, 1, indexer.NUM_HEADS, indexer.HEAD_DIM), cache.view(torch.uint8),
                                            weights, meta.context_lens, table, meta.schedule, meta.max_len, False)  # fmt: skip
    if not isinstance(logits, torch.Tensor):
        logits = torch.utils.dlpack.from_dlpack(logits)
    expected = workload.definition.expect(inputs)
    worst = 0.0
    for b, n in enumerate(lens):
        if expected[b] is None:
            continue
        diff = float((logits[b, :n].float() - expected[b].scores.to(logits.device)).abs().max())
        worst = max(worst, diff / max(expected[b].tie_tolerance, 1e-30))
    steps.append(f"DeepGEMM logits within {worst:.3g} tie tolerances of the reference")
    logits_ok = worst <= 1.0
    # 3. the fused top-k on those logits, through the wrapper's token table and cu_seqlens_q
    out = torch.full((batch, TOPK), INT_POISON, dtype=torch.int32, device=device)
    torch.ops.sgl_kernel.fast_topk_transform_fused(logits, seq_lens, out, meta.token_table, meta.cu_seqlens_q, None)
    torch.cuda.synchronize()
    kernel_ok, kernel_detail = judge_positions(logits, lens, positions_of(out, token_tables))
    steps.append(f"fused top-k on DeepGEMM's logits vs torch.topk of the same: {'exact' if kernel_ok else kernel_detail}")
    # 4. FlashInfer's top-k on the same logits, for contrast
    try:
        import flashinfer.topk

        other = torch.full((batch, TOPK), INT_POISON, dtype=torch.int32, device=device)
        flashinfer.topk.top_k_page_table_transform(logits, table, seq_lens, TOPK, page_size=indexer.PAGE_SIZE, out=other)
        torch.cuda.synchronize()
        ok, detail = judge_positions(logits, lens, positions_of(other, token_tables))
        steps.append(f"FlashInfer's top-k on the same logits: {'exact' if ok else detail}")
    except ImportError:
        steps.append("FlashInfer not installed (no contrast)")
    # 5. the entry itself, judged as a run judges it
    entry_out = workload.definition.allocate_outputs(workload.definition.axes(case.axes), device)
    fn(q, cache, weights, seq_lens, table, entry_out["topk_indices"])
    torch.cuda.synchronize()
    result = workload.definition.check(inputs, entry_out, expected, Tolerance())
    steps.append(f"entry: {result.status.value}" + ("" if result.passed else f" ({result.message})"))
    if not kernel_ok:
        verdict, outcome = "the KERNEL drops true winners on DeepGEMM's own logits", "WRONG"
    elif not logits_ok:
        verdict, outcome = "the LOGITS step (DeepGEMM with the wrapper's schedule / context lengths) is off", "WRONG"
    elif not result.passed:
        verdict, outcome = "every step is right alone but the entry fails: the WRAPPER (batch cache, graph replay)", "WRONG"
    else:
        verdict, outcome = "not reproduced on this case", "OK"
    return Verdict(f"wrapper/{spec}", outcome, f"{verdict}; " + "; ".join(steps))


def main(
    case: list[str] = typer.Option(list(DEFAULT_CASES), "--case", help="WORKLOAD:CASE for the wrapper probe; repeat for several."),
    lengths: str = typer.Option("4096,32768,65536,131072", help="Row lengths of the kernel probe, comma separated."),
    seed: int = typer.Option(0, help="Seed of the kernel probe's logits."),
    input_seed: int = typer.Option(None, help="Input-set seed of the wrapper probe (default: the run's first correctness seed)."),
    skip_kernel: bool = typer.Option(False, help="Run only the wrapper probes."),
    skip_wrapper: bool = typer.Option(False, help="Run only the kernel probes."),
) -> None:
    """Probe SGLang's fused top-k alone and the SGLang peer's calls; print a verdict per probe."""
    if not torch.cuda.is_available():
        typer.echo("peer_topk_probe: needs a CUDA GPU (the SGLang and DeepGEMM kernels run only there)", err=True)
        raise typer.Exit(2)
    try:
        import deep_gemm  # noqa: F401
        import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)
    except ImportError as exc:
        typer.echo(f"peer_topk_probe: the peer's packages do not import ({exc}); carry them with tools/carry_peers.py", err=True)
        raise typer.Exit(2) from None
    device = torch.device("cuda")
    verdicts: list[Verdict] = []
    if not skip_kernel:
        rows = [int(n) for n in lengths.split(",") if n.strip()]
        for v in kernel_probes(sglang_select, rows, device, seed):
            typer.echo(v.line())
            verdicts.append(v)
    if not skip_wrapper:
        for spec in case:
            v = wrapper_probe(spec, input_seed, device)
            typer.echo(v.line())
            verdicts.append(v)
    wrong = [v.name for v in verdicts if v.outcome == "WRONG"]
    typer.echo(f"{len(verdicts)} probes, {len(wrong)} WRONG" + (f": {', '.join(wrong)}" if wrong else ""))
    sys.stdout.flush()


if __name__ == "__main__":
    typer.run(main)
