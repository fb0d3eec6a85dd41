"""How close a timed record is to the hardware: its place on the device's roofline.

A definition says, per input set, the bytes a correct kernel must move at least
(``Definition.min_traffic_bytes``) and the tensor-core FLOPs of its matrix products
(``Definition.useful_flops``, in ``Definition.math_precision``). The run measures the device's
copy bandwidth (``timing.flush.measure_copy_bandwidth``) and this module looks up the device's
dense tensor-core peak of that precision (:data:`PEAKS`). A record's latency then gives

- ``achieved_bandwidth``: minimum bytes / latency (bytes/s), against the copy bandwidth;
- ``achieved_tflops``: useful FLOPs / latency, against the dense peak;
- ``fraction_of_roofline``: the larger of the two fractions, and ``bound``, which of the two
  bounds that is (the nearer one: the one the kernel is closer to).

Both are lower bounds on what the kernel really did (it may move more bytes or compute padding),
so a fraction is how much of the machine the *useful* work used (docs/roofline.md).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from dsa_bench.models import ClosedModel

if TYPE_CHECKING:
    from dsa_bench.results.records import CaseRecord

#: a record's host wall time counts as launch-bound when it exceeds the kernel span by more than this
HOST_EXCESS = 0.20


@dataclass(frozen=True)
class DevicePeak:
    """Dense (no structured sparsity) tensor-core peaks of one GPU model, TFLOPS, and where they come from."""

    model: str
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores
    source: str

    def tflops(self, precision: str) -> float | None:
        return {"bf16": self.bf16_tflops, "fp8": self.fp8_tflops}.get(precision)


_SPARSE_HALVED = "figures with 2:4 sparsity, dense is half"

#: (pattern matched against torch's device name, case-insensitive; its peaks), most specific first.
#: Vendor figures, dense: NVIDIA quotes Hopper and Blackwell tensor-core TFLOPS with sparsity.
PEAKS: tuple[tuple[str, DevicePeak], ...] = (
    (r"\bgh200\b", DevicePeak("GH200", 989.4, 1978.9, f"NVIDIA GH200 Grace Hopper datasheet: BF16 1,979, FP8 3,958; {_SPARSE_HALVED}")),
    (r"\bh200 nvl\b", DevicePeak("H200 NVL", 835.5, 1670.5, f"NVIDIA H200 datasheet, NVL column: BF16 1,671, FP8 3,341; {_SPARSE_HALVED}")),
    (r"\bh200\b", DevicePeak("H200 SXM", 989.4, 1978.9, f"NVIDIA H200 datasheet, SXM column: BF16 1,979, FP8 3,958; {_SPARSE_HALVED}")),
    (r"\bh100 nvl\b", DevicePeak("H100 NVL", 835.5, 1670.5, f"NVIDIA H100 datasheet, NVL column: BF16 1,671, FP8 3,341; {_SPARSE_HALVED}")),
    (r"\bh100 pcie\b", DevicePeak("H100 PCIe", 756.5, 1513.0, f"NVIDIA H100 datasheet, PCIe: BF16 1,513, FP8 3,026; {_SPARSE_HALVED}")),
    (r"\bh100\b", DevicePeak("H100 SXM", 989.4, 1978.9, f"NVIDIA H100 datasheet, SXM column: BF16 1,979, FP8 3,958; {_SPARSE_HALVED}")),
    (r"\bh800 pcie\b", DevicePeak("H800 PCIe", 756.5, 1513.0, f"NVIDIA H800 PCIe datasheet: BF16 1,513, FP8 3,026; {_SPARSE_HALVED}")),
    (r"\bh800\b", DevicePeak("H800 SXM", 989.4, 1978.9, f"NVIDIA H800 SXM datasheet: BF16 1,979, FP8 3,958; {_SPARSE_HALVED}")),
    (r"\bh20\b", DevicePeak("H20", 148.0, 296.0, "NVIDIA H20 product brief: BF16 148, FP8 296 (dense)")),
    (r"\bb200\b", DevicePeak("B200", 2250.0, 4500.0, f"NVIDIA HGX B200 datasheet, a GPU: BF16 4.5 PFLOPS, FP8 9 PFLOPS; {_SPARSE_HALVED}")),
    (r"\ba100\b", DevicePeak("A100", 312.0, None, "NVIDIA A100 datasheet: BF16 312 dense (624 with sparsity); no FP8 tensor cores")),
)


def device_peak(gpu_name: str | None) -> DevicePeak | None:
    """The dense peaks of the GPU model torch names ``gpu_name`` (e.g. "NVIDIA H200"), or None when the table lacks it."""
    if not gpu_name:
        return None
    for pattern, peak in PEAKS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return peak
    return None


#: a rate or a fraction: finite and not negative
_Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Roofline(ClosedModel):
    """One timed record on the roofline. Bytes and FLOPs are the mean per timed call (the timed
    calls rotate over input sets whose work differs); rates are those over the record's latency.
    Built by :func:`place` without validation; a results file's ``records[i].roofline`` is validated on load."""

    min_bytes: _Rate
    flops: _Rate
    math_precision: Literal["bf16", "fp8"] | None  # None: no tensor-core math (memory only)
    copy_bandwidth: Annotated[float, Field(gt=0, allow_inf_nan=False)]  # bytes/s, measured on the device by the run
    #: dense peak of math_precision; None: no math, or a GPU model the table lacks
    peak_tflops: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None
    peak_source: str
    achieved_bandwidth: _Rate  # min_bytes / latency, bytes/s
    achieved_tflops: _Rate  # flops / latency / 1e12
    bandwidth_fraction: _Rate
    compute_fraction: _Rate | None
    fraction_of_roofline: _Rate
    bound: Literal["memory", "compute"]  # the nearer bound: the one fraction_of_roofline is measured against


