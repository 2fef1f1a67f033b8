"""PointR stage 2 span head (MATE §4.2): span ``(start, end)`` scores ``S = w2 · gelu(W1 [h_start; h_end] + b1) + b2``.

As ``W1 [h_s; h_e] = W_s h_s + W_e h_e``, the first layer runs once per token, and only the band
``start <= end < start + max_span_length`` is materialised: scores are ``[batch, seq, max_span_length]``,
``scores[b, i, d]`` the span ``(i, i + d)``, at cost ``O(seq * max_span_length * mlp_hidden)``, never ``seq^2``. The
softmax runs over the valid spans (:func:`valid_span_mask`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch import nn


def valid_span_mask(
    context_mask: Tensor, max_span_length: int, start_ok: Tensor | None = None, end_ok: Tensor | None = None
) -> Tensor:
    """``[batch, seq, max_span_length]`` bool: ``mask[b, i, d]`` iff every token of ``i .. i + d`` is a context token,
    ``i + d < seq``, and, when given, ``start_ok[b, i]`` and ``end_ok[b, i + d]`` (``[batch, seq]`` bool)."""
    batch, seq = context_mask.shape
    device = context_mask.device
    ctx = context_mask.bool()
    # outside[b, j] = number of non-context tokens among positions < j
    outside = torch.zeros(batch, seq + 1, dtype=torch.long, device=device)
    outside[:, 1:] = torch.cumsum((~ctx).long(), dim=1)
    start = torch.arange(seq, device=device)[:, None]  # [seq, 1]
    end = start + torch.arange(max_span_length, device=device)[None, :]  # [seq, L]
    in_range = end < seq
    end = end.clamp(max=seq - 1)
    clean = (outside[:, end + 1] - outside[:, start]) == 0  # [batch, seq, L]
    mask = clean & in_range & ctx[:, :, None]
    if start_ok is not None:
        mask = mask & start_ok.bool()[:, :, None]
    if end_ok is not None:
        mask = mask & end_ok.bool()[:, end]
    return mask


class SpanHead(nn.Module):
    """The span scorer (module docstring); ``max_span_length`` in word pieces."""

    def __init__(
        self,
        hidden_size: int,
        max_span_length: int = 30,
        mlp_hidden: int | None = None,
        initializer_range: float = 0.02,
    ) -> None:
        super().__init__()
        if max_span_length < 1:
            raise ValueError(f"max_span_length must be >= 1, got {max_span_length}")
        inner = int(mlp_hidden or hidden_size)
        self.max_span_length = int(max_span_length)
        self.start_proj = nn.Linear(hidden_size, inner)  # W_s (carries b1)
        self.end_proj = nn.Linear(hidden_size, inner, bias=False)  # W_e
        self.activation = nn.GELU()
        self.out = nn.Linear(inner, 1)
        for layer in (self.start_proj, self.end_proj, self.out):
            nn.init.normal_(layer.weight, std=initializer_range)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(
        self, hidden: Tensor, context_mask: Tensor, start_ok: Tensor | None = None, end_ok: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(scores, valid)``, each ``[batch, seq, max_span_length]`` (masks: :func:`valid_span_mask`); invalid
        scores are the dtype's most negative finite value."""
        width = self.max_span_length
        h_start = self.start_proj(hidden)  # [batch, seq, inner]
        h_end = nn.functional.pad(self.end_proj(hidden), (0, 0, 0, width - 1))  # [batch, seq + L - 1, inner]
        band = h_end.unfold(1, width, 1)  # [batch, seq, inner, L]: band[b, i, :, d] = h_end[b, i + d]
        pair = self.activation(h_start[..., None] + band)  # [batch, seq, inner, L]
        scores = torch.einsum("bsil,i->bsl", pair, self.out.weight[0]) + self.out.bias  # [batch, seq, L]
        valid = valid_span_mask(context_mask, width, start_ok, end_ok)
        return scores.masked_fill(~valid, torch.finfo(scores.dtype).min), valid

    def decode(self, scores: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Best valid span per example: ``(start, end, prob)``, each ``[batch]``, ``prob`` its softmax over valid spans;
        ``-1, -1, 0`` where no span is valid."""
        batch, seq, width = scores.shape
        flat = scores.reshape(batch, -1)
        has = valid.reshape(batch, -1).any(dim=-1)
        log_p = torch.log_softmax(flat.float(), dim=-1)
        best_log_p, best = log_p.max(dim=-1)
        start, end = best // width, best // width + best % width
        return torch.where(has, start, -1), torch.where(has, end, -1), torch.where(has, best_log_p.exp(), 0.0)


def gold_band_index(gold_start: Tensor, gold_end: Tensor, max_span_length: int) -> Tensor:
    """Flat band index ``start * L + (end - start)`` of each gold span, ``[batch]`` (-1 if none/too long)."""
    length = gold_end - gold_start
    ok = (gold_start >= 0) & (length >= 0) & (length < max_span_length)
    return torch.where(ok, gold_start * max_span_length + length, torch.full_like(gold_start, -1))


def span_loss(scores: Tensor, valid: Tensor, gold_start: Tensor, gold_end: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy to the gold span (``gold_start``/``gold_end`` ``[batch]``, -1: none): ``(loss, used)``, the mean
    over the examples whose gold span is a valid band span (``used``; 0 with grad when none)."""
    batch, seq, width = scores.shape
    target = gold_band_index(gold_start, gold_end, width)
    index = target.clamp(min=0)[:, None]
    used = (target >= 0) & valid.reshape(batch, -1).gather(1, index).squeeze(1)
    if not bool(used.any()):
        return scores.masked_fill(~valid, 0.0).sum() * 0.0, used
    log_p = torch.log_softmax(scores.reshape(batch, -1).float(), dim=-1)
    nll = -log_p.gather(1, index).squeeze(1)
    return nll[used].mean(), used
