"""Verifying packed JSON: check its imports as flashinfer-bench resolves them, then run it alone, as
flashinfer-bench imports it, in a fresh process, on its definition's smoke workloads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_yaml
from dsa_bench.flashinfer_bench.packed import import_problems
from dsa_bench.pack.document import read_solution_document


@dataclass
class VerifyResult:
    packed: Path
    workload: str
    passed: bool
    output: str  # the run's output (tail), for the user


def smoke_workloads(definition: str, root: Path) -> list[str]:
    """Names of ``workloads/*_smoke.yaml`` whose definition is ``definition``."""
    found = []
    for path in sorted((root / "workloads").glob("*_smoke.yaml")):
        try:
            data = read_yaml(path, "workload")
        except DsaBenchError:
            continue  # a broken workload file is reported by `validate`, not by packing
        if isinstance(data, dict) and data.get("definition") == definition:
            found.append(path.stem)
    return found


def verify_packed(
    packed: list[Path],
    root: Path,
    device: str = "auto",
    timeout_s: float = 1800.0,
    on_start: Callable[[str], None] = lambda text: None,
) -> list[VerifyResult]:
    """Check each JSON's imports as flashinfer-bench resolves them, then run it on its definition's smoke workloads.

    A Python or Triton source that imports a packed module by its absolute name fails at once,
    naming the file, line and import (:func:`~dsa_bench.flashinfer_bench.packed.import_problems`): it runs
    under dsa-bench's folder loader but not where flashinfer-bench imports it. Otherwise the JSON
    runs with ``dsa-bench run -s FILE.json`` in a fresh process, which lays it out and imports it
    as flashinfer-bench does (:func:`~dsa_bench.flashinfer_bench.packed.materialize`), so a file the
    packer missed, or an import only the folder loader resolves, fails the import (or build)
    exactly as it would for whoever receives the JSON. On a GPU the run also times, briefly (1
    trial of 1 call): verification is about completeness, not speed. CUDA sources are compiled
    from scratch, as the recipient would. ``on_start`` hears, before each run, what runs now and
    how far verification is (a run can take minutes: a CUDA build, the interpreter on a CPU).
    """
    results: list[VerifyResult] = []
    started = time.monotonic()
    runs = sum(len(smoke_workloads(read_solution_document(path)["definition"], root)) for path in packed)
    done = 0
    for path in packed:
        document = read_solution_document(path)
        definition = document["definition"]
        workloads = smoke_workloads(definition, root)
        if not workloads:
            raise DsaBenchError(f"no smoke workload (workloads/*_smoke.yaml) for definition {definition!r}; cannot verify", str(path))
        problems = import_problems(document, str(path))
        if problems:
            results.append(VerifyResult(path, "flashinfer-bench's import", False, "\n".join(problems)))
            continue
        with tempfile.TemporaryDirectory(prefix="dsa-bench-verify-") as tmp:
            for workload in workloads:
                done += 1
                on_start(f"[{done}/{runs}] verifying {path.name} on {workload} ({time.monotonic() - started:.0f} s so far)")
                command = [
                    sys.executable, "-m", "dsa_bench", "run", "--workload", workload, "--solution", str(path.resolve()),
                    "--device", device, "--warmup", "0", "--iterations", "1", "--trials", "1", "--no-save",
                ]  # fmt: skip
                # A fresh extension cache: a build cached from the original folder could hide a
                # header the packer missed (torch's JIT cache key covers only the listed sources).
                env = {**os.environ, "DSA_BENCH_ROOT": str(root), "TORCH_EXTENSIONS_DIR": str(Path(tmp) / "torch_extensions")}
                env.pop("TRITON_INTERPRET", None)  # the harness sets it in CPU workers itself
                try:
                    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
                except subprocess.TimeoutExpired:
                    results.append(VerifyResult(path, workload, False, f"no result within {timeout_s:g} s"))
                    continue
                output = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
                results.append(VerifyResult(path, workload, proc.returncode == 0, output))
    return results