def place(latency_s: float, min_bytes: float, flops: float, precision: str | None, copy_bandwidth: float,
          peak: DevicePeak | None, gpu_name: str | None = None) -> Roofline:  # fmt: skip
    """Where a call of ``latency_s`` doing this work sits against ``copy_bandwidth`` (bytes/s) and ``peak``."""
    achieved_bandwidth = min_bytes / latency_s
    achieved_flops = flops / latency_s
    bandwidth_fraction = achieved_bandwidth / copy_bandwidth
    peak_tflops = peak.tflops(precision) if peak is not None and precision is not None else None
    if precision is None:
        source = "no tensor-core math: memory only"
    elif peak is None:
        source = f"no dense {precision} peak known for GPU {gpu_name!r}: the fraction is the bandwidth's alone"
    elif peak_tflops is None:
        source = f"{peak.model} has no {precision} tensor cores ({peak.source}): the fraction is the bandwidth's alone"
    else:
        source = f"{peak.model} dense {precision} {peak_tflops:g} TFLOPS ({peak.source})"
    compute_fraction = achieved_flops / (peak_tflops * 1e12) if peak_tflops else None
    compute_nearer = compute_fraction is not None and compute_fraction > bandwidth_fraction
    placed: dict[str, Any] = dict(
        min_bytes=min_bytes, flops=flops, math_precision=precision, copy_bandwidth=copy_bandwidth, peak_tflops=peak_tflops,
        peak_source=source, achieved_bandwidth=achieved_bandwidth, achieved_tflops=achieved_flops / 1e12,
        bandwidth_fraction=bandwidth_fraction, compute_fraction=compute_fraction,
        fraction_of_roofline=compute_fraction if compute_nearer and compute_fraction is not None else bandwidth_fraction,
        bound="compute" if compute_nearer else "memory",
    )  # fmt: skip
    return Roofline.model_construct(**placed)  # not validated: the judge refuses impossible timings


# --------------------------------------------------------------------------- summaries and tables


@dataclass
class RooflineSummary:
    """Per solution: the timer its records carry, the mean fraction of the roofline over its timed
    records, how many are nearer which bound, and how many are launch-bound on the host."""

    solution: str
    timer: str | None  # the records' timer; "a, b" when they differ
    timer_fallback: str | None  # why the run did not use CUPTI, when it fell back
    placed: int  # records with a roofline
    mean_fraction: float | None
    memory_bound: int
    compute_bound: int
    mean_achieved_gbps: float | None
    mean_achieved_tflops: float | None
    host_timed: int  # records with host wall times
    host_bound: int  # records whose host time exceeds the kernel span by more than HOST_EXCESS
    mean_host_us: float | None


def host_excess(record: CaseRecord) -> float | None:
    """(host wall time / kernel span) - 1 of a timed record, or None without host times."""
    timing = record.timing
    if timing is None or not timing.host_samples_ms or timing.mean_ms <= 0:
        return None
    return timing.host_mean_ms / timing.mean_ms - 1


