"""Result records, the versioned results file (its model), writing it as records arrive and reading it back.

The results file is one JSON document rewritten atomically after every record, so an
interrupted run keeps everything it finished and the file is always valid JSON.

The records a run fills (:class:`Timing`, :class:`CaseRecord`) are dataclasses with their own
``to_json``/``from_json``, and the file is checked by separate models (:class:`ResultsModel`,
:class:`RecordModel`, :class:`TimingModel`): the runner builds a record field by field, and
builds a Timing from whatever samples a worker sent before the judge refuses impossible ones
(a model would raise there, mid-run); and ``to_json`` writes the figures derived from the
samples (mean, median, ...) ahead of the samples, where a model's computed fields would come
after them. ``test_models_cover_every_recorded_field`` keeps records and models in step.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_document, check_output_path, has_json_format, read_json, write_atomic
from dsa_bench.models import ClosedModel, Name, OpenModel
from dsa_bench.results.roofline import Roofline, RooflineModel
from dsa_bench.timing.base import harness_latency_ms, trial_medians_ms

RESULTS_FORMAT = "dsa-bench-results"


RESULTS_VERSION = 1


@dataclass
class Timing:
    """Latency of one solution on one case: per-trial medians, their mean, and the raw samples."""

    timer: str
    samples_ms: list[list[float]]
    #: per trial, SM/memory clocks read after warm-up and after the timed calls
    clocks: list[dict[str, Any]] = field(default_factory=list)
    #: per trial, the host's wall time of the same timed calls: from just before each call to just after the
    #: device synchronisation that ends it (launch overhead included; the flush and preparation not)
    host_samples_ms: list[list[float]] = field(default_factory=list)
    #: why this run did not time with CUPTI (``--timer auto`` fell back to CUDA events); None when it did not fall back
    timer_fallback: str | None = None

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

    def to_json(self) -> dict[str, Any]:
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
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(
            timer=data["timer"],
            samples_ms=data["samples_ms"],
            clocks=data.get("clocks", []),
            host_samples_ms=data.get("host_samples_ms", []),
            timer_fallback=data.get("timer_fallback"),
        )

    def min_sm_clock_mhz(self) -> int | None:
        readings = [c[k]["sm_mhz"] for c in self.clocks for k in ("after_warmup", "after_timing") if c.get(k)]
        return min(readings) if readings else None


@dataclass
class CaseRecord:
    """One solution on one case."""

    case: str
    solution: str
    axes: dict[str, int]
    status: Status
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    seeds: dict[str, Any] = field(default_factory=dict)
    timing: Timing | None = None
    speedup: float | None = None
    #: the solution ``peer_speedup`` is measured against (the fastest peer that passed this case in
    #: the same run, or the run's ``--speedup-over``); None when no such latency exists
    peer: str | None = None
    #: that solution's latency / this one's, when this record passed and was timed
    peer_speedup: float | None = None
    wall_s: float = 0.0
    #: where the harness spent the wall time of this record (worker and checker phases)
    phases_s: dict[str, float] = field(default_factory=dict)
    #: the index of the device it ran on among the run's devices (``environment.gpus``); None on a one-device run
    gpu: int | None = None
    #: where the timed record sits on the device's roofline (dsa_bench.results.roofline); None when untimed
    #: or when the definition declares neither minimum bytes nor FLOPs
    roofline: Roofline | None = None

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def failed(self) -> bool:
        """Neither passed nor skipped (a solution that cannot run here is not a failure)."""
        return self.status not in (Status.PASSED, Status.SKIPPED)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["timing"] = self.timing.to_json() if self.timing else None
        if self.roofline is None:
            del data["roofline"]  # files of runs that place no record keep their shape
        else:
            data["roofline"] = self.roofline.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseRecord:
        fields = dict(data)
        fields["status"] = Status(fields["status"])
        fields["timing"] = Timing.from_json(fields["timing"]) if fields.get("timing") else None
        fields["roofline"] = Roofline.from_json(fields["roofline"]) if fields.get("roofline") else None
        return cls(**fields)


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
    """A results document kept on disk as records arrive.

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
        self, path: Path | None, header: dict[str, Any], records: Iterable[dict[str, Any]] = (), superseded: Iterable[str] = ()
    ) -> None:
        self.path = path
        self.document: dict[str, Any] = {
            "format": RESULTS_FORMAT,
            "version": RESULTS_VERSION,
            "created": now_iso(),
            **header,
            "records": list(records),
            "complete": False,
        }
        self._superseded = set(superseded)
        self._lock = threading.RLock()
        self._dirty = False
        self._written_at = -math.inf
        self._stopped = threading.Event()
        self._write()
        if path is not None:
            threading.Thread(target=self._flush_pending, name="results-flush", daemon=True).start()

    def add(self, record: CaseRecord, **fields: Any) -> None:
        """Append a record (and set any header ``fields`` with it)."""
        with self._lock:
            if record.case in self._superseded:
                self._superseded.discard(record.case)
                self.document["records"] = [r for r in self.document["records"] if r["case"] != record.case]
            self.document["records"].append(record.to_json())
            self.document.update(fields)
            self._dirty = True
            if time.monotonic() - self._written_at >= WRITE_INTERVAL_S:
                self._write()

    def refresh(self, records: Iterable[CaseRecord]) -> None:
        """Record these (already added) records again, as they are now."""
        latest = {(r.case, r.solution): r.to_json() for r in records}
        with self._lock:
            kept = self.document["records"]
            for i, data in enumerate(kept):
                key = (data["case"], data["solution"])
                if key in latest:
                    kept[i] = latest[key]
                    self._dirty = True

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.document.update(fields)
            self._write()

    def stop_flushing(self) -> None:
        """Write what is pending and end the flusher: the caller now owns the document (the run's end)."""
        self._stopped.set()
        with self._lock:
            if self._dirty:
                self._write()

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


