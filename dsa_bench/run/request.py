"""What ``dsa-bench run`` was asked: every option declared once, with its type, default, constraint and help.

:class:`RunRequest` is the one declaration of the run's options. The ``run`` command is built from
its fields (``dsa_bench.cli``: a field's flags come from its :class:`Flags`, its help from its
description, its default from the field), and a request is checked when it is made: a bad value
raises the one-line :class:`~dsa_bench.errors.DsaBenchError` naming the option, before anything
is loaded. A field that names a :class:`~dsa_bench.run.runner.RunOptions` field is handed to the
case loop under that name, and one marked :class:`Recorded` is written to the results header, so
adding a run option means a field here and its use where it acts (docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from dsa_bench.errors import DsaBenchError
from dsa_bench.run.isolation import WORKER_USER_MODES

# The checks below import what they need when a request is made: the command line is built from
# this module, and `dsa-bench --help` should not wait for torch.

#: Longest --case-timeout and --compile-timeout, in seconds: a day (longer is a typo, not a plan).
MAX_TIMEOUT_S = 86400.0

#: where a run's cases go: this process's devices, or a Ray cluster's GPUs
EXECUTORS = ("local", "ray")

#: the options that override a workload tolerance (dsa_bench.workloads.TOLERANCES; tests/test_cli_run.py keeps them in step)
TOLERANCE_OPTIONS = ("atol", "rtol", "lse_atol", "score_rtol")


@dataclass(frozen=True)
class Flags:
    """An option's command-line names, when they are not ``--`` and the field's name with dashes."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Recorded:
    """An option the results header records as given, under the field's name (a ResultsHeader field)."""