def summarize_roofline(records: list[CaseRecord], solution: str) -> RooflineSummary:
    mine = [r for r in records if r.solution == solution and r.passed and r.timing is not None]
    placed = [r.roofline for r in mine if r.roofline is not None]
    timers = sorted({r.timing.timer for r in mine if r.timing is not None})
    fallbacks = sorted({r.timing.timer_fallback for r in mine if r.timing is not None and r.timing.timer_fallback})
    excess = [(r, e) for r in mine if (e := host_excess(r)) is not None]

    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    return RooflineSummary(
        solution=solution,
        timer=", ".join(timers) or None,
        timer_fallback="; ".join(fallbacks) or None,
        placed=len(placed),
        mean_fraction=mean([p.fraction_of_roofline for p in placed]),
        memory_bound=sum(p.bound == "memory" for p in placed),
        compute_bound=sum(p.bound == "compute" for p in placed),
        mean_achieved_gbps=mean([p.achieved_bandwidth / 1e9 for p in placed]),
        mean_achieved_tflops=mean([p.achieved_tflops for p in placed if p.math_precision is not None]),
        host_timed=len(excess),
        host_bound=sum(e > HOST_EXCESS for _, e in excess),
        mean_host_us=mean([r.timing.host_mean_ms * 1e3 for r, _ in excess if r.timing is not None]),
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def roofline_cell(record: CaseRecord) -> str:
    """A record's fraction of the roofline and its nearer bound, e.g. "79.1% mem" ("-" when not placed)."""
    r = record.roofline
    return "-" if r is None else f"{_pct(r.fraction_of_roofline)} {'mem' if r.bound == 'memory' else 'math'}"


def host_cell(record: CaseRecord) -> str:
    """The host wall time per call where it exceeds the kernel span by more than HOST_EXCESS, with
    the excess ("23.4 (+41%)"); empty where it does not, "-" where there are no host times."""
    excess = host_excess(record)
    if excess is None or record.timing is None:
        return "-"
    return f"{record.timing.host_mean_ms * 1e3:.1f} (+{100 * excess:.0f}%)" if excess > HOST_EXCESS else ""


def roofline_rows(records: list[CaseRecord]) -> tuple[list[str], list[list[str]]]:
    """(headers, one row per solution) of the roofline and timer summary."""
    headers = ["solution", "timer", "placed", "mean of roofline", "nearer bound mem/math", "mean GB/s", "mean TFLOPS",
               f"host > kernel +{100 * HOST_EXCESS:.0f}%", "mean host µs"]  # fmt: skip
    rows = []
    for name in dict.fromkeys(r.solution for r in records):
        s = summarize_roofline(records, name)
        if s.timer is None:
            continue  # nothing timed (skipped, failed, or a CPU run)
        timer = s.timer + (" (FALLBACK)" if s.timer_fallback else "")
        rows.append([name, timer, str(s.placed), _pct(s.mean_fraction), f"{s.memory_bound}/{s.compute_bound}",
                     _num(s.mean_achieved_gbps, 0), _num(s.mean_achieved_tflops), f"{s.host_bound}/{s.host_timed}",
                     _num(s.mean_host_us)])  # fmt: skip
    return headers, rows


def roofline_table(records: list[CaseRecord], tablefmt: str = "simple") -> str:
    """The run's roofline summary (a mean per solution), the timer fallback stated where there was one; "" when nothing was timed."""
    from tabulate import tabulate

    headers, rows = roofline_rows(records)
    if not rows:
        return ""
    lines = [tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True)]
    fallbacks = {s.timer_fallback for name in dict.fromkeys(r.solution for r in records)
                 if (s := summarize_roofline(records, name)).timer_fallback}  # fmt: skip
    for reason in sorted(f for f in fallbacks if f):
        lines.append(f"timer FALLBACK: {reason}")
    return "\n".join(lines)


def roofline_markdown(results: list[Any]) -> str:
    """``compare --format markdown``'s roofline section: per results file (LoadedResults), per solution."""
    parts = []
    for res in results:
        table = roofline_table(res.records, tablefmt="github")
        if table:
            device = res.environment.gpu or "?"
            parts.append(f"### Roofline: {res.workload} on {device}\n\n{table}")
    return "\n\n".join(parts)


def record_columns(records: list[CaseRecord]) -> tuple[list[str], list[list[str]]]:
    """(headers, cells per record) that the per-record table adds: the fraction of the roofline where
    any record is placed, and the host wall time where any record exceeds its kernel span by more than
    HOST_EXCESS (empty cells elsewhere). No column when neither applies."""
    headers: list[str] = []
    columns = []
    if any(r.roofline is not None for r in records):
        headers.append("of roofline")
        columns.append(roofline_cell)
    if any((e := host_excess(r)) is not None and e > HOST_EXCESS for r in records):
        headers.append(f"host µs (> kernel +{100 * HOST_EXCESS:.0f}%)")
        columns.append(host_cell)
    return headers, [[cell(r) for cell in columns] for r in records]