# --------------------------------------------------------------------------- reading results files


if TYPE_CHECKING:  # a Literal built from the enum at run time, which type checkers cannot follow
    StatusName = str
else:
    StatusName = Literal[tuple(s.value for s in Status)]


#: a latency, speedup, spread or duration: finite and not negative
Measure = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class TimingModel(ClosedModel):
    timer: str
    samples_ms: Annotated[list[Annotated[list[Measure], Field(min_length=1)]], Field(min_length=1)]
    clocks: list[dict[str, dict[str, Any] | None]] = []
    # written as figures derived from samples_ms; the readers derive them again
    mean_ms: Measure | None = None
    median_ms: Measure | None = None
    min_ms: Measure | None = None
    spread: Measure | None = None
    trial_medians_ms: list[Measure] | None = None
    timer_fallback: str | None = None
    host_samples_ms: list[list[Measure]] = []
    host_mean_ms: Measure | None = None
    host_median_ms: Measure | None = None


class RecordModel(ClosedModel):
    case: Name
    solution: Name
    axes: dict[str, int]
    status: StatusName
    message: str = ""
    max_abs_error: float | None = None  # NaN or inf where the output held them
    max_rel_error: float | None = None
    seeds: dict[str, Any] = {}
    timing: TimingModel | None = None
    speedup: Measure | None = None
    peer: Name | None = None  # absent in files written before peer speedups
    peer_speedup: Measure | None = None
    wall_s: Measure = 0.0
    phases_s: dict[str, Measure] = {}
    gpu: Annotated[int, Field(ge=0)] | None = None
    roofline: RooflineModel | None = None


class WorkloadModel(OpenModel):
    name: Name
    definition: str = ""
    path: str | None = None
    trace: str | None = None


class SolutionMetaModel(OpenModel):
    path: str | None = None
    content_hash: str | None = None


class WallBreakdownModel(ClosedModel):
    """Where a run's wall time went (dsa_bench.run.breakdown): seconds per phase, summed over
    cases and solutions, and per solution the phases charged to it."""

    wall_s: Measure
    sittings: Annotated[int, Field(ge=1)] = 1
    phases_s: dict[str, Measure]
    by_solution: dict[str, dict[str, Measure]] = {}


