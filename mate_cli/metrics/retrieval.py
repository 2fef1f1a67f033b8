"""Hits@k for cell selection (paper Table 6).

Hits@k is the share of questions for which a cell containing the answer (a
candidate) is among the model's top-k cells. Questions with no surviving candidate
(answer nowhere, or its cell truncated away) count as misses: the metric is over
every question of the split, so truncation losses show up in it honestly.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


class HitsAtK(Metric):
    """Hits@k over a stream of ``[batch, cells + 1]`` cell logits.

    Args:
        k: how many top cells count.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = k
        self.add_state("hits", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, cell_logits: torch.Tensor, cell_mask: torch.Tensor, candidate_mask: torch.Tensor) -> None:
        """Args: logits, cell mask and candidate mask, each ``[batch, cells + 1]``."""
        logits = cell_logits.masked_fill(~cell_mask, float("-inf"))
        k = min(self.k, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices  # [batch, k]
        picked_valid = cell_mask.gather(1, top)
        hit = (candidate_mask.gather(1, top) & picked_valid).any(dim=-1)
        self.hits += hit.sum()
        self.total += hit.numel()

    def compute(self) -> torch.Tensor:
        return self.hits / self.total.clamp(min=1)
