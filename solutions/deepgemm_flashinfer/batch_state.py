"""What an inference engine keeps per decode batch, for the indexer peers; and their input checks.

A real engine computes the indexer's batch metadata (DeepGEMM's schedule of the paged logits,
SGLang's token-level page table) once per batch step from ``seq_lens`` and ``block_table`` and
reuses it in every layer. The peers do the same: :class:`BatchCache` keeps one state per pair
of those tensors for as long as both live unmodified, so only the first call with a new pair
(a correctness call or a warm-up call, untimed) computes it. That is sound under the harness's
timing protocol: between timed calls it redraws the queries and head weights in place
(``indexer.draw_queries``), never ``seq_lens`` or ``block_table``; and a tensor modified in
place by torch bumps its version counter, which misses the cache.

Each state also keeps the CUDA graphs of its calls (:func:`replay`), keyed by the addresses of
the call's tensors: a replay re-reads their memory, so it computes afresh on whatever the
queries, weights and cache hold; only the launch sequence and the batch's metadata are kept.

This file is the same in solutions/deepgemm_sglang and solutions/deepgemm_flashinfer
(tests/solutions/test_indexer_peers.py checks it).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from dsa_bench.definitions.indexer import HEAD_DIM, INDEXER_KEY_PAGE, NUM_HEADS, PAGE_SIZE, TOPK

#: at most this many batch states are kept (a run holds a few input sets per case at a time)
MAX_BATCHES = 64


def check_inputs(q, cache, weights, seq_lens, block_table, topk_indices, topk: int = TOPK) -> None:
    """Shapes, dtypes, devices and the contiguity the peers' kernels need, from metadata only
    (``topk``: the definition's selection size, the output's width)."""
    batch = block_table.shape[0]
    problems = []
    if q.dtype != torch.float8_e4m3fn or tuple(q.shape) != (batch, NUM_HEADS, HEAD_DIM) or not q.is_contiguous():
        want = f"[{batch}, {NUM_HEADS}, {HEAD_DIM}]"
        problems.append(f"q_index_fp8 must be contiguous float8_e4m3fn {want}, got {q.dtype} {tuple(q.shape)}")
    page = (PAGE_SIZE, 1, INDEXER_KEY_PAGE.bytes_per_token)
    if cache.element_size() != 1 or cache.dim() != 4 or tuple(cache.shape[1:]) != page or not cache.is_contiguous():
        want = f"[num_pages, {', '.join(map(str, page))}]"
        problems.append(f"k_index_cache_fp8 must be a contiguous 1-byte {want} tensor, got {cache.dtype} {tuple(cache.shape)}")
    if weights.dtype != torch.float32 or tuple(weights.shape) != (batch, NUM_HEADS) or not weights.is_contiguous():
        problems.append(f"weights must be contiguous float32 [{batch}, {NUM_HEADS}], got {weights.dtype} {tuple(weights.shape)}")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (batch,) or not seq_lens.is_contiguous():
        problems.append(f"seq_lens must be contiguous int32 [{batch}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or not block_table.is_contiguous():
        problems.append(f"block_table must be a contiguous int32 matrix, got {block_table.dtype} {tuple(block_table.shape)}")
    if topk_indices.dtype != torch.int32 or tuple(topk_indices.shape) != (batch, topk) or not topk_indices.is_contiguous():
        problems.append(f"topk_indices must be contiguous int32 [{batch}, {topk}], got {topk_indices.dtype} {tuple(topk_indices.shape)}")
    devices = {t.device.type for t in (q, cache, weights, seq_lens, block_table, topk_indices)}
    if devices != {"cuda"}:
        problems.append(f"every tensor must be on the GPU, got {sorted(devices)}")
    if problems:
        raise ValueError("; ".join(problems))


class BatchState:
    """One batch's metadata (``data``, made by the peer) and the CUDA graphs of its calls."""

    def __init__(self, data: Any) -> None:
        self.data = data
        #: per argument set: its graph and what the launch returned while captured (tensors every replay rewrites)
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Any]] = {}


class BatchCache:
    """The state of each (seq_lens, block_table) pair of tensors, made once by ``make`` while both
    tensors live and keep their version (an in-place change by torch bumps it)."""

    def __init__(self, make: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
        self.make = make
        self.entries: dict[tuple[int, int], tuple[Any, Any, int, int, BatchState]] = {}
        self.made = 0  # how many states were made (what the tests watch)

    def get(self, seq_lens: torch.Tensor, block_table: torch.Tensor) -> BatchState:
        key = (id(seq_lens), id(block_table))
        entry = self.entries.get(key)
        if entry is not None:
            seq_ref, table_ref, seq_version, table_version, state = entry
            if seq_ref() is seq_lens and table_ref() is block_table and (seq_version, table_version) == (
                seq_lens._version, block_table._version
            ):
                return state
        state = BatchState(self.make(seq_lens, block_table))
        self.made += 1

        def forget(dead: Any, key: tuple[int, int] = key) -> None:  # a tensor of the pair died: its state goes too
            current = self.entries.get(key)
            if current is not None and dead in (current[0], current[1]):
                del self.entries[key]

        refs = (weakref.ref(seq_lens, forget), weakref.ref(block_table, forget))
        self.entries[key] = (*refs, seq_lens._version, block_table._version, state)
        while len(self.entries) > MAX_BATCHES:
            del self.entries[next(iter(self.entries))]
        return state


def _signature(tensors: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors)


class GraphReplay:
    """Runs a call's launches through one captured CUDA graph per batch state and argument addresses,
    and returns what ``launch`` returned: eagerly, its result; replayed, the result it returned while
    captured (tensors of the graph's pool that every replay rewrites).

    The first call of an argument signature runs eagerly (the peers' kernels compile at first
    use, which cannot happen during a capture). If a capture fails, every later call runs
    eagerly and ``disabled_reason`` says why (the peers report it in their notes). Inside a
    capture of the caller's (run --cuda-graph) the launches run as they are, into that capture
    (a capture cannot nest), and nothing here changes.
    """

    def __init__(self) -> None:
        self.warmed: set[tuple] = set()
        self.pool: Any = None
        self.disabled_reason: str | None = None

    def __call__(self, state: BatchState, launch: Callable[[], Any], tensors: tuple[torch.Tensor, ...]) -> Any:
        if self.disabled_reason is not None or torch.cuda.is_current_stream_capturing():
            return launch()
        signature = _signature(tensors)
        if signature not in self.warmed:
            self.warmed.add(signature)
            return launch()
        key = (signature, tuple(t.data_ptr() for t in tensors))
        entry = state.graphs.get(key)
        if entry is None:
            try:
                self.pool = self.pool or torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    result = launch()
            except Exception as exc:  # reported through the notes, then eager for good
                self.disabled_reason = f"{type(exc).__name__}: {exc}"
                return launch()
            entry = state.graphs[key] = (graph, result)
        graph, result = entry
        graph.replay()
        return result

    def notes(self) -> str:
        if self.disabled_reason is not None:
            return f"CUDA graph capture failed ({self.disabled_reason}), kernels launched eagerly"
        return "each call is replayed as one CUDA graph per batch and argument set"
