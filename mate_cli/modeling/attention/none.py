"""`none`: no token mixing at all, the cost floor for benchmarks.

Owns no parameters. Returns the values unchanged, so an encoder with it measures
everything except attention (projections, feed-forward, LayerNorms). It is not a
model: :class:`~mate_cli.modeling.encoder.TableEncoder` refuses to train it.

In a benchmark's training step the floor must still pay for every projection's
backward: with ``context = v`` alone, autograd would prune the query and key
projections' backward GEMMs (nothing would depend on q and k), which every real
attention runs. So q and k get zero gradients (:class:`_ValuesOnly`), and their
projections' backward runs as it does under any attention.
"""

from __future__ import annotations

import torch

from mate_cli.modeling.attention.base import AttentionBackend, register
from mate_cli.modeling.layout import TableLayout


@register("none")
class NoAttention(AttentionBackend):
    """Identity on values: ``context = v``."""

    trainable = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return _ValuesOnly.apply(q, k, v)
        return v


class _ValuesOnly(torch.autograd.Function):
    """``v``, with zero gradients for ``q`` and ``k`` (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.shapes = (q.shape, k.shape)  # not the tensors: nothing kept alive
        return v.view_as(v)

    @staticmethod
    def backward(ctx, grad):
        q_shape, k_shape = ctx.shapes
        return grad.new_zeros(q_shape), grad.new_zeros(k_shape), grad
