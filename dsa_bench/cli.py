"""The ``dsa-bench`` command line: thin commands over the library."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import typer
import typer.core

from dsa_bench.errors import DsaBenchError

EXIT_FAILED_CASES = 1
EXIT_BAD_INPUT = 2


class _Commands(typer.core.TyperGroup):
    """Runs a command; its DsaBenchError becomes one message and exit 2, never a traceback.

    Mapped here rather than only in :func:`main`, so an in-process invocation (``CliRunner``
    in the tests) sees exactly what a user sees.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _plain_metavars(self)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DsaBenchError as exc:
            _err(f"error: {exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None


_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "Path": "PATH"}


def _type_label(param) -> str:
    """TEXT, INTEGER, FLOAT or PATH for an option's value: from typer's own parameter classes (newer typer
    releases) or from click's types (older ones, such as the GPU machine's)."""
    if hasattr(param, "bare_type"):
        label = param.bare_type().removeprefix("list[").removesuffix("]")
        return _METAVARS.get(label, label.upper())
    return str(getattr(getattr(param, "type", None), "name", "value")).upper()


def _plain_metavars(command) -> None:
    """Help shows a flag bare (``--no-save``, not typer's ``--no-save <bool>``), an option's value
    as TEXT, INTEGER, FLOAT or PATH, and an argument by its name alone, for every command and
    subcommand. (Typer builds the commands; their parameters are adjusted here, in one place.)"""
    for param in command.params:
        if param.param_type_name == "argument":
            param.metavar = param.metavar or (param.name or "value").upper()
            param.display_type_rich = lambda ctx: None  # the name column already says it
        elif param.metavar is None and (getattr(param, "is_flag", False) or getattr(param, "count", False)):
            param.metavar = ""
        elif param.metavar is None:
            param.metavar = _type_label(param)
    make_help_option = command.get_help_option

    def bare_help_option(ctx):
        option = make_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = bare_help_option
    for sub in (getattr(command, "commands", None) or {}).values():
        _plain_metavars(sub)


app = typer.Typer(
    cls=_Commands,
    help="dsa-bench: run, check and time DeepSeek Sparse Attention kernels on trace-defined workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from dsa_bench import __version__

        typer.echo(f"dsa-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print dsa-bench's version and exit."),
) -> None:
    """dsa-bench: run, check and time DeepSeek Sparse Attention kernels on trace-defined workloads."""


def _err(message: str) -> None:
    with contextlib.suppress(BrokenPipeError):  # stderr piped to a reader that is gone (Ctrl-C under `2>&1 | tee`)
        typer.secho(message, fg=typer.colors.RED, err=True)


def _warn(message: str) -> None:
    with contextlib.suppress(BrokenPipeError):
        typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)


def _say_err(text: str) -> None:
    with contextlib.suppress(BrokenPipeError):
        typer.echo(text, err=True)


class _Stdout:
    """stdout that outlives its reader: Ctrl-C under `| tee log` ends tee too, and the run's
    summary, kept-records line and resume command must still reach the terminal. After the first
    broken pipe everything goes to stderr (and stdout to /dev/null, so the exit's flush is quiet)."""

    def __init__(self) -> None:
        self.gone = False

    def __call__(self, text: str) -> None:
        if not self.gone:
            try:
                typer.echo(text)
                return
            except BrokenPipeError:
                self.gone = True
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(BrokenPipeError):
            typer.echo(text, err=True)


def _resume_command(ctx: typer.Context, save_path: Path) -> str:
    """The command that finishes an interrupted run: its own options as given, with --resume."""
    import shlex

    words = ["dsa-bench", "run"]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if param.name in ("save", "no_save", "resume") or source is None or source.name != "COMMANDLINE":
            continue
        flag = max(param.opts, key=len)
        value = ctx.params[param.name or ""]
        if getattr(param, "is_flag", False):
            words += [flag] if value else []
        else:
            words += [w for v in (value if isinstance(value, (list, tuple)) else [value]) for w in (flag, str(v))]
    return shlex.join([*words, "--resume", str(save_path)])


