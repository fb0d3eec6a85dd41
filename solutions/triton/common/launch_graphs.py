"""Replaying a short multi-kernel launch sequence as one CUDA graph per argument set.

The indexer's scored path is two short kernels. Launched from Python, the GPU idles between
them while the host prepares the second launch (Triton's launcher alone takes longer than either
kernel), and that gap is most of the time. A graph submits both at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch


def _key_part(arg: Any) -> tuple:
    if isinstance(arg, torch.Tensor):
        return ("tensor", tuple(arg.shape), tuple(arg.stride()), arg.dtype, arg.device, arg.data_ptr())
    return ("value", arg)  # scalars and plans are baked into the captured launches: key by value


class LaunchGraphs:
    """Calls ``fn(*args)`` through one captured CUDA graph per argument set.

    Graphs are keyed by every tensor argument's address, shape, stride and dtype and by the value
    of every other argument (which the capture bakes in). A replay re-reads the tensors' memory,
    so every call computes afresh on whatever they hold: nothing is cached but the launch
    sequence. Temporaries ``fn`` allocates while captured come from one graph memory pool shared
    by all graphs; that is safe because graphs replay one at a time on the caller's stream and
    each uses its temporaries only within its own replay.

    The first call of an argument signature (everything but the addresses) runs eagerly: it
    compiles the kernels, which cannot happen during a capture. If a capture fails, every later
    call runs eagerly and ``disabled_reason`` says why (the entries report it in their notes).
    """

    def __init__(self, fn: Callable[..., Any], capacity: int = 64) -> None:
        self.fn = fn
        self.capacity = capacity
        self.graphs: OrderedDict[tuple, torch.cuda.CUDAGraph] = OrderedDict()
        self.warmed: set[tuple] = set()
        self.pool = None
        self.disabled_reason: str | None = None

    def __call__(self, *args: Any) -> None:
        if self.disabled_reason is not None or torch.cuda.is_current_stream_capturing():
            self.fn(*args)
            return
        key = tuple(_key_part(a) for a in args)
        signature = tuple(part[:-1] if part[0] == "tensor" else part for part in key)
        graph = self.graphs.get(key)
        if graph is None:
            if signature not in self.warmed:
                self.warmed.add(signature)
                self.fn(*args)
                return
            try:
                self.pool = self.pool or torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.fn(*args)
            except Exception as exc:  # reported through the entry's notes, then eager for good
                self.disabled_reason = f"{type(exc).__name__}: {exc}"
                self.fn(*args)
                return
            self.graphs[key] = graph
            while len(self.graphs) > self.capacity:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        graph.replay()
