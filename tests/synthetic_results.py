"""Results files with chosen latencies and spreads, written through dsa-bench's own results classes."""

from __future__ import annotations

from pathlib import Path

from dsa_bench.definitions.status import Status
from dsa_bench.results.records import CaseRecord, ResultsFile, ResultsHeader, Timing
from dsa_bench.run.runner import assign_peer_speedups

GPU_ENVIRONMENT = {"dsa_bench": "0.1.0", "torch": "2.11.0", "device": "cuda:0", "gpu": "NVIDIA H200", "sm_count": 132}
CPU_ENVIRONMENT = {"dsa_bench": "0.1.0", "torch": "2.13.0", "device": "cpu", "gpu": None}


def timing(mean_ms: float, spread: float, timer: str = "cupti") -> Timing:
    """Three trials whose medians have exactly this mean and (max - min) / mean spread."""
    medians = [mean_ms * (1 - spread / 2), mean_ms, mean_ms * (1 + spread / 2)]
    return Timing(timer=timer, samples_ms=[[m] * 5 for m in medians])


def write_results(
    path: Path,
    workload: str,
    latencies: dict[str, dict[str, float | None]],
    spread: float = 0.01,
    spreads: dict[tuple[str, str], float] | None = None,
    failures: dict[tuple[str, str], Status] | None = None,
    timed: bool = True,
    hashes: dict[str, str] | None = None,
    gpu: str = "NVIDIA H200",
    l2_flush: str | None = "clean",
    peers: tuple[str, ...] | None = None,
    launch: str | None = None,
) -> Path:
    """``latencies[case][solution]`` in ms (the reference among them); ``failures`` marks records failed;
    ``peers`` (None: a file from before peer speedups) are the solutions the peer speedups are measured against;
    ``launch`` None writes no launch field (a file from before run --cuda-graph)."""
    spreads = spreads or {}
    failures = failures or {}
    solutions = list(dict.fromkeys(s for per_case in latencies.values() for s in per_case))
    header = {
        "workload": {
            "name": workload,
            "path": f"workloads/{workload}.yaml",
            "trace": f"traces/{workload}.jsonl",
            "definition": "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64",
        },
        "settings": {"seed": 1, "input_sets": 2, "warmup": 10, "iterations": 50, "trials": 3},
        "timer": "cupti" if timed else None,
        **({"l2_flush": l2_flush if timed else None} if l2_flush is not None else {}),  # None: a file from before the flush modes
        **({"launch": launch if timed else None} if launch is not None else {}),
        "environment": {**GPU_ENVIRONMENT, "gpu": gpu} if timed else CPU_ENVIRONMENT,
        "solutions": {s: {"path": f"solutions/{s}", "content_hash": (hashes or {}).get(s, f"hash-{s}")} for s in solutions},
        **({"peers": list(peers), "speedup_over": None} if peers is not None else {}),
    }
    results = ResultsFile(path, ResultsHeader.model_validate(header))
    for number, (case, per_solution) in enumerate(latencies.items()):
        reference_ms = per_solution.get("reference")
        case_records = []
        for solution, ms in per_solution.items():
            status = failures.get((case, solution), Status.PASSED)
            record = CaseRecord(
                case=case, solution=solution, axes={"batch_size": number + 1, "max_num_pages": 4 * (number + 1)}, status=status
            )
            if status is not Status.PASSED:
                record.message = "synthetic failure"
            elif timed and ms is not None:
                record.timing = timing(ms, spreads.get((case, solution), spread))
                if reference_ms is not None and (case, "reference") not in failures:
                    record.speedup = reference_ms / record.timing.mean_ms  # as the runner computes it
            case_records.append(record)
        if peers is not None:
            assign_peer_speedups(case_records, set(peers), None)
        for record in case_records:
            results.add(record)
    results.update(complete=True)
    return path
