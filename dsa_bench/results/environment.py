"""What produced a run's numbers: machine, versions and, on a GPU, the device's identity.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

import dsa_bench


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What produced these numbers: machine, versions and, on a GPU, the device's identity."""
    env: dict[str, Any] = {
        "dsa_bench": dsa_bench.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cupti_python": _version("cupti-python"),
        "device": str(device),
        "hostname": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )
        from dsa_bench.timing.clocks import driver_info

        env.update(driver_info(device.index if device.index is not None else torch.cuda.current_device()))
    else:
        env["gpu"] = None
    return env
