"""PointR's stage-1 cell selection (MATE §4.1; the span head, §4.2: :mod:`mate_cli.modeling.span`) and mean pooling.

A cell's score is its tokens' mean logit, ``S(c) = avg_{t in c} S(t)``; ``P(c)`` a softmax over the example's cells.
:func:`mml_loss` is maximum marginal likelihood over the candidate cells ``C``: ``L = sum_{z in C} -q(z) log p(z|x)``,
``q = p`` restricted to ``C`` and detached (Guu et al. 2017). Cell tensors are ``[batch, num_cells + 1]`` by cell id,
index 0 ("not a cell") always masked.
"""

from __future__ import annotations

import torch
from torch import nn

from mate_cli.layout import TableLayout


def masked_fill_invalid(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Set invalid entries to the dtype's most negative value (finite, softmax-safe)."""
    return logits.masked_fill(~valid, torch.finfo(logits.dtype).min)


class CellSelectionHead(nn.Module):
    def __init__(self, hidden_size: int, initializer_range: float = 0.02) -> None:
        super().__init__()
        self.token_scorer = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.token_scorer.weight, std=initializer_range)
        nn.init.zeros_(self.token_scorer.bias)

    def forward(self, hidden: torch.Tensor, layout: TableLayout, num_cells: int) -> torch.Tensor:
        """``[batch, seq, hidden]`` -> cell logits ``[batch, num_cells + 1]`` (``num_cells``: the batch's largest id);
        a cell with no token, and index 0, get the most negative finite value."""
        token_logits = self.token_scorer(hidden).squeeze(-1)  # [batch, seq]
        return pool_cells(token_logits, layout.cell_ids * layout.attention_mask, num_cells)


def pool_cells(token_logits: torch.Tensor, cell_ids: torch.Tensor, num_cells: int) -> torch.Tensor:
    """Mean of ``token_logits`` ``[batch, seq]`` per cell id -> ``[batch, num_cells + 1]``."""
    shape = (token_logits.shape[0], num_cells + 1)
    sums = token_logits.new_zeros(shape).scatter_add(1, cell_ids, token_logits)
    counts = token_logits.new_zeros(shape).scatter_add(1, cell_ids, torch.ones_like(token_logits))
    valid = counts > 0
    valid[:, 0] = False
    return masked_fill_invalid(sums / counts.clamp(min=1), valid)


def mean_over_tokens(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[batch, seq, hidden]`` -> ``[batch, hidden]``: a sentence encoder's mean over the real tokens (padding left
    out, so a batch-mate's length changes nothing)."""
    real = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * real).sum(1) / real.sum(1).clamp(min=1)


def cell_log_probs(cell_logits: torch.Tensor, cell_mask: torch.Tensor) -> torch.Tensor:
    """``log P(c)``: log-softmax over the example's cells (``cell_mask`` ``[batch, cells + 1]``)."""
    return torch.log_softmax(masked_fill_invalid(cell_logits, cell_mask), dim=-1)


def mml_loss(cell_logits: torch.Tensor, cell_mask: torch.Tensor, candidate_mask: torch.Tensor) -> torch.Tensor:
    """MML over the candidate cells (module docstring), averaged over the examples with a candidate; with exactly one
    candidate it is the cross-entropy to that cell. Returns 0 (with grad) when no example has a candidate."""
    log_p = cell_log_probs(cell_logits, cell_mask)
    candidates = candidate_mask & cell_mask
    q = torch.softmax(masked_fill_invalid(log_p.detach(), candidates), dim=-1) * candidates
    per_example = -(q * log_p.masked_fill(~candidates, 0.0)).sum(dim=-1)
    return _mean_over(per_example, candidates.any(dim=-1))


def first_candidate_loss(
    cell_logits: torch.Tensor, cell_mask: torch.Tensor, candidate_mask: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy to the lowest-id candidate cell (the ``model.mml=false`` ablation)."""
    candidates = candidate_mask & cell_mask
    target = candidates.float().argmax(dim=-1)
    per_example = -cell_log_probs(cell_logits, cell_mask).gather(1, target[:, None]).squeeze(1)
    return _mean_over(per_example, candidates.any(dim=-1))


def _mean_over(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``keep`` (0, with grad, where none is), computed on the device: no host read."""
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)
