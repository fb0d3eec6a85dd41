"""Stopping a run from outside: Ctrl-C under `| tee log`, SIGINT to a background job, and the
`--resume` command every interrupted run prints (docs/running.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import FIXTURES, ROOT

SLEEPS = FIXTURES / "adversarial" / "sleeps"


def _wait_for_a_record(save, proc, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and not (save.exists() and json.loads(save.read_text())["records"]):
        assert proc.poll() is None, "the run ended before it was interrupted"
        time.sleep(0.2)
    time.sleep(1)  # the sleeping solution's call is under way


@pytest.mark.slow  # a run interrupted and resumed (~11 s on two cores)
def test_sigint_to_a_background_run_under_a_gone_pipe_ends_it_with_130_and_the_resume_command(tmp_path):
    """As `dsa-bench run ... | tee log &` from a script, then `kill -INT` (which also ends tee):
    SIGINT arrives ignored from the shell, and stdout's reader is gone when the summary is printed."""
    save = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsa_bench", "run", "-w", "indexer_smoke", "-c", "smoke_scored", "-s", "reference", "-s", str(SLEEPS),
         "--case-timeout", "120", "--save", str(save)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # what `&` in a non-interactive shell does
    )  # fmt: skip
    try:
        _wait_for_a_record(save, proc)
        proc.stdout.close()  # tee is gone
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)  # stderr holds a few lines: it cannot fill its pipe and block the run
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT: 1 finished records kept" in err, err
    assert "reference" in err and "1/1" in err, "the summary reaches stderr when stdout is gone: " + err
    expected = (f"to finish it: dsa-bench run --workload indexer_smoke --solution reference --solution {SLEEPS} --case smoke_scored "
                f"--case-timeout 120.0 --resume {save}")
    assert expected in err, err
    assert "Traceback" not in err and json.loads(save.read_text())["complete"] is False
