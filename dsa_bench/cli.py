"""The ``dsa-bench`` command line: thin commands over the library."""

from __future__ import annotations

import contextlib
import fnmatch
import math
import signal
import sys
from pathlib import Path
from typing import Optional

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

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DsaBenchError as exc:
            _err(f"error: {exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None


app = typer.Typer(
    cls=_Commands,
    help="dsa-bench: run, check and time DeepSeek Sparse Attention kernels on trace-defined workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _err(message: str) -> None:
    typer.secho(message, fg=typer.colors.RED, err=True)


def _warn(message: str) -> None:
    typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)


def _pick_device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DsaBenchError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DsaBenchError(f"--device {name} asked for CUDA but no CUDA device is available")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise DsaBenchError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type not in ("cpu", "cuda"):
        raise DsaBenchError(f"--device {name}: only cpu and cuda devices are supported")
    return device


#: Longest --case-timeout and --compile-timeout, in seconds: a day (longer is a typo, not a plan).
MAX_TIMEOUT_S = 86400.0


def _check_setting_options(options: dict[str, int | None]) -> None:
    """Refuse a bad run-setting override (``--input-sets 0``) before anything is loaded."""
    from dsa_bench.workloads import setting_problem

    for option, value in options.items():
        problem = None if value is None else setting_problem(option.removeprefix("--").replace("-", "_"), value)
        if problem is not None:
            raise DsaBenchError(f"{option} {value}: {problem}")


def _check_timeout(option: str, seconds: float) -> None:
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise DsaBenchError(f"{option} {seconds:g}: expected a finite number of seconds > 0 and <= {MAX_TIMEOUT_S:g}")


def _select_cases(workload, patterns: list[str]):
    if not patterns:
        return list(workload.cases)
    chosen = [c for c in workload.cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if not chosen:
        raise DsaBenchError(f"no case of workload {workload.name!r} matches {', '.join(patterns)}")
    return chosen


@app.command()
def run(
    workload: str = typer.Option(..., "--workload", "-w", help="Workload name (workloads/<name>.yaml) or path to a workload YAML."),
    solution: list[str] = typer.Option([], "--solution", "-s", help="Solution name or folder; repeat for several. Default: every solution with an entry for the workload's definition."),
    case: list[str] = typer.Option([], "--case", "-c", help="Case id or glob pattern; repeat for several. Default: all cases."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N. Without CUDA the run checks correctness only."),
    timer: str = typer.Option("auto", help="auto (CUPTI, else CUDA events with a warning), cupti, cupti_api (also traces API calls and matches kernels by correlation id) or events."),
    l2_flush: str = typer.Option("clean", "--l2-flush", help="How L2 is emptied before each timed call: clean (write, then read, a buffer of 2 x L2: the call pays for its own traffic only) or dirty (write only, as a memset flush does: the call also writes back the flush's dirty lines)."),
    seed: Optional[int] = typer.Option(None, help="Base seed (default: the workload's)."),
    input_sets: Optional[int] = typer.Option(None, help="Random input sets per case (and rotating sets per timing trial)."),
    warmup: Optional[int] = typer.Option(None, help="Warm-up calls per trial."),
    iterations: Optional[int] = typer.Option(None, help="Timed calls per trial."),
    trials: Optional[int] = typer.Option(None, help="Timing trials, each with fresh inputs."),
    case_timeout: float = typer.Option(600.0, help="Seconds a solution may take on one case before it is TIMEOUT."),
    compile_timeout: float = typer.Option(900.0, help="Seconds a solution may take to import/build."),
    save: Optional[Path] = typer.Option(None, help="Results JSON path (default: results/<workload>-<time>.json)."),
    no_save: bool = typer.Option(False, "--no-save", help="Do not write a results file."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="A flashinfer-bench dataset folder; --workload then names one of its definitions or a workloads .jsonl file."),
    worker_user: str = typer.Option("auto", "--worker-user", help="Whom solution workers run as: auto (a dedicated unprivileged id per worker when the harness is root, else the harness's user) or harness (always the harness's user)."),
) -> None:
    """Load a workload, run solutions on its cases, check every output, and (on a GPU) time them."""
    from dsa_bench.files import safe_file_name
    from dsa_bench.isolation import WORKER_USER_MODES
    from dsa_bench.project import check_run_solutions, find_root, reference_solution, resolve_solution, resolve_workload
    from dsa_bench.results import ResultsFile, check_results_path, environment, failures, now_iso, records_table, sagged, summary_table
    from dsa_bench.runner import Interrupted, RunOptions, order_solutions, run_workload, worker_identities
    from dsa_bench.solutions import REFERENCE_SOLUTION, content_hash, discover
    from dsa_bench.timing import check_l2_flush, choose_timer, measure_copy_bandwidth

    check_l2_flush(l2_flush)
    if worker_user not in WORKER_USER_MODES:
        raise DsaBenchError(f"--worker-user {worker_user!r}: expected one of {', '.join(WORKER_USER_MODES)}")
    _check_setting_options({"--seed": seed, "--input-sets": input_sets, "--warmup": warmup, "--iterations": iterations, "--trials": trials})
    _check_timeout("--case-timeout", case_timeout)
    _check_timeout("--compile-timeout", compile_timeout)
    root = find_root()
    if dataset is None:
        wl = resolve_workload(workload, root)
    else:
        from dsa_bench.dataset import load_dataset_workload

        wl = load_dataset_workload(dataset, workload)
    cases = _select_cases(wl, case)
    dev = _pick_device(device)
    timer_name, warning = choose_timer(timer, dev)
    if warning:
        _warn(warning)
    settings = wl.settings.replace(seed=seed, input_sets=input_sets, warmup=warmup, iterations=iterations, trials=trials)
    if timer_name is not None and settings.input_sets < 2:
        raise DsaBenchError("timing needs --input-sets >= 2 so consecutive calls never see the same tensors")
    definition = wl.definition.name
    reference = reference_solution(root)
    reference_folders = [root / "solutions" / REFERENCE_SOLUTION]
    if dataset is not None and (reference is None or definition not in reference.entries):
        from dsa_bench.dataset import reference_solution_folder
        from dsa_bench.solutions import load_solution

        # a dataset definition dsa-bench has no reference solution of: run the JSON's own reference
        reference = load_solution(reference_solution_folder(wl.definition, root / ".cache" / "dsa-bench"))
        reference_folders.append(reference.path)
    if solution:
        chosen = [reference if dataset is not None and s == REFERENCE_SOLUTION else resolve_solution(s, root) for s in solution]
        for s in chosen:
            s.entry_for(definition)
    else:
        chosen = [s for s in discover(root / "solutions") if definition in s.entries]
    check_run_solutions(chosen, reference_folders)
    if timer_name is not None and reference is None:
        raise DsaBenchError(f"timing needs the reference solution at {root / 'solutions' / REFERENCE_SOLUTION}")
    chosen = order_solutions(chosen, timer_name is not None, reference)
    if not chosen:
        raise DsaBenchError(f"no solution implements {definition}")

    save_path = None if no_save else (save or root / "results" / f"{safe_file_name(wl.name)}-{now_iso().replace(':', '')}.json")
    if save_path is not None:
        check_results_path(save_path, *_run_inputs(wl, chosen, dataset))
    options = RunOptions(
        device=dev,
        settings=settings,
        timer=timer_name,
        l2_flush=l2_flush,
        compile_timeout_s=compile_timeout,
        case_timeout_s=case_timeout,
        log_dir=root / ".cache" / "dsa-bench" / "logs",
        cache_dir=root / ".cache" / "dsa-bench",
        dataset_root=dataset,
        worker_user=worker_user,
        copy_bytes_per_s=measure_copy_bandwidth(dev) if timer_name is not None else None,
    )
    identities = worker_identities(chosen, options, cases)
    from dataclasses import asdict

    results = ResultsFile(
        save_path,
        {
            "workload": {"name": wl.name, "path": str(wl.path), "trace": str(wl.trace_path), "definition": definition}
            | ({"dataset": str(dataset.resolve())} if dataset is not None else {}),
            "settings": {**{k: v for k, v in asdict(settings).items() if k != "tolerance"}, "tolerance": asdict(settings.tolerance)},
            "timer": timer_name,
            "l2_flush": l2_flush if timer_name else None,
            "environment": environment(dev) | ({"copy_gbps": options.copy_bytes_per_s / 1e9} if options.copy_bytes_per_s else {}),
            "workers": {name: identity.description for name, identity in identities.items()},
            "solutions": {s.name: {"path": str(s.path), "content_hash": content_hash(s.path)} for s in chosen},
        },
    )
    mode = f"timing with {timer_name}, {l2_flush} L2 flush" if timer_name else "correctness only (no CUDA device: nothing is timed)"
    typer.echo(f"{wl.name}: {len(cases)} cases x {len(chosen)} solutions ({', '.join(s.name for s in chosen)}) on {dev}, {mode}")
    for line in sorted({f"workers run as {identity.description}" for identity in identities.values()}):
        typer.echo(line)
    records = []
    interrupted: int | None = None  # the signal that stopped the run
    with _progress() as progress:
        task = progress.add_task(wl.name, total=len(cases) * len(chosen))

        def on_record(record) -> None:
            progress.update(task, advance=1, description=f"{record.case} [{record.solution}] {record.status.value}")

        try:
            with _stopped_by_signals():
                records = run_workload(wl, cases, chosen, options, results, on_record, identities)
        except KeyboardInterrupt as stop:
            interrupted = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
            records = _records_from(results)
    sag = sagged(records, results.document["environment"].get("max_sm_mhz"))
    results.update(complete=interrupted is None, finished=now_iso(), clock_sagged=sag)
    if records:
        typer.echo(records_table(records, wl.definition.key_axes))
        typer.echo("")
        typer.echo(summary_table(records))
    notes = results.document.get("solution_notes") or {}
    for name, note in notes.items():
        typer.echo(f"note [{name}]: {note}")
    for line in sag:
        _warn(f"clock sagged during timing: {line}")
    for line in failures(records):
        _err(line)
    if save_path is not None:
        typer.echo(f"results: {save_path}")
    if interrupted is not None:
        _err(f"interrupted by {signal.Signals(interrupted).name}: {len(records)} finished records kept")
        raise typer.Exit(128 + interrupted)
    if any(not r.passed for r in records):
        raise typer.Exit(EXIT_FAILED_CASES)


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGTERM and SIGHUP stop a run as Ctrl-C does: workers are ended, finished records kept."""
    from dsa_bench.runner import Interrupted

    def stop(signum, frame):
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_inputs(workload, solutions, dataset: Path | None) -> tuple[list[Path], list[Path]]:
    """The files and folders a run reads, which its results file must not overwrite or enter."""
    files = [p for p in (workload.path, workload.trace_path) if p is not None]
    files += [source.path for case in workload.cases for source in case.inputs.values() if source.path is not None]
    folders = [s.path for s in solutions] + ([dataset] if dataset is not None else [])
    return files, folders


def _progress(console=None):
    """The run's progress display. Markup is off: a case id or solution name is shown as it is,
    and brackets in one (``[/]``) cannot raise in the display's refresh thread."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True, console=console
    )


def _records_from(results):
    from dsa_bench.results import CaseRecord

    return [CaseRecord.from_json(r) for r in results.document["records"]]


@app.command("list")
def list_(what: str = typer.Argument("all", help="definitions, workloads, solutions or all")) -> None:
    """List the definitions, workloads and solutions dsa-bench can see."""
    from tabulate import tabulate

    from dsa_bench.definitions import all_definitions
    from dsa_bench.project import find_root, resolve_workload, workload_names
    from dsa_bench.solutions import discover

    if what not in ("all", "definitions", "workloads", "solutions"):
        raise DsaBenchError(f"cannot list {what!r}; choose definitions, workloads, solutions or all")
    root = find_root()
    if what in ("all", "definitions"):
        rows = [[d.name, ", ".join(d.var_axes), d.description] for d in all_definitions().values()]
        typer.echo(tabulate(rows, headers=["definition", "variable axes", "description"]) + "\n")
    if what in ("all", "workloads"):
        rows = []
        for name in workload_names(root):
            try:
                wl = resolve_workload(name, root)
                rows.append([name, wl.definition.name, len(wl.cases), wl.description])
            except DsaBenchError as exc:
                rows.append([name, "INVALID", "-", str(exc)])
        typer.echo(tabulate(rows, headers=["workload", "definition", "cases", "description"]) + "\n")
    if what in ("all", "solutions"):
        rows = [[s.name, ", ".join(f"{d} ({e.language})" for d, e in s.entries.items()), s.author] for s in discover(root / "solutions")]
        typer.echo(tabulate(rows, headers=["solution", "entries", "author"]))


@app.command()
def validate(paths: list[Path] = typer.Argument(..., help="Workload YAML, trace JSONL (with --definition) or solution folders.")) -> None:
    """Validate workload, trace and solution files without running anything."""
    from dsa_bench.solutions import MANIFEST, load_solution
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
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default: packed/<solution name>/)."),
    definition: list[str] = typer.Option([], "--definition", "-d", help="Pack only this definition's entry; repeat for several. Default: every entry."),
    verify: bool = typer.Option(False, "--verify", help="Unpack each JSON into a temporary folder and run it on its definition's smoke workload(s)."),
    device: str = typer.Option("auto", help="Device for --verify runs (auto, cpu, cuda, cuda:N)."),
) -> None:
    """Package a solution folder as flashinfer-bench Solution JSON, one file per definition."""
    from tabulate import tabulate

    from dsa_bench.packing import pack_solution, verify_packed
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
        typer.echo("")
    if not verify:
        return
    failed = 0
    for result in verify_packed([item.path for item in packed], find_root(), device=device):
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
    from dsa_bench.packing import unpack_solutions

    if len(paths) < 2:
        raise DsaBenchError("give the packed JSON file(s) and then the destination folder")
    *files, dest = paths
    folder = unpack_solutions(files, dest, force=force)
    typer.echo(f"unpacked {len(files)} packed solution(s) into {folder}")