class ResultsModel(OpenModel):
    format: Literal["dsa-bench-results"]
    version: Literal[1]
    created: str | None = None
    workload: WorkloadModel
    settings: dict[str, Any] | None = None
    timer: str | None = None
    l2_flush: str | None = None
    #: every flush first reset the persisting-L2 carve-out (absent in files written before it did)
    l2_persisting_reset: bool | None = None
    environment: dict[str, Any] | None = None
    solutions: dict[str, SolutionMetaModel] | None = None
    cases: list[Name] | None = None  # the run's case selection
    solution_notes: dict[str, str] | None = None
    #: installed versions of the packages each peer solution requires
    solution_packages: dict[str, dict[str, str]] | None = None
    #: the walls each solution's worker stood in (dsa_bench.run.sandbox, dsa_bench.run.guard; docs/trust.md)
    worker_protections: dict[str, list[str]] | None = None
    #: the run's peers (solutions whose manifest has ``requires``) and its ``--speedup-over`` (None: the fastest peer)
    peers: list[str] | None = None
    speedup_over: str | None = None
    records: list[RecordModel]
    complete: bool = False
    finished: str | None = None
    clock_sagged: list[str] | None = None
    wall_breakdown: WallBreakdownModel | None = None
    resumed: list[dict[str, Any]] | None = None  # one entry per later sitting of a resumed run
    #: a contest run: the seed was drawn from the OS and withheld until the run ended
    secret: bool | None = None
    #: a copy for publishing: records hold case ids and statuses only (redact_document)
    redacted: bool | None = None


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
    if results.document.get("redacted"):
        raise DsaBenchError(
            f"a redacted results file holds no seeds, timings or case details; {command} needs the full one", str(results.path)
        )


def secrecy(document: dict[str, Any]) -> str:
    """How a results document or baseline block's inputs were chosen: "secret" (contest mode) or "public"."""
    return "secret" if document.get("secret") else "public"


def refuse_secret_mix(results: LoadedResults, other: dict[str, Any], other_name: str) -> None:
    """Refuse to put secret-mode and public results side by side (a comparison, a baseline)."""
    if secrecy(results.document) != secrecy(other):
        source = other.get("results_file")
        raise DsaBenchError(
            f"these are {secrecy(results.document)} results, {other_name} comes from {secrecy(other)} results"
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
    """A results file as written by ``dsa-bench run --save``."""

    path: Path
    document: dict[str, Any]
    records: list[CaseRecord]

    @property
    def workload(self) -> str:
        return self.document["workload"]["name"]

    @property
    def definition(self) -> str:
        return self.document["workload"].get("definition", "")

    @property
    def environment(self) -> dict[str, Any]:
        return self.document.get("environment") or {}

    @property
    def timer(self) -> str | None:
        return self.document.get("timer")

    @property
    def l2_flush(self) -> str | None:
        return recorded_l2_flush(self.document)

    @property
    def timed(self) -> bool:
        return any(r.timing is not None for r in self.records)


def recorded_l2_flush(record: dict[str, Any]) -> str | None:
    """The L2 flush a results header or baseline block says its timing used; timed records from
    before there was a choice flushed "dirty", untimed ones none."""
    return record.get("l2_flush") or ("dirty" if record.get("timer") else None)


def load_results(path: Path) -> LoadedResults:
    """Read and check a results file; every problem names the file and the field
    (``records[3].timing.samples_ms[0][2]: expected a finite number, got 'x'``)."""
    where = str(path)
    document = read_json(path, "results")
    check_format(document, RESULTS_FORMAT, RESULTS_VERSION, "results", where)
    check_document(ResultsModel, document, where)
    refuse_duplicates(document["records"], "records", where)
    return LoadedResults(path, document, [CaseRecord.from_json(item) for item in document["records"]])
