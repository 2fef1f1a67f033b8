"""Hits@k for cell selection (paper Table 6).

Hits@k is the share of questions for which a cell containing the answer (a
candidate) is among the model's top-k cells. Questions with no surviving candidate
(answer nowhere, or its cell truncated away) count as misses: the metric is over
every question of the split, so truncation losses show up in it honestly.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


def hits_at_k(cell_logits: torch.Tensor, cell_mask: torch.Tensor, candidate_mask: torch.Tensor, k: int) -> torch.Tensor:
    """``[batch]`` bool: whether a candidate is among the top-``k`` valid cells of each question."""
    logits = cell_logits.masked_fill(~cell_mask, float("-inf"))
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices  # [batch, k]
    return (candidate_mask.gather(1, top) & cell_mask.gather(1, top)).any(dim=-1)


class HitsAtK(Metric):
    """Hits@``k`` over a stream of batches."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = k
        self.add_state("hits", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, cell_logits: torch.Tensor, cell_mask: torch.Tensor, candidate_mask: torch.Tensor) -> None:
        """Each argument ``[batch, cells + 1]``."""
        hit = hits_at_k(cell_logits, cell_mask, candidate_mask, self.k)
        self.hits += hit.sum()
        self.total += hit.numel()

    def compute(self) -> torch.Tensor:
        return self.hits / self.total.clamp(min=1)
