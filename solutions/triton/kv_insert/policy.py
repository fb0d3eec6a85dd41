"""How a KV insert call is tiled: tokens and warps per program, chosen from the call's token count."""

from __future__ import annotations

from dataclasses import dataclass

import triton

from ..common.interpreter import INTERPRETED


@dataclass(frozen=True)
class LaunchTile:
    """Tokens per program and warps per program."""

    tokens: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.tokens & (self.tokens - 1):
            raise ValueError(f"{self}: tokens per program must be a power of two")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self}: num_warps must be 1, 2, 4, 8 or 16")


#: GPU: 8 tokens (8 KiB of bf16 rows, ~4.5 KiB of records) per 1-warp program, for every format:
#: many small programs keep more independent loads in flight per SM. The H200 sweeps at large T
#: put 8x1 at or near each sweep's best tile for V3.2, V4 and V4.1 (docs/kernels/kv_insert.md,
#: "Grid and tiles"; benchmarks/h200/kv_insert.json).
GPU_TILE = LaunchTile(tokens=8, num_warps=1)
#: Calls of at most SMALL_CALL_TOKENS tokens (decode-time inserts: latency, not bandwidth) take 4
#: tokens on 4 warps: a program's masked-off token rows still cost it their instructions, and
#: more warps per token shorten its chain. The H200 sweep of small T put 4x4 first or near it for
#: every format (benchmarks/h200/kv_insert_tiles_small.json).
SMALL_CALL_TOKENS = 4096
SMALL_CALL_TILE = LaunchTile(tokens=4, num_warps=4)
#: The interpreter runs programs one after another: few large numpy-vectorised programs.
INTERPRETER_MAX_TOKENS = 256


def default_tile(num_tokens: int) -> LaunchTile:
    if INTERPRETED:
        return LaunchTile(min(INTERPRETER_MAX_TOKENS, triton.next_power_of_2(max(num_tokens, 1))), 4)
    return SMALL_CALL_TILE if num_tokens <= SMALL_CALL_TOKENS else GPU_TILE