@app.command()
def compare(
    results: list[Path] = typer.Argument(..., help="Results JSON file(s) of `dsa-bench run --save`."),
    baseline: Path = typer.Option(..., "--baseline", "-b", help="Baseline JSON, e.g. baselines/h200.json."),
    threshold: float = typer.Option(0.05, help="Smallest slowdown (fraction of speedup) that counts as a regression; the recorded noise can widen it."),
    output_format: str = typer.Option("table", "--format", help="table, or markdown (for CI summaries)."),
    all_cases: bool = typer.Option(False, "--all", help="List every case, not only those that changed."),
) -> None:
    """Compare per-case speedups with a baseline; exit 1 on a regression or a newly failing case."""
    from dsa_bench.baselines import compare_results, load_baseline, load_results, render_comparison

    if output_format not in ("table", "markdown"):
        raise DsaBenchError(f"--format {output_format!r}: choose table or markdown")
    comparison = compare_results([load_results(p) for p in results], load_baseline(baseline), threshold)
    typer.echo(render_comparison(comparison, output_format, all_cases))
    if not comparison.ok:
        raise typer.Exit(EXIT_FAILED_CASES)


baseline_app = typer.Typer(help="Manage stored speedup baselines.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("update")
def baseline_update(
    results: list[Path] = typer.Argument(..., help="Results JSON file(s), one per workload."),
    baseline: Path = typer.Option(..., "--baseline", "-b", help="Baseline JSON to write, e.g. baselines/h200.json."),
    replace: bool = typer.Option(False, "--replace", help="Drop workloads not in these results (default: keep them)."),
) -> None:
    """Write or update a baseline from results files: each workload's entry is replaced."""
    from dsa_bench.baselines import load_results, update_baseline

    document = update_baseline(baseline, results, replace=replace)
    for path in results:
        loaded = load_results(path)
        block = document["workloads"][loaded.workload]
        timed = sum(1 for c in block["cases"] if c["speedup"] is not None)
        typer.echo(f"{loaded.workload}: {len(block['cases'])} (case, solution) entries, {timed} with a speedup, from {path}")
        if not timed:
            _warn(f"{path} holds no timing: this baseline can only catch status changes")
    typer.echo(f"baseline: {baseline} ({len(document['workloads'])} workloads)")


@app.command()
def report(
    results: list[Path] = typer.Argument(..., help="Results JSON file(s) of `dsa-bench run --save`."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file to write (default: the first results file with .html); PNG plots go next to it."),
) -> None:
    """Write a self-contained HTML report (plots embedded) and the plots as PNG files."""
    from dsa_bench.report import write_report

    page, pngs = write_report(results, output if output is not None else results[0].with_suffix(".html"))
    typer.echo(f"report: {page}" + (f" ({len(pngs)} plots: {', '.join(p.name for p in pngs)})" if pngs else " (nothing was timed: no plots)"))


def main() -> None:
    """Console entry point: user errors print one clear message and exit 2, never a traceback
    (commands' errors are mapped by :class:`_Commands`; this catches any raised outside one)."""
    try:
        app()
    except DsaBenchError as exc:
        _err(f"error: {exc}")
        sys.exit(EXIT_BAD_INPUT)
