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


#: GPU: 8 tokens (8 KiB of bf16 rows, ~4.5 KiB of records) per 1-warp program, for every format.
#: The H200 sweeps at T = 16384, 65536 and 262144 (benchmarks/h200/kv_insert.json) put 8x1 within
#: 4 % of each sweep's best tile for V3.2, V4 and V4.1. Against the tiles it replaced, all reading
#: rows beside their slots: 1.5-3 % faster than 16x4 for V3.2, within 1.3 % of it for V4, and 3-7 %
#: faster than 16x2 for V4.1, whose 18 scale tiles per token make it the most compute-heavy.
GPU_TILE = LaunchTile(tokens=8, num_warps=1)
#: Calls of at most SMALL_CALL_TOKENS tokens (decode-time inserts: latency, not bandwidth) take 4
#: tokens on 4 warps: a program's masked-off token rows still cost it their instructions, and
#: more warps per token shorten its chain. The H200 sweep at T = 1, 64, 1024 and 4096
#: (benchmarks/h200/kv_insert_tiles_small.json) put 4x4 first, or within 8 % of 1x4, for every format:
#: 1.05-1.6x faster than 16x4 and 8x1 (T = 1: 1.45 / 1.80 / 2.19 µs for V3.2 / V4 / V4.1).
SMALL_CALL_TOKENS = 4096
SMALL_CALL_TILE = LaunchTile(tokens=4, num_warps=4)
#: The interpreter runs programs one after another: few large numpy-vectorised programs.
INTERPRETER_MAX_TOKENS = 256


def default_tile(num_tokens: int) -> LaunchTile:
    if INTERPRETED:
        return LaunchTile(min(INTERPRETER_MAX_TOKENS, triton.next_power_of_2(max(num_tokens, 1))), 4)
    return SMALL_CALL_TILE if num_tokens <= SMALL_CALL_TOKENS else GPU_TILE