def record_note(record: CaseRecord) -> str:
    """The roofline and host-time words a record's log line adds ("" when there are none)."""
    parts = []
    if record.roofline is not None:
        parts.append(f"{roofline_cell(record)} of roofline")
    excess = host_excess(record)
    if excess is not None and excess > HOST_EXCESS and record.timing is not None:
        parts.append(f"host {record.timing.host_mean_ms * 1e3:.1f} µs (+{100 * excess:.0f}%)")
    return ", ".join(parts)


# --------------------------------------------------------------------------- headroom: can a target be met?


def floor_ms(roofline: Roofline) -> float:
    """The least latency this record's work allows on its device: the minimum bytes at the copy bandwidth the
    run measured, or the useful FLOPs at the dense peak, whichever takes longer (ms)."""
    memory_s = roofline.min_bytes / roofline.copy_bandwidth
    compute_s = roofline.flops / (roofline.peak_tflops * 1e12) if roofline.peak_tflops else 0.0
    return 1e3 * max(memory_s, compute_s)


@dataclass
class Headroom:
    """One timed record against its floor and, where the run had one, the fastest peer that passed."""

    case: str
    solution: str
    latency_ms: float
    floor_ms: float
    peer: str | None
    peer_ms: float | None
    target_ms: float | None  # the latency ``target`` x the peer needs (peer_ms / target); None without a target or a peer

    @property
    def verdict(self) -> str:
        """"met", "open", or "below the floor" (the target asks for less time than the work takes on this device)."""
        if self.target_ms is None:
            return "-"
        if self.latency_ms <= self.target_ms:
            return "met"
        return "below the floor" if self.target_ms < self.floor_ms else "open"


def headroom(records: list[CaseRecord], target: float | None) -> list[Headroom]:
    """Per passed, timed record with a roofline: its latency, its floor (:func:`floor_ms`), its peer's latency,
    and the latency a speedup of ``target`` over that peer would need."""
    rows = []
    for record in records:
        if not record.passed or record.timing is None or record.roofline is None:
            continue
        latency = record.timing.mean_ms
        peer_ms = latency * record.peer_speedup if record.peer is not None and record.peer_speedup is not None else None
        rows.append(Headroom(
            case=record.case, solution=record.solution, latency_ms=latency, floor_ms=floor_ms(record.roofline),
            peer=record.peer if peer_ms is not None else None, peer_ms=peer_ms,
            target_ms=peer_ms / target if target is not None and peer_ms is not None else None,
        ))  # fmt: skip
    return rows


def headroom_table(records: list[CaseRecord], target: float | None) -> str:
    """``dsa-bench results headroom``: each record's latency, its peer's and the target's as multiples of the floor,
    then how many cases met the target, stay open, or ask for less than the floor."""
    from tabulate import tabulate

    rows = headroom(records, target)
    if not rows:
        return "no passed record with a roofline (they come with timed GPU runs of definitions that declare their bytes or FLOPs)"

    def us(ms: float | None, floor: float) -> str:
        return "-" if ms is None else f"{1e3 * ms:.1f} ({ms / floor:.2f}x)"

    headers = ["case", "solution", "floor µs", "µs (x floor)", "fastest peer", "peer µs (x floor)"]
    if target is not None:
        headers += [f"{target:g}x the peer: µs (x floor)", "verdict"]
    table = []
    for h in rows:
        row = [h.case, h.solution, f"{1e3 * h.floor_ms:.1f}", us(h.latency_ms, h.floor_ms), h.peer or "-", us(h.peer_ms, h.floor_ms)]
        if target is not None:
            row += [us(h.target_ms, h.floor_ms), h.verdict]
        table.append(row)
    lines = [tabulate(table, headers=headers, disable_numparse=True)]
    if target is not None:
        judged = [h for h in rows if h.target_ms is not None]
        counts = {v: sum(h.verdict == v for h in judged) for v in ("met", "open", "below the floor")}
        lines.append(f"{target:g}x the fastest passing peer, over {len(judged)} records with a peer: {counts['met']} met, "
                     f"{counts['open']} open, {counts['below the floor']} below the floor (out of reach on this device)")  # fmt: skip
    return "\n".join(lines)
