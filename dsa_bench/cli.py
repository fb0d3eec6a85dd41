"""The ``dsa-bench`` command line: thin commands over the library."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import typer.core

from dsa_bench.errors import DsaBenchError
from dsa_bench.run.request import RunRequest
from dsa_bench.run.request import flags as request_flags

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


def _run(ctx: typer.Context, request: RunRequest) -> None:
    """Load a workload, run solutions on its cases, check every output, and (on a GPU) time them.

    On a terminal a progress display shows the run; otherwise (a log, a pipe) each finished
    (case, solution) prints one line as it finishes."""
    from dsa_bench.project import find_root
    from dsa_bench.results.tables import RunEnding, RunPrinter
    from dsa_bench.run.execute import execute
    from dsa_bench.run.plan import plan_run

    plan = plan_run(request, find_root())
    stdout = _Stdout()
    live = sys.stdout.isatty() and not request.quiet and not request.json_lines
    printer = RunPrinter(out=stdout, say=_say_err if request.json_lines else stdout,  # stdout holds only JSON with --json-lines
                         warn=_warn, err=_err, quiet=request.quiet, json_lines=request.json_lines, live=live,
                         total=len(plan.pending_cases) * len(plan.solutions), secret=plan.secret)  # fmt: skip
    printer.opening(_opening(plan), plan.warnings)
    with _progress() if live else contextlib.nullcontext() as progress:
        task = progress.add_task(plan.workload.name, total=printer.total) if progress else None

        def on_record(record) -> None:
            printer.record(record)
            if progress is not None:
                progress.update(task, advance=1, description=f"{record.case} [{record.solution}] {record.status.value}")

        outcome = execute(plan, on_record)
    ending = RunEnding(plan.workload.name, outcome.records, outcome.results.header, outcome.sagged, outcome.stopped_by,
                       plan.save_path, plan.redacted_path)  # fmt: skip
    printer.ending(ending, plan.workload.definition.key_axes, request.breakdown)
    if outcome.stopped_by is not None:
        if plan.save_path is not None:
            _err(f"to finish it: {_resume_command(ctx, plan.save_path)}")
        else:
            _err("nothing was saved (--no-save), so it cannot be resumed")
        raise typer.Exit(128 + outcome.stopped_by)
    if any(r.failed for r in outcome.records):  # a skipped peer is not a failure
        raise typer.Exit(EXIT_FAILED_CASES)


def _opening(plan) -> list[str]:
    """What a run says before its first case: the workload, solutions, devices and mode; whom the workers
    run as; what a resumed run keeps."""
    names = ", ".join(s.name for s in plan.solutions)
    lines = [f"{plan.workload.name}: {len(plan.cases)} cases x {len(plan.solutions)} solutions ({names}) on {_devices(plan)}, {plan.mode}"]
    lines += sorted({f"workers run as {identity.description}{_unisolated(identity)}" for identity in plan.identities.values()})
    if plan.resumed is not None:
        lines.append(f"resuming {plan.save_path}: {plan.resumed.records_kept} records of {len(plan.resumed.finished)} finished cases "
                     f"kept, {len(plan.pending_cases)} cases to run")  # fmt: skip
    return lines


def _command_from_request(body: Callable[[typer.Context, RunRequest], None]) -> Callable[..., None]:
    """The ``run`` command, built from :class:`RunRequest`: one option per field, with the field's
    flags, help and default, so that each is declared once. Typer reads the signature built here."""

    def command(ctx: typer.Context, **values: Any) -> None:
        body(ctx, RunRequest(**values))

    parameters = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for name, info in RunRequest.model_fields.items():
        default = ... if info.is_required() else info.get_default(call_default_factory=True)
        option = typer.Option(default, *request_flags(name), help=info.description)
        parameters.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=info.annotation))
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    command.__doc__ = body.__doc__
    command.__name__ = "run"
    return command


app.command("run")(_command_from_request(_run))


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

    from dsa_bench.flashinfer_bench.packed import import_problems
    from dsa_bench.flashinfer_bench.verify import verify_packed
    from dsa_bench.pack.pack import pack_solution
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
    from dsa_bench.flashinfer_bench.traces import check_traces_path, export_traces, write_traces
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


def _selected_records(results: Path, solutions: list[str], cases: list[str]) -> list:
    """The records of a results file of these solutions (all when empty) on cases matching these globs (all when empty)."""
    from fnmatch import fnmatchcase

    from dsa_bench.results.records import load_results

    return [r for r in load_results(results).records
            if (not solutions or r.solution in solutions) and (not cases or any(fnmatchcase(r.case, p) for p in cases))]  # fmt: skip


@results_app.command("kernels")
def results_kernels(
    results: Path = typer.Argument(..., help="Results JSON file of `dsa-bench run --save` (timed with CUPTI)."),
    solution: list[str] = typer.Option([], "--solution", "-s", help="Only these solutions (repeatable)."),
    case: list[str] = typer.Option([], "--case", "-c", help="Only cases matching these glob patterns (repeatable)."),
    exclude: list[str] = typer.Option([], "--exclude", "-x", help="With --sum: leave out kernels whose names match this "
                                                                  "regular expression (repeatable)."),
    sum_kernels: bool = typer.Option(False, "--sum", help="One line per record: its kernels' summed time, the excluded "
                                                          "part and the rest."),
    against: str | None = typer.Option(None, "--against", help="With --sum: also this solution's kept time over each "
                                                               "record's, case by case."),
) -> None:
    """Print where each timed call's GPU time went, kernel by kernel (a multi-kernel solution's breakdown), or with
    --sum each call's kernels summed, some of them left out (a decode step without its KV writes, say)."""
    from dsa_bench.errors import DsaBenchError
    from dsa_bench.results.tables import kernel_patterns, kernel_sums_table, kernels_table

    if (exclude or against) and not sum_kernels:
        raise DsaBenchError("--exclude and --against go with --sum", where="dsa-bench results kernels")
    records = _selected_records(results, solution + ([against] if against and solution else []), case)
    if sum_kernels:
        typer.echo(kernel_sums_table(records, kernel_patterns(exclude), against))
    else:
        typer.echo(kernels_table(records))


@results_app.command("headroom")
def results_headroom(
    results: Path = typer.Argument(..., help="Results JSON file of a timed GPU run (`dsa-bench run --save`)."),
    solution: list[str] = typer.Option([], "--solution", "-s", help="Only these solutions (repeatable)."),
    case: list[str] = typer.Option([], "--case", "-c", help="Only cases matching these glob patterns (repeatable)."),
    target: float | None = typer.Option(None, "--target", min=0.01, help="A speedup over the fastest passing peer to judge "
                                                                         "(e.g. 1.25): met, open, or below the floor."),
) -> None:
    """Print each case's latency against its floor (the minimum bytes at the measured copy bandwidth, or the FLOPs at
    the dense peak) and the fastest passing peer's, and whether a target over the peer is within reach."""
    from dsa_bench.results.roofline import headroom_table

    typer.echo(headroom_table(_selected_records(results, solution, case), target))


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
