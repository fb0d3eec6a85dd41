"""Verifying packed JSON: unpack each alone and run it, in a fresh process, on its definition's smoke workloads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_yaml
from dsa_bench.pack.document import read_solution_document
from dsa_bench.pack.pack import unpack_solutions


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


def verify_packed(packed: list[Path], root: Path, device: str = "auto", timeout_s: float = 1800.0) -> list[VerifyResult]:
    """Unpack each JSON alone into a temporary folder and run it on its definition's smoke workloads.

    The run is a real ``dsa-bench run`` in a fresh process, so a file the packer missed makes
    the import (or build) fail exactly as it would for whoever receives the JSON. On a GPU the
    run also times, briefly (1 trial of 1 call): verification is about completeness, not speed.
    CUDA sources are compiled from scratch, as the recipient would.
    """
    results: list[VerifyResult] = []
    for path in packed:
        document = read_solution_document(path)
        definition = document["definition"]
        workloads = smoke_workloads(definition, root)
        if not workloads:
            raise DsaBenchError(f"no smoke workload (workloads/*_smoke.yaml) for definition {definition!r}; cannot verify", str(path))
        with tempfile.TemporaryDirectory(prefix="dsa-bench-verify-") as tmp:
            os.chmod(tmp, 0o755)  # readable by the unprivileged worker users of a run under root
            # a distinct name: `run` treats a solution named "reference" as the project's own
            folder = unpack_solutions([path], Path(tmp) / "solution", name=f"packed-{document['name'].removesuffix('_' + definition)}")
            for workload in workloads:
                command = [
                    sys.executable, "-m", "dsa_bench", "run", "--workload", workload, "--solution", str(folder),
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
