"""`none`: ``context = v``, the cost floor for benchmarks (everything but attention); no parameters, and
:class:`~mate_cli.modeling.encoder.TableEncoder` refuses to train it.

With ``context = v`` alone autograd would skip the q and k projections' backward GEMMs, which every real attention
pays; :class:`_ValuesOnly` gives q and k zero gradients so a benchmark's training step still runs them.
"""

from __future__ import annotations

import torch

from mate_cli.modeling.attention.backend import AttentionBackend, register
from mate_cli.layout import TableLayout


@register("none")
class NoAttention(AttentionBackend):
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
