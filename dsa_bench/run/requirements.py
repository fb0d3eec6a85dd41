"""Whether a solution's ``requires`` hold in this process: the reason it must be skipped, if any.

Run inside the solution's worker, before its entry is imported, so the verdict is about the
interpreter and device the solution would actually run in. A required module is imported for
real (a wheel built for another torch fails only then, with an undefined symbol), and its
distribution's version is checked against the manifest's requirement.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from dsa_bench.solution import Requirements


def unmet(requires: Requirements, device: Any) -> str | None:
    """Why this solution cannot run here (device first, then each module), or None."""
    if requires.cuda_capabilities:
        wanted = " or ".join(requires.cuda_capabilities)
        if device.type != "cuda":
            return f"needs a CUDA GPU ({wanted}); this run has none"
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        here = f"sm_{major}{minor}"
        if not any(cap.rstrip("a") == here for cap in requires.cuda_capabilities):
            return f"needs a GPU of {wanted}; this one ({torch.cuda.get_device_name(device)}) is {here}"
    for module, requirement in requires.modules.items():
        reason = _module_unmet(module, requirement)
        if reason is not None:
            return reason
    return None


def _module_unmet(module: str, requirement: str) -> str | None:
    from packaging.requirements import Requirement

    wanted = Requirement(requirement)
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, OSError of a missing .so, RuntimeError of an ABI check
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        return f"{module} cannot be imported ({type(exc).__name__}: {first_line}); it comes from `pip install {requirement}`"
    found = installed_version(wanted.name)
    if found is None:
        return f"{module} imports, but no installed distribution {wanted.name!r} provides it (needs {requirement})"
    if wanted.specifier and not wanted.specifier.contains(found, prereleases=True):
        return f"needs {requirement}, found {wanted.name} {found}"
    return None


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(requires: Requirements) -> dict[str, str]:
    """Installed versions of the distributions a solution requires (recorded with its results)."""
    from packaging.requirements import Requirement

    found = {}
    for requirement in requires.modules.values():
        name = Requirement(requirement).name
        version = installed_version(name)
        if version is not None:
            found[name] = version
    return found
