"""The production peer's KV writes: record bytes scattered into a paged cache with torch ops, no host sync.

A -1 slot must write nothing, and compacting the kept tokens (a boolean mask) would read their count back to
the host. Instead a -1 token repeats the write of the first kept token (the same bytes to the same place, so
the order of the duplicate writes does not matter), or, when no token is kept, rewrites slot 0's current
bytes. Torch only (no GPU library), so it is tested on a CPU.
"""

from __future__ import annotations

import torch

from dsa_bench.definitions.kv_records import KvRecordFormat, RecordParts

BLOCK_SIZE = 64


def _scatter_rows(rows: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """``rows[block, offset] = values`` for every slot >= 0, without reading anything back to the host."""
    keep = slots >= 0
    # The first kept token (0 when none is kept), as a 1-element index: indexing with a 0-dim tensor
    # would read it back to the host (torch turns it into a Python int), which a CUDA graph cannot capture.
    first = torch.argmax(keep.to(torch.int32)).reshape(1)
    any_kept = keep.any()
    target = torch.where(keep, slots, torch.where(any_kept, slots.index_select(0, first), 0))
    block, offset = target // BLOCK_SIZE, target % BLOCK_SIZE
    stand_in = torch.where(any_kept, values.index_select(0, first)[0], rows[0, 0])  # same bytes to the same place: order does not matter
    rows[block, offset] = torch.where(keep[:, None], values, stand_in[None, :])


def write_records(fmt: KvRecordFormat, cache: torch.Tensor, slots: torch.Tensor, parts: RecordParts) -> None:
    """``fmt.write`` of ``parts`` at ``slots`` (-1 skipped), without a host synchronisation."""
    data, scale_rows, _ = fmt._rows(cache, BLOCK_SIZE)
    if fmt.layout == "per_token":
        _scatter_rows(data, slots, torch.cat([parts.values, parts.scales, parts.rope], dim=1))
    else:
        _scatter_rows(data, slots, torch.cat([parts.values, parts.rope], dim=1))
        _scatter_rows(scale_rows, slots, parts.scales)


