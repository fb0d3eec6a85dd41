"""Whether this process runs the Triton kernels under Triton's interpreter: the one check every family uses.

``@triton.jit`` decides when it runs (at import) whether it makes a compiled or an interpreted
function, from ``TRITON_INTERPRET``; so a function jitted here says, not the environment read
later, and every family's kernels, imported in the same process, were made the same way.
"""

from __future__ import annotations

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _probe():
    pass


#: True when the kernels run under the interpreter (on CPU tensors), False when Triton compiles them.
INTERPRETED: bool = isinstance(_probe, InterpretedFunction)

#: What a caller is told when it hands CPU tensors to compiled kernels.
NEEDS_INTERPRETER = "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before the solution is imported"


def device_problem(device: torch.device) -> str | None:
    """Why the kernels cannot run on tensors of ``device`` (None: they can)."""
    if not INTERPRETED and device.type != "cuda":
        return f"tensors on {device}: {NEEDS_INTERPRETER}"
    return None


def interpreted(device: torch.device) -> bool:
    """Whether the kernels run under the interpreter for tensors on ``device``; raises RuntimeError
    for CPU tensors when Triton compiles (compiled kernels need CUDA tensors)."""
    problem = device_problem(device)
    if problem is not None:
        raise RuntimeError(problem)
    return INTERPRETED
