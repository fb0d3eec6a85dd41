"""Result records, the versioned results file (its models), writing it as records arrive and reading it back.

The results file is one JSON document rewritten atomically after every record, so an
interrupted run keeps everything it finished and the file is always valid JSON.

Each part is declared once, as a pydantic model: :class:`ResultsHeader`, :class:`CaseRecord` and
:class:`Timing`. A run builds them without validation (``model_construct``: the runner fills a
record field by field, and builds a Timing from whatever samples a worker sent before the judge
refuses impossible ones); :func:`load_results` validates a file against them (:class:`ResultsDocument`).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_serializer, model_serializer, model_validator

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_document, check_output_path, has_json_format, read_json, write_atomic
from dsa_bench.models import ClosedModel, Name, OpenModel
from dsa_bench.results.roofline import Roofline
from dsa_bench.timing.base import harness_latency_ms, trial_medians_ms

RESULTS_FORMAT: Final = "dsa-bench-results"


RESULTS_VERSION: Final = 1


if TYPE_CHECKING:  # a Literal built from the enum at run time, which type checkers cannot follow
    StatusName = str
else:
    StatusName = Literal[tuple(s.value for s in Status)]


#: a latency, speedup, spread or duration: finite and not negative
Measure = Annotated[float, Field(ge=0, allow_inf_nan=False)]

#: the figures a timing is written with ahead of its samples (:meth:`Timing._written`); derived
#: again from the samples on read, so a file's copies are only checked
DERIVED_TIMING_FIGURES = ("mean_ms", "median_ms", "min_ms", "spread", "host_mean_ms", "host_median_ms")


class Timing(ClosedModel):
    """Latency of one solution on one case: per-trial medians, their mean, and the raw samples.

    The runner builds one with ``model_construct`` from whatever samples a worker sent, before the
    judge refuses impossible ones (validation would raise there, mid-run); a results file's is
    validated on load."""

    timer: str
    samples_ms: Annotated[list[Annotated[list[Measure], Field(min_length=1)]], Field(min_length=1)]
    #: per trial, SM/memory clocks read after warm-up and after the timed calls
    clocks: list[dict[str, dict[str, Any] | None]] = Field(default_factory=list)
    #: per trial, the host's wall time of the same timed calls: from just before each call to just after the
    #: device synchronisation that ends it (launch overhead included; the flush and preparation not)
    host_samples_ms: list[list[Measure]] = Field(default_factory=list)
    #: why this run did not time with CUPTI (``--timer auto`` fell back to CUDA events); None when it did not fall back
    timer_fallback: str | None = None
    #: per trial (CUPTI only), each GPU activity's median ms per timed call, by name: a kernel's, ``[memcpy]``,
    #: ``[memset]``, ``[other]`` (the names past the 24 busiest); a diagnostic beside the latency, which is the call's
    #: first start to last end (so kernels that overlap add up to more than it, and gaps to less)
    kernel_ms: list[dict[Annotated[str, Field(max_length=200)], Measure]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _derived_figures_checked_and_dropped(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        derived = {k: data[k] for k in (*DERIVED_TIMING_FIGURES, "trial_medians_ms") if k in data}
        if derived:
            _DerivedFigures.model_validate(derived)  # a bad copy is refused by name, as any field
        return {k: v for k, v in data.items() if k not in derived and k != "kernels_mean_ms"}

    @model_serializer(mode="plain")
    def _written(self) -> dict[str, Any]:
        """The derived figures first, for a reader of the file, then the samples they come from."""
        return {
            "timer": self.timer,
            "mean_ms": self.mean_ms,
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "spread": self.spread,
            "trial_medians_ms": self.trial_medians_ms,
            "samples_ms": self.samples_ms,
            "clocks": self.clocks,
            **({"timer_fallback": self.timer_fallback} if self.timer_fallback else {}),
            **(
                {"host_mean_ms": self.host_mean_ms, "host_median_ms": self.host_median_ms, "host_samples_ms": self.host_samples_ms}
                if self.host_samples_ms
                else {}
            ),
            **({"kernels_mean_ms": self.kernels_mean_ms, "kernel_ms": self.kernel_ms} if self.kernel_ms else {}),
        }

    @property
    def kernels_mean_ms(self) -> dict[str, float]:
        """Each GPU activity's ms per call, the mean over trials of their medians (0 in a trial that did not run
        it), busiest first."""
        names = {name for trial in self.kernel_ms for name in trial}
        means = {name: statistics.fmean(trial.get(name, 0.0) for trial in self.kernel_ms) for name in names}
        return dict(sorted(means.items(), key=lambda item: -item[1]))

    @property
    def host_mean_ms(self) -> float:
        """The host wall time per call, by the harness's statistic (mean of the trial medians)."""
        return harness_latency_ms(self.host_samples_ms)

    @property
    def host_median_ms(self) -> float:
        return statistics.median([x for s in self.host_samples_ms for x in s])

    @property
    def trial_medians_ms(self) -> list[float]:
        return trial_medians_ms(self.samples_ms)

    @property
    def mean_ms(self) -> float:
        """The reported latency: the harness's statistic (timing.base.harness_latency_ms)."""
        return harness_latency_ms(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(min(s) for s in self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median([x for s in self.samples_ms for x in s])

    @property
    def spread(self) -> float:
        """(max - min) / mean of the trial medians: how much the trials disagree."""
        medians = self.trial_medians_ms
        return (max(medians) - min(medians)) / self.mean_ms if self.mean_ms > 0 else 0.0

    def min_sm_clock_mhz(self) -> int | None:
        readings = [reading["sm_mhz"] for c in self.clocks for k in ("after_warmup", "after_timing") if (reading := c.get(k))]
        return min(readings) if readings else None


class _DerivedFigures(ClosedModel):
    """The derived figures a results file repeats next to a timing's samples (checked, then derived again)."""

    mean_ms: Measure | None = None
    median_ms: Measure | None = None
    min_ms: Measure | None = None
    spread: Measure | None = None
    trial_medians_ms: list[Measure] | None = None
    host_mean_ms: Measure | None = None
    host_median_ms: Measure | None = None


class CaseRecord(ClosedModel):
    """One solution on one case: built field by field during a run (``model_construct``, then
    assignments), validated when a results file is read."""

    case: Name
    solution: Name
    axes: dict[str, int]
    # by value in a file ("PASSED"); lax so that the value converts to the enum
    status: Annotated[Status, Field(strict=False)]
    message: str = ""
    max_abs_error: float | None = None  # NaN or inf where the output held them
    max_rel_error: float | None = None
    seeds: dict[str, Any] = Field(default_factory=dict)
    timing: Timing | None = None
    speedup: Measure | None = None
    #: the solution ``peer_speedup`` is measured against (the fastest peer that passed this case in
    #: the same run, or the run's ``--speedup-over``); None when no such latency exists (or in files
    #: written before peer speedups)
    peer: Name | None = None
    #: that solution's latency / this one's, when this record passed and was timed
    peer_speedup: Measure | None = None
    wall_s: Measure = 0.0
    #: where the harness spent the wall time of this record (worker and checker phases)
    phases_s: dict[str, Measure] = Field(default_factory=dict)
    #: the index of the device it ran on among the run's devices (``environment.gpus``); None on a one-device run
    gpu: Annotated[int, Field(ge=0)] | None = None
    #: where the timed record sits on the device's roofline (dsa_bench.results.roofline); None when untimed
    #: or when the definition declares neither minimum bytes nor FLOPs
    roofline: Roofline | None = None

    @field_serializer("status")
    def _status_value(self, status: Status) -> str:
        return status.value

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.roofline is None:
            del data["roofline"]  # files of runs that place no record keep their shape
        return data

    @classmethod
    def new(cls, **fields: Any) -> CaseRecord:
        """A record as a run fills it: not validated (its figures are checked by the judge)."""
        return cls.model_construct(**fields)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def failed(self) -> bool:
        """Neither passed nor skipped (a solution that cannot run here is not a failure)."""
        return self.status not in (Status.PASSED, Status.SKIPPED)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def check_results_path(path: Path, inputs: Iterable[Path], input_folders: Iterable[Path]) -> None:
    """Refuse a ``--save`` path unless it is new or an earlier results file: never an input of
    the run, a path inside an input folder (a solution, a dataset), or a file of another kind."""
    check_output_path(path, "--save", "dsa-bench results", lambda p: has_json_format(p, RESULTS_FORMAT), inputs, input_folders)


#: the longest a finished record waits in memory before the results file is rewritten (a harness
#: killed by SIGKILL loses at most this much; every other stop writes everything first)
WRITE_INTERVAL_S = 2.0


class ResultsFile:
    """A results document kept on disk as records arrive: a :class:`ResultsHeader` and the records.

    The whole document is rewritten at most every :data:`WRITE_INTERVAL_S` while records arrive
    (a write per record made long runs quadratic): :meth:`add` writes when the last write is that
    old, and a flusher thread writes what is pending otherwise, so a record never waits on disk
    for a solution that hangs on the next one. :meth:`update`, which ends every run, interrupted
    or not, always writes.

    A resumed run starts from the interrupted run's ``records``; the records of a case in
    ``superseded`` (one the interrupted run left unfinished, run again from its start) stay until
    that case's first new record arrives and then all go, so the file never loses a record it
    will not get back, and never holds one case's records from two sittings once it is done.
    """

    def __init__(
        self, path: Path | None, header: ResultsHeader, records: Iterable[CaseRecord] = (), superseded: Iterable[str] = ()
    ) -> None:
        self.path = path
        self.header = header
        if "created" not in header.model_fields_set:  # a resumed run keeps its first sitting's
            header.created = now_iso()
        header.complete = False
        self.records: list[CaseRecord] = list(records)
        #: each record as written (a record is dumped once, and again only when it changes)
        self._written_records: list[dict[str, Any]] = [r.model_dump() for r in self.records]
        self._superseded = set(superseded)
        self._lock = threading.RLock()
        self._dirty = False
        self._written_at = -math.inf
        self._stopped = threading.Event()
        self._write()
        if path is not None:
            threading.Thread(target=self._flush_pending, name="results-flush", daemon=True).start()

    @property
    def document(self) -> dict[str, Any]:
        """The document as the file holds it."""
        with self._lock:
            return {**self.header.written(), "records": list(self._written_records)}

    def add(self, record: CaseRecord, **fields: Any) -> None:
        """Append a record (and set any header ``fields`` with it)."""
        with self._lock:
            if record.case in self._superseded:
                self._superseded.discard(record.case)
                kept = [i for i, r in enumerate(self.records) if r.case != record.case]
                self.records = [self.records[i] for i in kept]
                self._written_records = [self._written_records[i] for i in kept]
            self.records.append(record)
            self._written_records.append(record.model_dump())
            self._set(fields)
            self._dirty = True
            if time.monotonic() - self._written_at >= WRITE_INTERVAL_S:
                self._write()

    def refresh(self, records: Iterable[CaseRecord]) -> None:
        """Record these (already added) records again, as they are now."""
        latest = {(r.case, r.solution): r for r in records}
        with self._lock:
            for i, kept in enumerate(self.records):
                record = latest.get((kept.case, kept.solution))
                if record is not None:
                    self.records[i] = record
                    self._written_records[i] = record.model_dump()
                    self._dirty = True

    def update(self, **fields: Any) -> None:
        """Set header ``fields`` and write the file."""
        with self._lock:
            self._set(fields)
            self._write()

    def sort_records(self, key: Callable[[CaseRecord], Any]) -> None:
        with self._lock:
            order = sorted(range(len(self.records)), key=lambda i: key(self.records[i]))
            self.records = [self.records[i] for i in order]
            self._written_records = [self._written_records[i] for i in order]
            self._dirty = True

    def stop_flushing(self) -> None:
        """Write what is pending and end the flusher: the caller now owns the document (the run's end)."""
        self._stopped.set()
        with self._lock:
            if self._dirty:
                self._write()

    def _set(self, fields: dict[str, Any]) -> None:
        for name, value in fields.items():
            setattr(self.header, name, value)  # not validated: the run built them

    def _flush_pending(self) -> None:
        while not self._stopped.wait(WRITE_INTERVAL_S):
            with self._lock:
                if self._dirty and not self._stopped.is_set():
                    self._write()

    def _write(self) -> None:
        self._written_at = time.monotonic()
        self._dirty = False
        if self.path is not None:
            write_atomic(self.path, json.dumps(self.document, indent=1, allow_nan=True), "results")


# --------------------------------------------------------------------------- the header


class WorkloadHeader(OpenModel):
    """The header's ``workload``: which workload ran, where it lies, and a digest of its cases."""

    name: Name
    path: str | None = None
    trace: str | None = None
    definition: str = ""
    #: sha256 of the cases as the run read them (:func:`dsa_bench.run.plan.cases_digest`); absent in
    #: files written before runs could be resumed
    cases_sha256: str | None = None
    dataset: str | None = None  # the flashinfer-bench dataset folder it came from


class SolutionHeader(OpenModel):
    path: str | None = None
    content_hash: str | None = None
    packed: str | None = None  # the packed Solution JSON it was run from


class Environment(OpenModel):
    """What produced a run's numbers (dsa_bench.results.environment): the fields dsa-bench reads are
    declared; versions, clocks and the rest are kept as the run recorded them."""

    gpu: str | None = None  # torch's device name; None on a CPU
    device: str | None = None
    dsa_bench: str | None = None
    #: the device's maximum SM clock, as nvidia-smi answered it ("1980")
    max_sm_mhz: str | int | float | None = None
    #: per device of a multi-device or Ray run, its own environment (with its ``index``)
    gpus: list[Environment] | None = None

    def written(self) -> dict[str, Any]:
        """The environment as the file holds it."""
        return self.model_dump(exclude_unset=True)


class RecordedTolerance(OpenModel):
    """The tolerances a run judged with (dsa_bench.definitions.base.Tolerance); None: the definition's own bound."""

    atol: float | None = None
    rtol: float | None = None
    lse_atol: float | None = None
    score_rtol: float | None = None


class RecordedSettings(OpenModel):
    """The header's ``settings``: the workload's, with the command line's overrides. A secret run's
    seed is None until the run ends. Fields a file from an older release lacks read as None."""

    seed: int | None = None
    input_sets: int | None = None
    warmup: int | None = None
    iterations: int | None = None
    trials: int | None = None
    tolerance: RecordedTolerance | None = None
    reference_protocol: str | None = None

    def written(self) -> dict[str, Any]:
        """The settings as the file holds them (the fields set)."""
        return self.model_dump(exclude_unset=True)


class WallBreakdown(ClosedModel):
    """Where a run's wall time went (dsa_bench.run.breakdown): seconds per phase, summed over
    cases and solutions, and per solution the phases charged to it."""

    wall_s: Measure
    sittings: Annotated[int, Field(ge=1)] = 1
    phases_s: dict[str, Measure]
    by_solution: dict[str, dict[str, Measure]] = Field(default_factory=dict)


class ResultsHeader(OpenModel):
    """A results file less its records. Fields are declared in the order they are written; a field
    is written when it was set (read from a file, or given by the run), so files keep their shape.

    Files written before a field existed read with its default; the one default that is inferred
    (the L2 flush of timed files from before there was a choice) is inferred in :meth:`_older_files`.
    """

    format: Literal["dsa-bench-results"] = RESULTS_FORMAT
    version: Literal[1] = RESULTS_VERSION
    created: str | None = None
    workload: WorkloadHeader
    settings: RecordedSettings | None = None
    timer: str | None = None
    #: why the run did not time with CUPTI (``--timer auto`` fell back); absent when it did not fall back
    timer_fallback: str | None = None
    l2_flush: str | None = None
    #: every flush first reset the persisting-L2 carve-out (absent in files written before it did)
    l2_persisting_reset: bool | None = None
    #: how timed calls were launched: "eager" (the solution called from Python each time) or "cuda_graph" (replays of a CUDA
    #: graph the worker captured of the call, run --cuda-graph); None when nothing was timed
    launch: Literal["eager", "cuda_graph"] | None = None
    environment: Environment | None = None
    #: whom each solution's worker ran as (None on a Ray run: the actors report theirs under environment.gpus)
    workers: dict[str, str] | None = None
    solutions: dict[str, SolutionHeader] | None = None
    cases: list[Name] | None = None  # the run's case selection
    #: the run's peers (solutions whose manifest has ``requires``) and its ``--speedup-over`` (None: the fastest peer)
    peers: list[str] | None = None
    speedup_over: str | None = None
    #: a contest run: the seed was drawn from the OS and withheld until the run ended
    secret: bool | None = None
    #: a copy for publishing: records hold case ids and statuses only (redact_document)
    redacted: bool | None = None
    complete: bool = False
    finished: str | None = None
    clock_sagged: list[str] | None = None
    wall_breakdown: WallBreakdown | None = None
    #: per device of a local multi-device run, its own breakdown
    device_breakdowns: list[WallBreakdown] | None = None
    solution_notes: dict[str, str] | None = None
    #: installed versions of the packages each peer solution requires
    solution_packages: dict[str, dict[str, str]] | None = None
    #: the walls each solution's worker stood in (dsa_bench.run.sandbox, dsa_bench.run.guard; docs/trust.md)
    worker_protections: dict[str, list[str]] | None = None
    resumed: list[dict[str, Any]] | None = None  # one entry per later sitting of a resumed run
    merged_from: list[dict[str, Any]] | None = None  # the files `results merge` joined

    @model_validator(mode="before")
    @classmethod
    def _older_files(cls, data: Any) -> Any:
        """Defaults that files from older releases leave to inference: timed records from before
        there was an L2 flush choice flushed "dirty", and those from before ``--cuda-graph`` timed eager calls."""
        if isinstance(data, dict) and data.get("timer") and not data.get("l2_flush"):
            data = {**data, "l2_flush": "dirty"}
        if isinstance(data, dict) and data.get("timer") and not data.get("launch"):
            data = {**data, "launch": "eager"}
        return data

    @classmethod
    def new(cls, **fields: Any) -> ResultsHeader:
        """A header as a run builds it (not validated; its nested parts given as models)."""
        return cls.model_construct(**fields)

    def written(self) -> dict[str, Any]:
        """The fields as the file holds them: the format, then those set, in declaration order, then any a newer release wrote."""
        fields = self.model_dump(exclude_unset=True, exclude={"records", "format", "version"})
        return {"format": self.format, "version": self.version, **fields}

    @property
    def solution_names(self) -> list[str]:
        return list(self.solutions or {})


class ResultsDocument(ResultsHeader):
    """A whole results file, as it is checked on load."""

    records: list[CaseRecord]


# --------------------------------------------------------------------------- publishing with case details redacted

#: what a redacted record keeps: which case, which solution, and how it ended (``axes`` is kept
#: empty so the record still reads as one)
REDACTED_RECORD_FIELDS = ("case", "solution", "status")
#: header fields a redacted document leaves out: a secret run's inputs can be rebuilt from them,
#: or they repeat what the redacted records no longer hold
REDACTED_HEADER_FIELDS = ("solution_notes", "wall_breakdown", "clock_sagged")


def redact_document(document: dict[str, Any]) -> dict[str, Any]:
    """A results document fit to publish after a contest run: the header without the seed, and
    per record the case id, the solution and the status only (no seeds, axes, messages, errors,
    timings or samples). A redacted file cannot be compared, resumed or made a baseline."""
    header = {k: v for k, v in document.items() if k not in ("records", *REDACTED_HEADER_FIELDS)}
    if isinstance(header.get("settings"), dict):
        header["settings"] = {**header["settings"], "seed": None}
    records = [{**{k: r[k] for k in REDACTED_RECORD_FIELDS}, "axes": {}} for r in document["records"]]
    return {**header, "redacted": True, "records": records}


def redacted_path(path: Path) -> Path:
    """Where ``run --redact`` writes the redacted copy of results file ``path``."""
    return path.with_name(f"{path.stem}.redacted{path.suffix or '.json'}")


def write_redacted(document: dict[str, Any], path: Path) -> None:
    write_atomic(path, json.dumps(redact_document(document), indent=1, allow_nan=True), "results")


def refuse_redacted(results: LoadedResults, command: str) -> None:
    if results.header.redacted:
        raise DsaBenchError(
            f"a redacted results file holds no seeds, timings or case details; {command} needs the full one", str(results.path)
        )


def secrecy(secret: bool | None) -> str:
    """How a run's inputs were chosen, from its ``secret`` field: "secret" (contest mode) or "public"."""
    return "secret" if secret else "public"


def refuse_secret_mix(results: LoadedResults, other_secret: bool | None, other_name: str, source: str | None = None) -> None:
    """Refuse to put secret-mode and public results side by side (a comparison, a baseline)."""
    if secrecy(results.header.secret) != secrecy(other_secret):
        raise DsaBenchError(
            f"these are {secrecy(results.header.secret)} results, {other_name} comes from {secrecy(other_secret)} results"
            + (f" ({source})" if source else "")
            + "; secret (run --secret) and public results judge different inputs and are never mixed",
            str(results.path),
        )


def check_format(document: Any, name: str, version: int, kind: str, where: str) -> None:
    """The format and version fields first: a file of another kind gets one plain sentence."""
    if not isinstance(document, dict) or document.get("format") != name:
        raise DsaBenchError(f'not a dsa-bench {kind} file (expected "format": "{name}")', where)
    if document.get("version") != version:
        raise DsaBenchError(f"{kind} format version {document.get('version')!r} is not supported (expected {version})", where)


def refuse_duplicates(cases: list[dict[str, Any]], label: str, where: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    for i, case in enumerate(cases):
        key = (case["case"], case["solution"])
        if key in seen:
            raise DsaBenchError(f"{label}[{i}]: case {key[0]!r} of solution {key[1]!r} is already {label}[{seen[key]}]", where)
        seen[key] = i


@dataclass
class LoadedResults:
    """A results file as written by ``dsa-bench run --save``, checked."""

    path: Path
    header: ResultsHeader
    records: list[CaseRecord]

    @property
    def document(self) -> dict[str, Any]:
        """The document as a file holds it (to write it again: a redacted copy, a merge)."""
        return {**self.header.written(), "records": [r.model_dump() for r in self.records]}

    @property
    def workload(self) -> str:
        return self.header.workload.name

    @property
    def definition(self) -> str:
        return self.header.workload.definition

    @property
    def environment(self) -> Environment:
        return self.header.environment or Environment()

    @property
    def timer(self) -> str | None:
        return self.header.timer

    @property
    def l2_flush(self) -> str | None:
        return self.header.l2_flush

    @property
    def launch(self) -> str | None:
        return self.header.launch

    @property
    def timed(self) -> bool:
        return any(r.timing is not None for r in self.records)


def recorded_l2_flush(block: dict[str, Any]) -> str | None:
    """The L2 flush a baseline block says its timing used; timed blocks from before there was a
    choice flushed "dirty", untimed ones none (a results header infers it in ResultsHeader._older_files)."""
    return block.get("l2_flush") or ("dirty" if block.get("timer") else None)


def launch_mode(cuda_graph: bool) -> str:
    """How a timed run launched its calls, as results record it (``launch``)."""
    return "cuda_graph" if cuda_graph else "eager"


def recorded_launch(block: dict[str, Any]) -> str | None:
    """How a baseline block's timed calls were launched; timed blocks from before ``--cuda-graph``
    launched eagerly, untimed ones not at all (a results header infers it in ResultsHeader._older_files)."""
    return block.get("launch") or ("eager" if block.get("timer") else None)


def load_results(path: Path) -> LoadedResults:
    """Read and check a results file; every problem names the file and the field
    (``records[3].timing.samples_ms[0][2]: expected a finite number, got 'x'``)."""
    where = str(path)
    raw = read_json(path, "results")
    check_format(raw, RESULTS_FORMAT, RESULTS_VERSION, "results", where)
    document = check_document(ResultsDocument, raw, where)
    refuse_duplicates([{"case": r.case, "solution": r.solution} for r in document.records], "records", where)
    return LoadedResults(path, document, document.records)
