"""The command line's help and --version: what a new user reads first."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from dsa_bench import __version__
from dsa_bench.cli import app

COMMANDS = [[], ["run"], ["list"], ["validate"], ["pack"], ["unpack"], ["compare"], ["export"], ["layout"], ["report"],
            ["baseline"], ["baseline", "update"], ["results"], ["results", "merge"]]  # fmt: skip


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "250"}, terminal_width=250)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "dsa-bench")
def test_help_shows_plain_metavars_and_flags_bare(command):
    text = _help(*command)
    assert not re.search(r"<(bool|str|int|float|Path|list\[\w+\])>", text), text
    assert not re.search(r"--help +\S+ +Show", text) and not re.search(r"--no-save +\S+ +Do not", text), text


def test_run_help_keeps_the_ray_extra_and_validate_names_only_real_options():
    assert "pip install 'dsa-bench[ray]'" in _help("run")
    assert re.search(r"--seed +INTEGER +Base seed", _help("run")) and re.search(r"--no-save +Do not write", _help("run"))
    assert "--definition" not in _help("validate")


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"dsa-bench {__version__}\n"


def test_run_options_are_the_run_requests_fields():
    """`run` is built from RunRequest: each field is one option, with the field's help and default (declared once)."""
    from typer.main import get_command

    from dsa_bench.run.request import TOLERANCE_OPTIONS, RunRequest
    from dsa_bench.workloads import TOLERANCES

    options = {p.name: p for p in get_command(app).commands["run"].params}  # type: ignore[attr-defined]
    assert set(options) == set(RunRequest.model_fields)
    for name, info in RunRequest.model_fields.items():
        assert options[name].help == info.description, name
        assert options[name].required == info.is_required(), name
        if not info.is_required():
            assert (options[name].default or None) == (info.get_default(call_default_factory=True) or None), name
    assert options["l2_flush"].default == "clean" and options["case_timeout"].default == 600.0
    assert TOLERANCE_OPTIONS == TOLERANCES


def test_a_request_hands_its_options_to_the_case_loop_and_records_the_marked_ones():
    """RunOptions fields named as RunRequest's receive the option as given; `Recorded` ones reach the results header."""
    from conftest import ROOT

    from dsa_bench.run.plan import plan_run
    from dsa_bench.run.request import RunRequest

    request = RunRequest(workload="indexer_smoke", solutions=["reference"], device="cpu", no_save=True, worker_user="harness",
                         l2_flush="dirty", speedup_over="reference")  # fmt: skip
    plan = plan_run(request, ROOT)
    assert (plan.options.worker_user, plan.options.l2_flush, plan.options.speedup_over) == ("harness", "dirty", "reference")
    assert str(plan.options.device) == "cpu" and plan.header().written()["speedup_over"] == "reference"


def test_cuda_graph_is_a_bare_flag_handed_to_the_workers_and_recorded(monkeypatch):
    """run --cuda-graph reaches RunOptions and every worker's config, the plan's line and the header's launch field
    (a GPU run's timer and copy bandwidth stand in here, so no GPU is needed)."""
    from conftest import ROOT

    from dsa_bench.run import plan as plan_module
    from dsa_bench.run.request import RunRequest
    from dsa_bench.run.runner import WorkerHandle

    assert re.search(r"--cuda-graph +Time each call as the replay of a CUDA graph", _help("run"))
    monkeypatch.setattr(plan_module, "choose_timer", lambda requested, device: ("cupti", None))
    monkeypatch.setattr(plan_module, "measure_copy_bandwidth", lambda device: 3e12)
    for cuda_graph, line, launch in ((True, "timing with cupti, clean L2 flush, CUDA-graph replay", "cuda_graph"),
                                     (False, "timing with cupti, clean L2 flush", "eager")):  # fmt: skip
        request = RunRequest(workload="indexer_smoke", solutions=["reference"], device="cpu", no_save=True, cuda_graph=cuda_graph)
        plan = plan_module.plan_run(request, ROOT)
        assert plan.options.cuda_graph is cuda_graph and plan.mode == line
        assert plan.header().written()["launch"] == launch
        handle = WorkerHandle(plan.solutions[0], plan.workload.definition.name, plan.options, plan.identities["reference"])
        assert handle.config.cuda_graph is cuda_graph
