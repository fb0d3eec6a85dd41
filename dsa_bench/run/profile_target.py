"""The process a profiler watches: ``python -m dsa_bench.run.profile_target JOB.pkl``.

``dsa-bench profile`` (:mod:`dsa_bench.run.profile`) starts this under Nsight Compute or Nsight
Systems. It does only the case's own work: it builds the input set a run builds for the case (same
generator, same seed), imports the solution as a worker does (:mod:`dsa_bench.run.loader`), makes
a few warm-up calls (compilation, autotuning, CUDA-graph capture happen there), then one call
between ``cudaProfilerStart`` and ``cudaProfilerStop``, inside an NVTX range named
:data:`PROFILE_RANGE`. The profilers are told to collect only inside that window
(``--profile-from-start off``, ``--capture-range cudaProfilerApi``), so neither the inputs, the
warm-up nor the harness's reference and checks are in the report. The L2 is flushed (clean) before
every call, as in a timed run. Outputs are not checked here: ``dsa-bench run`` does that.

It writes one JSON line to the job's ``status_path``: ``{"ok": true}`` or the exception.
"""

from __future__ import annotations

import json
import pickle
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the NVTX range around the profiled call
PROFILE_RANGE = "dsa-bench/profile"


@dataclass(frozen=True)
class ProfileJob:
    solution_path: str
    packed_from: str | None
    definition: str
    dataset_root: str | None
    case: Any  # dsa_bench.workloads.Case
    seed: int
    warmup: int
    device: str
    status_path: str


def profile_call(job: ProfileJob) -> None:
    """Build the inputs, warm up, then the one profiled call (see the module's docstring)."""
    import dataclasses

    import torch

    from dsa_bench.definitions import get_definition
    from dsa_bench.run.loader import import_entry
    from dsa_bench.run.worker import call_solution
    from dsa_bench.solution import load_solution
    from dsa_bench.timing.flush import L2Flusher
    from dsa_bench.workloads import build_inputs

    device = torch.device(job.device)
    on_gpu = device.type == "cuda"  # a CPU device only in the tests of this module's path (profile itself refuses one)
    if on_gpu:
        torch.cuda.set_device(device)
    if job.dataset_root is not None:
        from dsa_bench.definitions.from_dataset import register_dataset_definition

        register_dataset_definition(Path(job.dataset_root), job.definition)
    definition = get_definition(job.definition)
    solution = load_solution(Path(job.solution_path))
    if job.packed_from is not None:
        solution = dataclasses.replace(solution, packed_from=Path(job.packed_from))
    fn, _ = import_entry(solution, job.definition)
    dps = solution.entry_for(job.definition).destination_passing_style
    names = [spec.name for spec in definition.outputs]
    inputs = build_inputs(definition, job.case, job.seed, device)
    args = definition.input_args(inputs)
    outputs = definition.allocate_outputs(definition.axes(job.case.axes), device)
    flush = L2Flusher(device).flush if on_gpu else (lambda: None)
    for _ in range(job.warmup):
        definition.poison_outputs(outputs)
        flush()
        call_solution(fn, dps, args, outputs, names)
    definition.poison_outputs(outputs)
    flush()
    if not on_gpu:
        call_solution(fn, dps, args, outputs, names)
        return
    torch.cuda.synchronize(device)
    torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(PROFILE_RANGE)
    call_solution(fn, dps, args, outputs, names)
    torch.cuda.synchronize(device)
    torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()


def main(argv: list[str]) -> int:
    job: ProfileJob = pickle.loads(Path(argv[0]).read_bytes())  # written by the harness for this process
    try:
        profile_call(job)
        status: dict[str, Any] = {"ok": True}
    except BaseException:
        status = {"ok": False, "error": traceback.format_exc()[-20_000:]}
    Path(job.status_path).write_text(json.dumps(status))
    return 0 if status["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
