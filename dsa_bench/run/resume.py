"""Resuming an interrupted run (``run --resume RESULTS.json``).

The plan is checked against the interrupted run's results file (the workload and its cases'
content, the case selection, settings, timer, L2 flush, GPU, the solutions and their content
hashes: :func:`resume_problem`); only the cases it left unfinished are run, and the union is
written back to that file (docs/running.md).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_bench.errors import DsaBenchError
from dsa_bench.results.records import Environment, LoadedResults, RecordedSettings, ResultsHeader, load_results, now_iso


@dataclass(frozen=True)
class Resumed:
    """What an interrupted run left: its results, and the cases it finished (every solution of
    the run has a record there); the other cases are run from their start."""

    previous: LoadedResults
    finished: frozenset[str]
    sitting_header: ResultsHeader  # the header this sitting would write (its environment and workers are noted)

    @property
    def superseded(self) -> set[str]:
        """Unfinished cases that have records: replaced when the case runs again."""
        return {r.case for r in self.previous.records} - self.finished

    @property
    def records_kept(self) -> int:
        return sum(r.case in self.finished for r in self.previous.records)

    def header(self) -> ResultsHeader:
        """The interrupted run's header, with this sitting noted under ``resumed``."""
        kept = {k: v for k, v in self.previous.header.written().items() if k not in ("complete", "finished", "clock_sagged")}
        sitting = {"started": now_iso(), "records_kept": self.records_kept,
                   "environment": _written(self.sitting_header.environment), "workers": self.sitting_header.workers}  # fmt: skip
        return ResultsHeader.model_validate({**kept, "resumed": [*(self.previous.header.resumed or []), sitting]})


def secret_seed(resume: Path | None) -> int:
    """A contest run's seed: 63 bits from the OS (``secrets``), or the one an interrupted secret
    run recorded when it ended, to resume it with the same inputs."""
    if resume is None:
        return secrets.randbits(63)
    header = load_results(resume).header
    if header.redacted:
        raise DsaBenchError("cannot resume a redacted results file (it holds no seeds or case details); resume the full one", str(resume))
    if not header.secret:
        raise DsaBenchError("--secret cannot resume a public run; resume it without --secret", str(resume))
    seed = header.settings.seed if header.settings is not None else None
    if not isinstance(seed, int):
        raise DsaBenchError("this secret run never recorded its seed (it was killed before it ended); start a new run", str(resume))
    return seed


def _first_difference(theirs: Any, ours: Any, name: str) -> tuple[str, Any, Any] | None:
    """The first field (dotted name) in which two header values differ, with both values."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for key in [*ours, *(k for k in theirs if k not in ours)]:
            found = _first_difference(theirs.get(key), ours.get(key), f"{name}.{key}")
            if found is not None:
                return found
        return None
    return None if theirs == ours else (name, theirs, ours)


def _written(part: RecordedSettings | Environment | None) -> dict[str, Any] | None:
    return None if part is None else part.written()


def resume_problem(previous: ResultsHeader, now: ResultsHeader) -> str | None:
    """Why the run described by header ``now`` cannot continue the one whose results header is
    ``previous``, or None: the first field that differs, with both values."""
    if not previous.workload.cases_sha256:
        return "it records no workload.cases_sha256 (it was written before dsa-bench could resume runs); start a new run"
    theirs_solutions, our_solutions = previous.solutions or {}, now.solutions or {}
    if set(theirs_solutions) != set(our_solutions):
        return (f"the solutions differ: {', '.join(sorted(theirs_solutions)) or '(none)'} there, {', '.join(sorted(our_solutions))} "
                f"in this run; give the same --solution options")  # fmt: skip
    for name, info in our_solutions.items():
        if theirs_solutions[name].content_hash != info.content_hash:
            return (f"solution {name!r} has changed since: content hash {theirs_solutions[name].content_hash} there, "
                    f"{info.content_hash} now ({info.path}); start a new run")  # fmt: skip
    workload_fields = ("name", "definition", "cases_sha256", "dataset")
    checked = [
        ("secret", bool(previous.secret), bool(now.secret)),
        ("workload", {k: getattr(previous.workload, k) for k in workload_fields}, {k: getattr(now.workload, k) for k in workload_fields}),
        ("settings", _written(previous.settings), _written(now.settings)),
        ("timer", previous.timer, now.timer),
        ("l2_flush", previous.l2_flush, now.l2_flush),
        ("launch", previous.launch, now.launch),  # run --cuda-graph times graph replays, not eager calls
        ("environment.gpu", (previous.environment or Environment()).gpu, (now.environment or Environment()).gpu),
    ]
    for name, theirs, ours in checked:
        found = _first_difference(theirs, ours, name)
        if found is not None:
            field_name, a, b = found
            return f"{field_name} is {a!r} there and {b!r} in this run; give the interrupted run's options"
    theirs_cases, our_cases = previous.cases or [], now.cases or []
    if set(theirs_cases) != set(our_cases):
        differ = sorted(set(theirs_cases) ^ set(our_cases))
        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        return (f"the case selection differs: {len(theirs_cases)} cases there, {len(our_cases)} in this run (in one only: {shown}); "
                f"give the same --case patterns")  # fmt: skip
    return None


def resume_state(path: Path, now: ResultsHeader) -> Resumed:
    """The interrupted run at ``path``, checked against the header ``now`` of the run that would
    continue it: a refusal names the first difference."""
    previous = load_results(path)
    if previous.header.redacted:
        raise DsaBenchError("cannot resume a redacted results file (it holds no seeds or case details); resume the full one", str(path))
    problem = resume_problem(previous.header, now)
    if problem is not None:
        raise DsaBenchError(f"cannot resume this run: {problem}", str(path))
    names, known = set(now.solution_names), set(now.cases or [])
    for index, record in enumerate(previous.records):
        if record.case not in known or record.solution not in names:
            what = f"case {record.case!r}" if record.case not in known else f"solution {record.solution!r}"
            raise DsaBenchError(f"cannot resume this run: records[{index}] holds {what}, which this run does not have; "
                                f"the file does not come from this workload's run", str(path))  # fmt: skip
    done: dict[str, set[str]] = {}
    for record in previous.records:
        done.setdefault(record.case, set()).add(record.solution)
    return Resumed(previous, frozenset(case for case, solutions in done.items() if names <= solutions), now)
