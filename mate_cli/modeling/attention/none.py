"""`none`: no token mixing at all, the cost floor for benchmarks.

Owns no parameters. Returns the values unchanged, so an encoder with it measures
everything except attention (projections, feed-forward, LayerNorms). It is not a
model: :class:`~mate_cli.modeling.encoder.TableEncoder` refuses to train it.
"""

from __future__ import annotations

import torch

from mate_cli.modeling.attention.base import AttentionBackend, register
from mate_cli.modeling.layout import TableLayout


@register("none")
class NoAttention(AttentionBackend):
    """Identity on values: ``context = v``."""

    trainable = False

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None
    ) -> torch.Tensor:
        """``q, k, v``: ``[batch, heads, seq, head_dim]`` -> ``v`` (same shape)."""
        return v