class RunRequest(BaseModel):
    """What ``dsa-bench run`` was asked, option by option (None: the workload's own setting)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: Annotated[str, Flags(("--workload", "-w"))] = Field(
        description="Workload name (workloads/<name>.yaml) or path to a workload YAML."
    )
    solutions: Annotated[list[str], Flags(("--solution", "-s"))] = Field(
        default_factory=list,
        description="Solution name, folder or packed Solution JSON file (run as flashinfer-bench imports it); repeat for several. "
        "Default: every solution with an entry for the workload's definition.",
    )
    cases: Annotated[list[str], Flags(("--case", "-c"))] = Field(
        default_factory=list, description="Case id or glob pattern; repeat for several. Default: all cases."
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N. Without CUDA the run checks correctness only.")
    timer: str = Field(
        "auto",
        description="auto (CUPTI, else CUDA events with a warning), cupti, cupti_api (also traces API calls and matches kernels by "
        "correlation id) or events.",
    )
    l2_flush: str = Field(
        "clean",
        description="How L2 is emptied before each timed call: clean (write, then read, a buffer of 2 x L2: the call pays for its own "
        "traffic only) or dirty (write only, as a memset flush does: the call also writes back the flush's dirty lines).",
    )
    cuda_graph: bool = Field(
        False,
        description="Time each call as the replay of a CUDA graph the harness captures of it (as serving engines replay a decode "
        "step), not as eager launches: host launch gaps drop out. The solution must not synchronize with the host inside a call. "
        "Off by default: the contest times eager calls.",
    )
    seed: int | None = Field(None, description="Base seed (default: the workload's).")
    #: contest mode: the seed is drawn from the OS and withheld until the run ends (also a workload setting)
    secret: bool = Field(
        False,
        description="Contest mode: draw the seed from the OS at run time, print it nowhere and record it in the results only when the "
        "run ends (a workload's `secret: true` setting does the same).",
    )
    #: also write a copy of the results with case details redacted (ids and statuses only)
    redact: bool = Field(
        False,
        description="Also write <results>.redacted.json: case ids and statuses only, no seeds, axes, messages or timings, for "
        "publishing a secret run.",
    )
    input_sets: int | None = Field(None, description="Random input sets per case (and rotating sets per timing trial).")
    warmup: int | None = Field(None, description="Warm-up calls per trial.")
    iterations: int | None = Field(None, description="Timed calls per trial.")
    trials: int | None = Field(None, description="Timing trials, each with fresh inputs.")
    reference_protocol: str | None = Field(
        None,
        description="How the reference is timed: light (2 warm-up, 10 timed calls, 1 trial; the default) or full (the solutions' "
        "protocol).",
    )
    case_timeout: float = Field(600.0, description="Seconds a solution may take on one case before it is TIMEOUT.")
    compile_timeout: float = Field(900.0, description="Seconds a solution may take to import/build.")
    save: Path | None = Field(None, description="Results JSON path (default: results/<workload>-<time>.json).")
    no_save: bool = Field(False, description="Do not write a results file.")
    dataset: Path | None = Field(
        None,
        description="A flashinfer-bench dataset folder; --workload then names one of its definitions or a workloads .jsonl file.",
    )
    worker_user: str = Field(
        "auto",
        description="Whom solution workers run as: auto (a dedicated unprivileged id per worker when the harness is root, else the "
        "harness's user) or harness (always the harness's user).",
    )
    gpus: str | None = Field(
        None,
        description="Devices to spread the cases over: a count or 'all' (default: 1; every GPU of the cluster with --executor ray). "
        "Each case (reference and every solution) runs on one device; without CUDA, N parallel correctness-only workers.",
    )
    executor: str = Field(
        "local",
        description="local (this machine's devices) or ray (one actor per GPU of a Ray cluster; needs pip install 'dsa-bench\\[ray]').",
    )
    ray_address: str | None = Field(None, description="The Ray cluster to join (default: start a local one).")
    #: the dataset's own solutions (``solutions/**/*.json``) to run: their names, or "all"
    dataset_solutions: list[str] = Field(
        default_factory=list,
        description="With --dataset: run the dataset's own solutions (solutions/**/*.json) of the definition: 'all', or a name; "
        "repeat for several.",
    )
    #: tolerances that replace the workload's for this run (None: the workload's)
    atol: float | None = Field(None, description="Absolute tolerance of value outputs (default: the workload's).")
    rtol: float | None = Field(None, description="Relative tolerance of value outputs (default: the workload's).")
    lse_atol: float | None = Field(None, description="Absolute tolerance of log-sum-exp outputs (default: the workload's).")
    score_rtol: float | None = Field(
        None,
        description="Top-k tie tolerance as a fixed fraction of the row's largest score (default: the workload's; none: the "
        "definition's derived bound).",
    )
    resume: Path | None = Field(
        None,
        description="Continue the interrupted run of this results file: same workload, options and solutions (else a refusal naming "
        "what differs); finished cases are kept, the rest run, and the union is written back to the file.",
    )
    # how the run is shown (dsa_bench.results.tables.RunPrinter); the plan does not read them
    quiet: Annotated[bool, Flags(("--quiet", "-q"))] = Field(False, description="Print only the summary, the results path and errors.")
    json_lines: bool = Field(
        False,
        description='Write one JSON object per finished record (the results file\'s fields) and then {"summary": ...} to stdout, and '
        "nothing else; human text goes to stderr.",
    )
    breakdown: bool = Field(
        False,
        description="Print where the run's wall time went, phase by phase (the results file always records it as wall_breakdown).",
    )
    speedup_over: Annotated[str | None, Recorded()] = Field(
        None,
        description="Solution of this run that the second speedup column is measured against (default: the fastest peer, a solution "
        "with `requires`, that passed each case).",
    )

    @field_validator("l2_flush")
    @classmethod
    def _l2_flush(cls, value: str) -> str:
        from dsa_bench.timing.flush import check_l2_flush

        return check_l2_flush(value)

    @field_validator("seed", "input_sets", "warmup", "iterations", "trials", *TOLERANCE_OPTIONS)
    @classmethod
    def _setting(cls, value: float | None, info: ValidationInfo) -> float | None:
        from dsa_bench.workloads import setting_problem

        name = info.field_name or ""
        problem = None if value is None else setting_problem(name, value)
        if problem is not None:
            raise DsaBenchError(f"{flag(name)} {value}: {problem}")
        return value

    @field_validator("case_timeout", "compile_timeout")
    @classmethod
    def _timeout(cls, seconds: float, info: ValidationInfo) -> float:
        if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
            problem = f"expected a finite number of seconds > 0 and <= {MAX_TIMEOUT_S:g}"
            raise DsaBenchError(f"{flag(info.field_name or '')} {seconds:g}: {problem}")
        return seconds

    @field_validator("worker_user", "executor", "reference_protocol")
    @classmethod
    def _choice(cls, value: str | None, info: ValidationInfo) -> str | None:
        from dsa_bench.workloads import REFERENCE_PROTOCOLS

        name = info.field_name or ""
        choices = {"worker_user": WORKER_USER_MODES, "executor": EXECUTORS, "reference_protocol": REFERENCE_PROTOCOLS}[name]
        if value is not None and value not in choices:
            raise DsaBenchError(f"{flag(name)} {value!r}: expected one of {', '.join(choices)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunRequest:
        """Options that contradict each other are refused before anything is loaded."""
        if self.dataset_solutions and self.dataset is None:
            raise DsaBenchError("--dataset-solutions names solutions of a flashinfer-bench dataset; give the dataset with --dataset")
        if self.save is not None and self.no_save:
            raise DsaBenchError(f"--save {self.save} and --no-save contradict each other; give one of them")
        if self.secret and self.seed is not None:
            raise DsaBenchError("--secret draws the seed from the OS at run time; leave out --seed")
        if self.redact and self.no_save:
            raise DsaBenchError("--redact writes a redacted copy beside the results file; leave out --no-save")
        if self.resume is not None and (self.save is not None or self.no_save):
            raise DsaBenchError("--resume writes the completed run back to its results file; leave out --save and --no-save")
        return self

    def tolerance_overrides(self) -> dict[str, float]:
        return {key: getattr(self, key) for key in TOLERANCE_OPTIONS if getattr(self, key) is not None}


def recorded_options(request: RunRequest) -> dict[str, Any]:
    """The options the results header records as given (fields marked :class:`Recorded`)."""
    fields = RunRequest.model_fields.items()
    return {name: getattr(request, name) for name, info in fields if any(isinstance(m, Recorded) for m in info.metadata)}


def flags(name: str) -> tuple[str, ...]:
    """The command-line names of RunRequest field ``name``, the long one first."""
    declared = next((m for m in RunRequest.model_fields[name].metadata if isinstance(m, Flags)), None)
    return declared.names if declared is not None else (f"--{name.replace('_', '-')}",)


def flag(name: str) -> str:
    """The long command-line name of RunRequest field ``name`` (for messages)."""
    return flags(name)[0]


def default(name: str) -> Any:
    """RunRequest field ``name``'s default: for the settings of runs that are not made from a request (profile, tools)."""
    return RunRequest.model_fields[name].get_default(call_default_factory=True)
