"""Head padding for FlashMLA: its sparse decode takes 64 or 128 query heads; a GPU of a TP8 (TP4)
deployment of a 128-head model holds 16 (32). Serving engines pad such calls to 64 heads and slice the
result (vLLM's FlashMLA sparse backend does); these helpers do the same, in torch only (no flash_mla),
so they are tested on a CPU.

Padded heads get zero queries (their logits are all 0, finite: the records they read are the real
heads' records) and no sink (-inf); their outputs are computed and thrown away, which is the 4x (2x)
work padding costs.
"""

from __future__ import annotations

import torch

#: The head counts FlashMLA's sparse decode kernels take.
FLASHMLA_HEADS = (64, 128)


def flashmla_heads(h_q: int) -> int:
    """The head count FlashMLA runs a call of ``h_q`` heads with: ``h_q`` itself when it takes it, else
    the smallest count above (64 for 16 and 32). ValueError when none is (h_q above 128)."""
    if h_q in FLASHMLA_HEADS:
        return h_q
    if 0 < h_q < FLASHMLA_HEADS[0]:
        return FLASHMLA_HEADS[0]
    raise ValueError(f"h_q = {h_q}: FlashMLA's sparse decode takes {' or '.join(map(str, FLASHMLA_HEADS))} heads, "
                     f"and only fewer than {FLASHMLA_HEADS[0]} are padded up")


def pad_heads(q: torch.Tensor, attn_sink: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [b, s_q, h_q, d]`` and ``attn_sink [h_q]`` padded to ``heads``: zero queries and -inf sinks
    after the real heads (new tensors, contiguous)."""
    b, s_q, h_q, d = q.shape
    padded_q = q.new_zeros(b, s_q, heads, d)
    padded_q[:, :, :h_q] = q
    padded_sink = attn_sink.new_full((heads,), float("-inf"))
    padded_sink[:h_q] = attn_sink
    return padded_q, padded_sink


def slice_heads(out: torch.Tensor, lse: torch.Tensor, h_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``h_q`` heads of ``out [b, s_q, heads, d_v]`` and ``lse [b, s_q, heads]`` (views, no copy)."""
    return out[:, :, :h_q], lse[:, :, :h_q]
