"""Hits@k for cell selection (paper Table 6): the share of questions with a candidate (answer) cell among the top k.

Questions with no surviving candidate (answer nowhere, or truncated away) count as misses.
"""

from __future__ import annotations

import torch


def hits_at_k(cell_logits: torch.Tensor, cell_mask: torch.Tensor, candidate_mask: torch.Tensor, k: int) -> torch.Tensor:
    """``[batch]`` bool: whether a candidate is among the top-``k`` valid cells of each question."""
    logits = cell_logits.masked_fill(~cell_mask, float("-inf"))
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices  # [batch, k]
    return (candidate_mask.gather(1, top) & cell_mask.gather(1, top)).any(dim=-1)