@app.command()
def run(
    ctx: typer.Context,
    workload: str = typer.Option(..., "--workload", "-w", help="Workload name (workloads/<name>.yaml) or path to a workload YAML."),
    solution: list[str] = typer.Option([], "--solution", "-s", help="Solution name, folder or packed Solution JSON file (run as "
                                                                    "flashinfer-bench imports it); repeat for several. Default: every "
                                                                    "solution with an entry for the workload's definition."),
    case: list[str] = typer.Option([], "--case", "-c", help="Case id or glob pattern; repeat for several. Default: all cases."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N. Without CUDA the run checks correctness only."),
    timer: str = typer.Option("auto", help="auto (CUPTI, else CUDA events with a warning), cupti, cupti_api (also traces API calls and "
                                           "matches kernels by correlation id) or events."),
    l2_flush: str = typer.Option("clean", "--l2-flush", help="How L2 is emptied before each timed call: clean (write, then read, a buffer "
                                                             "of 2 x L2: the call pays for its own traffic only) or dirty (write only, as "
                                                             "a memset flush does: the call also writes back the flush's dirty lines)."),
    seed: int | None = typer.Option(None, help="Base seed (default: the workload's)."),
    secret: bool = typer.Option(False, "--secret", help="Contest mode: draw the seed from the OS at run time, print it nowhere and "
                                                        "record it in the results only when the run ends (a workload's `secret: true` "
                                                        "setting does the same)."),
    redact: bool = typer.Option(False, "--redact", help="Also write <results>.redacted.json: case ids and statuses only, no seeds, "
                                                        "axes, messages or timings, for publishing a secret run."),
    input_sets: int | None = typer.Option(None, help="Random input sets per case (and rotating sets per timing trial)."),
    warmup: int | None = typer.Option(None, help="Warm-up calls per trial."),
    iterations: int | None = typer.Option(None, help="Timed calls per trial."),
    trials: int | None = typer.Option(None, help="Timing trials, each with fresh inputs."),
    reference_protocol: str | None = typer.Option(None, "--reference-protocol", help="How the reference is timed: light (2 warm-up, "
                                                  "10 timed calls, 1 trial; the default) or full (the solutions' protocol)."),
    case_timeout: float = typer.Option(600.0, help="Seconds a solution may take on one case before it is TIMEOUT."),
    compile_timeout: float = typer.Option(900.0, help="Seconds a solution may take to import/build."),
    save: Path | None = typer.Option(None, help="Results JSON path (default: results/<workload>-<time>.json)."),
    no_save: bool = typer.Option(False, "--no-save", help="Do not write a results file."),
    dataset: Path | None = typer.Option(None, "--dataset", help="A flashinfer-bench dataset folder; --workload then names one of its "
                                                                "definitions or a workloads .jsonl file."),
    worker_user: str = typer.Option("auto", "--worker-user", help="Whom solution workers run as: auto (a dedicated unprivileged id per "
                                                                  "worker when the harness is root, else the harness's user) or harness "
                                                                  "(always the harness's user)."),
    gpus: str | None = typer.Option(None, "--gpus", help="Devices to spread the cases over: a count or 'all' (default: 1; every GPU "
                                                        "of the cluster with --executor ray). Each case (reference and every solution) "
                                                        "runs on one device; without CUDA, N parallel correctness-only workers."),
    executor: str = typer.Option("local", "--executor", help="local (this machine's devices) or ray (one actor per GPU of a Ray "
                                                             "cluster; needs pip install 'dsa-bench\\[ray]')."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="The Ray cluster to join (default: start a local one)."),
    dataset_solutions: list[str] = typer.Option([], "--dataset-solutions", help="With --dataset: run the dataset's own solutions "
                                                                                "(solutions/**/*.json) of the definition: 'all', or a "
                                                                                "name; repeat for several."),
    atol: float | None = typer.Option(None, "--atol", help="Absolute tolerance of value outputs (default: the workload's)."),
    rtol: float | None = typer.Option(None, "--rtol", help="Relative tolerance of value outputs (default: the workload's)."),
    lse_atol: float | None = typer.Option(None, "--lse-atol", help="Absolute tolerance of log-sum-exp outputs (default: the workload's)."),
    score_rtol: float | None = typer.Option(None, "--score-rtol", help="Top-k tie tolerance as a fixed fraction of the row's largest score "
                                                                       "(default: the workload's; none: the definition's derived bound)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the interrupted run of this results file: same workload, options "
                                                              "and solutions (else a refusal naming what differs); finished cases are "
                                                              "kept, the rest run, and the union is written back to the file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary, the results path and errors."),
    json_lines: bool = typer.Option(False, "--json-lines", help="Write one JSON object per finished record (the results file's fields) and "
                                                                "then {\"summary\": ...} to stdout, and nothing else; human text goes to "
                                                                "stderr."),
    breakdown: bool = typer.Option(False, "--breakdown", help="Print where the run's wall time went, phase by phase (the results file "
                                                              "always records it as wall_breakdown)."),
    speedup_over: str | None = typer.Option(None, "--speedup-over", help="Solution of this run that the second speedup column is "
                                                                          "measured against (default: the fastest peer, a solution with "
                                                                          "`requires`, that passed each case)."),
) -> None:
    """Load a workload, run solutions on its cases, check every output, and (on a GPU) time them.

    On a terminal a progress display shows the run; otherwise (a log, a pipe) each finished
    (case, solution) prints one line as it finishes."""
    from dsa_bench.definitions.status import Status
    from dsa_bench.project import find_root
    from dsa_bench.results.tables import (
        breakdown_table,
        failed_cases,
        failures,
        failures_table,
        progress_every,
        progress_line,
        record_line,
        records_table,
        skips,
        summarize,
        summary_table,
        wall_time,
    )
    from dsa_bench.run.plan import RunRequest, execute, plan_run

    request = RunRequest(
        workload=workload, solutions=solution, cases=case, device=device, timer=timer, l2_flush=l2_flush, seed=seed, input_sets=input_sets,
        warmup=warmup, iterations=iterations, trials=trials, case_timeout=case_timeout, compile_timeout=compile_timeout, save=save,
        no_save=no_save, dataset=dataset, worker_user=worker_user, gpus=gpus, executor=executor, ray_address=ray_address,
        dataset_solutions=dataset_solutions, atol=atol, rtol=rtol, lse_atol=lse_atol, score_rtol=score_rtol,
        resume=resume, reference_protocol=reference_protocol, speedup_over=speedup_over, secret=secret, redact=redact,
    )  # fmt: skip
    plan = plan_run(request, find_root())
    for warning in plan.warnings:
        _warn(warning)
    stdout = _Stdout()
    say = _say_err if json_lines else stdout  # stdout holds only JSON with --json-lines
    names = ", ".join(s.name for s in plan.solutions)
    if not quiet:
        say(f"{plan.workload.name}: {len(plan.cases)} cases x {len(plan.solutions)} solutions ({names}) "
            f"on {_devices(plan)}, {plan.mode}")
        for line in sorted({f"workers run as {identity.description}{_unisolated(identity)}" for identity in plan.identities.values()}):
            say(line)
        if plan.resumed is not None:
            kept = plan.resumed.records_kept
            say(f"resuming {plan.save_path}: {kept} records of {len(plan.resumed.finished)} finished cases kept, "
                f"{len(plan.pending_cases)} cases to run")  # fmt: skip
    total = len(plan.pending_cases) * len(plan.solutions)
    live = sys.stdout.isatty() and not quiet and not json_lines
    done = 0
    started = time.monotonic()
    skipped_shown: set[str] = set()  # a skipped solution's first record is printed in a log, its others are not
    with _progress() if live else contextlib.nullcontext() as progress:
        task = progress.add_task(plan.workload.name, total=total) if progress else None

        def on_record(record) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress.update(task, advance=1, description=f"{record.case} [{record.solution}] {record.status.value}")
            elif json_lines:  # a secret run's seeds stay out of its output until it ends
                # stdout flushes: a piped log shows every record as it finishes
                stdout(json.dumps(record.model_dump() | ({"seeds": {}} if plan.secret else {})))
            elif not quiet:
                if record.status is not Status.SKIPPED or record.solution not in skipped_shown:
                    stdout(record_line(record, done, total))
                    if record.status is Status.SKIPPED:
                        skipped_shown.add(record.solution)
                        stdout(f"  (the other cases of {record.solution} are skipped for the same reason and not listed)")
                if done < total and done % progress_every(total) == 0:
                    stdout(progress_line(done, total, time.monotonic() - started))

        outcome = execute(plan, on_record)
    records = outcome.records
    header = outcome.results.header
    wall = header.wall_breakdown
    assert wall is not None  # execute records it, interrupted or not
    if records and live:
        stdout(records_table(records, plan.workload.definition.key_axes))
        stdout("")
    if records and not (json_lines and quiet):
        say(summary_table(records))
        if any(r.failed for r in records):
            say(failures_table(records))
        if any(r.peer is not None for r in records):
            over = f"--speedup-over {plan.options.speedup_over}" if plan.options.speedup_over else "the fastest peer that passed each case"
            say(f"vs peer: that solution's latency over each solution's, measured against {over}")
        from dsa_bench.results.roofline import roofline_table

        if roofline := roofline_table(records):  # how close to the hardware, the timer and host time (docs/roofline.md)
            say(roofline)
    if not (json_lines and quiet):
        say(breakdown_table(wall) if breakdown else f"{wall_time(wall)} (--breakdown shows where it went)")
    if not quiet:
        for name, note in (header.solution_notes or {}).items():
            say(f"note [{name}]: {note}")
        for name, packages in (header.solution_packages or {}).items():
            say(f"packages [{name}]: " + ", ".join(f"{k} {v}" for k, v in packages.items()))
        walls: dict[str, list[str]] = {}  # solutions by the walls their workers stood in (one line when all agree)
        for name, protections in (header.worker_protections or {}).items():
            walls.setdefault("; ".join(protections), []).append(name)
        for text, holders in walls.items():
            say(f"worker walls [{', '.join(holders) if len(walls) > 1 else 'all'}]: {text} (docs/trust.md)")
        for line in skips(records):
            say(line)
    for line in outcome.sagged:
        _warn(f"clock sagged during timing: {line}")
    for line in failures(records):
        _err(line)
    if plan.save_path is not None and not (json_lines and quiet):
        say(f"results: {plan.save_path}" + (" (the secret seed is recorded there)" if plan.secret else ""))
        if plan.redacted_path is not None:
            say(f"redacted copy: {plan.redacted_path}")
    if json_lines:
        from dsa_bench.results.roofline import summarize_roofline

        summary = {
            "workload": plan.workload.name,
            "complete": outcome.stopped_by is None,
            "interrupted_by": None if outcome.stopped_by is None else signal.Signals(outcome.stopped_by).name,
            "results": None if plan.save_path is None else str(plan.save_path),
            "solutions": [dataclasses.asdict(summarize(records, name)) for name in dict.fromkeys(r.solution for r in records)],
            "roofline": [dataclasses.asdict(summarize_roofline(records, name)) for name in dict.fromkeys(r.solution for r in records)],
            "failures": [dataclasses.asdict(f) for f in failed_cases(records)],
            "wall_breakdown": wall.model_dump(),
        }
        stdout(json.dumps({"summary": summary}))
    if outcome.stopped_by is not None:
        _err(f"interrupted by {signal.Signals(outcome.stopped_by).name}: {len(records)} finished records kept")
        if plan.save_path is not None:
            _err(f"to finish it: {_resume_command(ctx, plan.save_path)}")
        else:
            _err("nothing was saved (--no-save), so it cannot be resumed")
        raise typer.Exit(128 + outcome.stopped_by)
    if any(r.failed for r in records):  # a skipped peer is not a failure
        raise typer.Exit(EXIT_FAILED_CASES)


def _unisolated(identity) -> str:
    """Why it matters when a root harness could not give its workers an unprivileged user."""
    if os.geteuid() == 0 and not identity.dedicated and "--worker-user" not in identity.description:
        return " (so solutions run as root, not isolated from the harness: docs/trust.md)"
    return ""


def _devices(plan) -> str:
    if plan.executor == "ray" and plan.ray_cpu:
        return f"{plan.ray_gpus or 1} Ray CPU actor(s)"
    if plan.executor == "ray":
        return f"up to {plan.ray_gpus} Ray actor(s)" if plan.ray_gpus else "every GPU of the Ray cluster"
    devices = [str(o.device) for o in plan.device_options]
    return devices[0] if len(devices) == 1 else f"{len(devices)} devices ({', '.join(devices)})"


def _progress(console=None):
    """The run's progress display. Markup is off: a case id or solution name is shown as it is,
    and brackets in one (``[/]``) cannot raise in the display's refresh thread."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, transient=True, console=console)


@app.command("list")
def list_(what: str = typer.Argument("all", help="definitions, workloads, solutions or all")) -> None:
    """List the definitions, workloads and solutions dsa-bench can see."""
    from dsa_bench.definitions import all_definitions
    from dsa_bench.project import find_root, resolve_workload, workload_names
    from dsa_bench.solution import discover

    if what not in ("all", "definitions", "workloads", "solutions"):
        raise DsaBenchError(f"cannot list {what!r}; choose definitions, workloads, solutions or all")
    root = find_root()
    if what in ("all", "definitions"):
        rows: list[list[object]] = [[d.name, ", ".join(d.var_axes), d.description] for d in all_definitions().values()]
        typer.echo(_fitted(rows, ["definition", "variable axes", "description"], wrap=(1, 2)) + "\n")
    if what in ("all", "workloads"):
        rows = []
        for name in workload_names(root):
            try:
                wl = resolve_workload(name, root)
                rows.append([name, wl.definition.name, len(wl.cases), wl.description])
            except DsaBenchError as exc:
                rows.append([name, "INVALID", "-", str(exc)])
        typer.echo(_fitted(rows, ["workload", "definition", "cases", "description"], wrap=(3,), below=True) + "\n")
    if what in ("all", "solutions"):
        rows = [[s.name, "\n".join(f"{d} ({e.language})" for d, e in s.entries.items()), s.author] for s in discover(root / "solutions")]
        typer.echo(_fitted(rows, ["solution", "entries", "author"], wrap=(2,)))


def _fitted(rows: list[list[object]], headers: list[str], wrap: tuple[int, ...], below: bool = False) -> str:
    """A table no wider than the terminal (100 columns in a pipe): the ``wrap`` columns share, as
    wrapped text, what the other columns leave (each at least 12 characters). With ``below``, a
    single ``wrap`` column that would get fewer than 40 goes under its row instead, indented."""
    import shutil
    import textwrap

    from tabulate import tabulate

    width = shutil.get_terminal_size((100, 24)).columns
    kept = [i for i in range(len(headers)) if i not in wrap]
    narrow = tabulate([[row[i] for i in kept] for row in rows], headers=[headers[i] for i in kept], disable_numparse=True)
    left = width - max(len(line) for line in narrow.splitlines()) - 2 * len(wrap) - 1
    if below and len(wrap) == 1 and left < 40:
        lines = narrow.splitlines()  # header, rule, then one line per row (the kept cells are one line each)
        out = lines[:2]
        for line, row in zip(lines[2:], rows, strict=True):
            out += [line, textwrap.fill(str(row[wrap[0]]), width=width - 1, initial_indent="    ", subsequent_indent="    ")]
        return "\n".join(out)
    limits: list[int | None] = [None] * len(headers)
    natural = {i: max(len(str(headers[i])), *(len(line) for row in rows for line in str(row[i]).splitlines())) for i in wrap}
    for n, i in enumerate(sorted(wrap, key=natural.__getitem__)):  # the narrowest first: it may need less than its share
        limit = max(12, min(natural[i], left // (len(wrap) - n)))
        limits[i], left = limit, left - limit
    return tabulate(rows, headers=headers, maxcolwidths=limits, disable_numparse=True)


@app.command()
def validate(
    paths: list[Path] = typer.Argument(
        ..., help="Workload YAML, trace JSONL (checked through the workloads that name it) or solution folders."
    ),
) -> None:
    """Validate workload, trace and solution files without running anything."""
    from dsa_bench.solution import MANIFEST, load_solution
    from dsa_bench.workloads import load_workload

    bad = 0
    for path in paths:
        try:
            if path.is_dir() or path.name == MANIFEST:
                folder = path if path.is_dir() else path.parent
                sol = load_solution(folder)
                typer.echo(f"ok  {path}: solution {sol.name!r} with {len(sol.entries)} entr{'y' if len(sol.entries) == 1 else 'ies'}")
            elif path.suffix in (".yaml", ".yml"):
                wl = load_workload(path)
                typer.echo(f"ok  {path}: workload {wl.name!r}, {len(wl.cases)} cases of {wl.definition.name}")
            elif path.suffix == ".jsonl":
                n = _validate_trace(path)
                typer.echo(f"ok  {path}: {n} cases")
            else:
                raise DsaBenchError("not a workload (.yaml), trace (.jsonl) or solution folder", str(path))
        except DsaBenchError as exc:
            bad += 1
            _err(f"bad {exc}")
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


def _validate_trace(path: Path) -> int:
    """A trace is validated through every workload that uses it."""
    from dsa_bench.project import find_root, resolve_workload, workload_names

    root = find_root()
    users = []
    for name in workload_names(root):
        wl = resolve_workload(name, root)
        if wl.trace_path == path.resolve():
            users.append(wl)
    if not users:
        raise DsaBenchError("no workload under workloads/ uses this trace; validate the workload YAML that names it", str(path))
    return len(users[0].cases)


@app.command()
def pack(
    folder: Path = typer.Argument(..., help="Solution folder (with solution.yaml)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder (default: packed/<solution name>/)."),
    definition: list[str] = typer.Option([], "--definition", "-d", help="Pack only this definition's entry; repeat for several. Default: "
                                                                        "every entry."),
    verify: bool = typer.Option(False, "--verify", help="Unpack each JSON into a temporary folder and run it on its definition's smoke "
                                                        "workload(s)."),
    device: str = typer.Option("auto", help="Device for --verify runs (auto, cpu, cuda, cuda:N)."),
) -> None:
    """Package a solution folder as flashinfer-bench Solution JSON, one file per definition."""
    from tabulate import tabulate

    from dsa_bench.pack.flashinfer import import_problems
    from dsa_bench.pack.pack import pack_solution
    from dsa_bench.pack.verify import verify_packed
    from dsa_bench.project import find_root

    packed = pack_solution(folder, out, definition or None)
    for item in packed:
        sources = item.document["sources"]
        typer.echo(f"{item.path}: {item.definition} -> {item.document['spec']['entry_point']} ({item.document['spec']['language']}), "
                   f"{len(sources)} files, {sum(len(s['content'].encode()) for s in sources)} bytes")  # fmt: skip
        rows = [[s["path"], len(s["content"].encode()), item.reasons[s["path"]]] for s in sources]
        typer.echo(tabulate(rows, headers=["file", "bytes", "why"], disable_numparse=True))
        if item.external_modules:
            typer.echo(f"  imports from outside the folder (the runner must provide them): {', '.join(item.external_modules)}")
        if item.empty_files:
            typer.echo(f"  empty files packed as one newline (the format needs non-empty content): {', '.join(item.empty_files)}")
        if item.left_out:
            typer.echo(f"  left out (not needed by this entry): {', '.join(item.left_out)}")
        for problem in import_problems(item.document, str(item.path)):
            _warn(problem)
        typer.echo("")
    if not verify:
        return
    failed = 0
    written = [item.path for item in packed if item.path is not None]  # pack_solution writes every entry
    for result in verify_packed(written, find_root(), device=device, on_start=typer.echo):
        if result.passed:
            typer.echo(f"verified {result.packed.name} on {result.workload}: every case passed")
        else:
            failed += 1
            _err(f"verification FAILED for {result.packed.name} on {result.workload}:\n{result.output}")
    if failed:
        raise typer.Exit(EXIT_FAILED_CASES)


@app.command()
def unpack(
    paths: list[Path] = typer.Argument(..., help="Packed Solution JSON file(s), then the destination folder.", metavar="FILE.json... DIR"),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty destination folder."),
) -> None:
    """Restore a solution folder (sources and solution.yaml) from packed Solution JSON files."""
    from dsa_bench.pack.pack import unpack_solutions

    if len(paths) < 2:
        raise DsaBenchError("give the packed JSON file(s) and then the destination folder")
    *files, dest = paths
    folder = unpack_solutions(files, dest, force=force)
    typer.echo(f"unpacked {len(files)} packed solution(s) into {folder}")


@app.command()
def compare(
    results: list[Path] = typer.Argument(..., help="Results JSON file(s) of `dsa-bench run --save`."),
    baseline: Path = typer.Option(..., "--baseline", "-b", help="Baseline JSON, e.g. baselines/h200.json."),
    threshold: float = typer.Option(0.05, help="Smallest slowdown (fraction of speedup) that counts as a regression; the recorded noise "
                                               "can widen it."),
    output_format: str = typer.Option("table", "--format", help="table, or markdown (for CI summaries)."),
    all_cases: bool = typer.Option(False, "--all", help="List every case, not only those that changed."),
) -> None:
    """Compare per-case speedups with a baseline; exit 1 on a regression or a newly failing case."""
    from dsa_bench.results.baseline import load_baseline
    from dsa_bench.results.compare import compare_results, render_comparison
    from dsa_bench.results.records import load_results

    if output_format not in ("table", "markdown"):
        raise DsaBenchError(f"--format {output_format!r}: choose table or markdown")
    loaded = [load_results(p) for p in results]
    for path, one in zip(results, loaded, strict=True):
        if not one.records:
            interrupted = " (an interrupted run)" if not one.header.complete else ""
            raise DsaBenchError(f"holds no records{interrupted}: nothing to compare", str(path))
    comparison = compare_results(loaded, load_baseline(baseline), threshold, str(baseline))
    typer.echo(render_comparison(comparison, output_format, all_cases))
    if output_format == "markdown":
        from dsa_bench.results.roofline import roofline_markdown

        if section := roofline_markdown(loaded):  # how close the new results are to the hardware (docs/roofline.md)
            typer.echo("\n" + section)
    if not comparison.ok:
        raise typer.Exit(EXIT_FAILED_CASES)
    if comparison.nothing_timed:  # statuses alone are no speed comparison: not an OK
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def export(
    results: Path = typer.Argument(..., help="Results JSON file of `dsa-bench run --save`."),
    output_format: str = typer.Option("flashinfer-bench", "--format", help="flashinfer-bench: one Trace JSON per line (JSONL)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="File to write (default: the results file with .traces.jsonl)."),
) -> None:
    """Export a results file as flashinfer-bench traces (what the format cannot hold: docs/flashinfer_bench.md)."""
    from dsa_bench.export import check_traces_path, export_traces, write_traces
    from dsa_bench.project import find_root

    if output_format != "flashinfer-bench":
        raise DsaBenchError(f"--format {output_format!r}: the one export format is flashinfer-bench")
    out = output if output is not None else results.with_suffix(".traces.jsonl")
    check_traces_path(out, results)
    exported = export_traces(results, find_root())
    for line in exported.left_out:
        _warn(f"no trace for {line}")
    if not exported.traces:
        raise DsaBenchError("the results hold no record to export as a trace", str(results))
    write_traces(exported, out, results)
    typer.echo(f"wrote {out}: {len(exported.traces)} flashinfer-bench traces")


@app.command()
def profile(
    workload: str = typer.Option(..., "--workload", "-w", help="Workload name or path."),
    solution: str = typer.Option(..., "--solution", "-s", help="Solution name or folder."),
    case: str = typer.Option(..., "--case", "-c", help="The one case id (or a pattern matching exactly one)."),
    nsys: bool = typer.Option(False, "--nsys", help="Nsight Systems instead of Nsight Compute: the case's kernel launches and times."),
    input_set: int = typer.Option(0, "--input-set", help="Which of the run's input sets of the case (0 = the first correctness set)."),
    warmup: int = typer.Option(3, "--warmup", help="Calls before the profiled one (compilation, autotuning, graph capture)."),
    seed: int | None = typer.Option(None, help="Base seed (default: the workload's), as `run --seed`."),
    device: str = typer.Option("auto", help="cuda or cuda:N (auto: the first CUDA device)."),
) -> None:
    """Profile one case of one solution under Nsight Compute (or --nsys: Nsight Systems): one call, with
    the run's inputs, in an isolated process; the report goes to results/profile/ (docs/roofline.md)."""
    from dsa_bench.project import find_root, relative_to_root
    from dsa_bench.run.profile import ProfileFailed, ProfileRequest, run_profile

    if warmup < 0 or input_set < 0:
        raise DsaBenchError("--warmup and --input-set must be >= 0")
    request = ProfileRequest(workload=workload, solution=solution, case=case, nsys=nsys, input_set=input_set, warmup=warmup, seed=seed,
                             device=device)  # fmt: skip
    root = find_root()
    try:
        outcome = run_profile(request, root)
    except ProfileFailed as exc:
        _err(f"profile failed: {exc}")
        raise typer.Exit(EXIT_FAILED_CASES) from None
    typer.echo(outcome.table)
    typer.echo(f"report: {relative_to_root(outcome.report, root)} (parsed: {relative_to_root(outcome.csv_path, root)})")


@app.command()
def layout(
    formats: list[str] = typer.Argument(None, help="kv_format names (default: the five FlashMLA formats)."),
    block_size: int = typer.Option(64, "--block-size", help="Tokens per page."),
    with_indexer: bool = typer.Option(False, "--with-indexer", help="Share each block with an indexer key page."),
    indexer_alignment: int | None = typer.Option(None, "--indexer-alignment", help="The indexer page's alignment "
                                                 "(default: the main format's own)."),
    layers: int = typer.Option(1, "--layers", help="(main, indexer) page pairs per block."),
    check: bool = typer.Option(False, "--check", help="Exit 1 on a block whose strides break a kernel's TMA stride."),
) -> None:
    """Print the FP8 KV record geometry (docs/kv_records.md) and the shared-block strides."""
    from tabulate import tabulate

    from dsa_bench.definitions.kv_records import BLOCK_HEADERS, LAYOUT_HEADERS, layout_tables

    rows, blocks, error = layout_tables(formats or [], block_size, with_indexer, indexer_alignment, layers)
    typer.echo(tabulate(rows, headers=LAYOUT_HEADERS, disable_numparse=True))
    if blocks:
        typer.echo("\n" + tabulate(blocks, headers=BLOCK_HEADERS, disable_numparse=True))
    if check and error is not None:
        _err(f"error: {error}")
        _err("check FAILED: a block above breaks a kernel's TMA stride")
        raise typer.Exit(EXIT_FAILED_CASES)
    if check and blocks:
        typer.echo("check passed: every block above keeps its kernels' TMA stride")
    elif check:
        typer.echo("check passed: no shared block to check (--with-indexer checks blocks shared with an indexer page)")


baseline_app = typer.Typer(help="Manage stored speedup baselines.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("update")
def baseline_update(
    results: list[Path] = typer.Argument(..., help="Results JSON file(s), one per workload."),
    baseline: Path = typer.Option(..., "--baseline", "-b", help="Baseline JSON to write, e.g. baselines/h200.json."),
    replace: bool = typer.Option(False, "--replace", help="Drop workloads not in these results (default: keep them)."),
) -> None:
    """Write or update a baseline from results files: each workload's entry is replaced."""
    from dsa_bench.results.baseline import update_baseline
    from dsa_bench.results.records import load_results

    document = update_baseline(baseline, results, replace=replace)
    for path in results:
        loaded = load_results(path)
        block = document["workloads"][loaded.workload]
        timed = sum(1 for c in block["cases"] if c["speedup"] is not None)
        typer.echo(f"{loaded.workload}: {len(block['cases'])} (case, solution) entries, {timed} with a speedup, from {path}")
        if not timed:
            _warn(f"{path} holds no timing: this baseline can only catch status changes")
    typer.echo(f"baseline: {baseline} ({len(document['workloads'])} workloads)")


results_app = typer.Typer(help="Work with results files.", no_args_is_help=True)
app.add_typer(results_app, name="results")


@results_app.command("merge")
def results_merge(
    parts: list[Path] = typer.Argument(..., help="Results JSON files of one workload, covering different cases."),
    out: Path = typer.Option(..., "--out", "-o", help="The merged results file to write."),
) -> None:
    """Merge results files of one workload (a run split over several sittings) into one."""
    from dsa_bench.results.merge import write_merged

    merged = write_merged(parts, out)
    cases = len({r.case for r in merged.records})
    typer.echo(f"wrote {out}: {len(merged.records)} records over {cases} cases from {len(parts)} files")


@results_app.command("redact")
def results_redact(
    results: Path = typer.Argument(..., help="Results JSON file of `dsa-bench run --save`."),
    out: Path = typer.Option(..., "--out", "-o", help="The redacted results file to write (never the input)."),
) -> None:
    """Write a copy fit to publish: case ids and statuses only (no seeds, axes, messages or timings)."""
    from dsa_bench.files import check_output_path, has_json_format
    from dsa_bench.results.records import RESULTS_FORMAT, load_results, write_redacted

    check_output_path(out, "--out", "dsa-bench results", lambda p: has_json_format(p, RESULTS_FORMAT), [results])
    loaded = load_results(results)
    write_redacted(loaded.document, out)
    typer.echo(f"wrote {out}: {len(loaded.records)} records, case ids and statuses only")


@app.command()
def report(
    results: list[Path] = typer.Argument(..., help="Results JSON file(s) of `dsa-bench run --save`."),
    output: Path | None = typer.Option(None, "--output", "-o", help="HTML file to write (default: the first results file with .html); PNG "
                                                                    "plots go next to it."),
) -> None:
    """Write a self-contained HTML report (plots embedded) and the plots as PNG files."""
    from dsa_bench.results.report import write_report

    page, pngs = write_report(results, output if output is not None else results[0].with_suffix(".html"))
    plots = f" ({len(pngs)} plots: {', '.join(p.name for p in pngs)})" if pngs else " (nothing was timed: no plots)"
    typer.echo(f"report: {page}{plots}")


def main() -> None:
    """Console entry point: user errors print one clear message and exit 2, never a traceback
    (commands' errors are mapped by :class:`_Commands`; this catches any raised outside one)."""
    try:
        app()
    except DsaBenchError as exc:
        _err(f"error: {exc}")
        sys.exit(EXIT_BAD_INPUT)
