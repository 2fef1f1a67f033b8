"""The attention interface every backend implements, and the registry (docs/architecture.md, "Add an attention
backend"). The encoder layer owns the Q/K/V projections, output dense, dropout, residual and LayerNorm, so BERT/TAPAS
weights load into any backend; a backend only mixes values, and owns parameters only where its method needs them."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from mate_cli.errors import MateError
from mate_cli.layout import TableLayout

#: name -> backend class; filled by :func:`register`.
REGISTRY: dict[str, type["AttentionBackend"]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a backend discoverable by name (``attention=<name>`` in the encoder, ``mate bench``)."""

    def wrap(cls: type) -> type:
        REGISTRY[name] = cls
        cls.name = name
        return cls

    return wrap


class AttentionBackend(nn.Module):
    """``max_length``: the longest sequence the model will see; ``dropout``: the dropout on attention probabilities
    (BERT's ``attention_probs_dropout_prob``)."""

    name = "base"
    #: False for the cost-floor backend that must not be trained.
    trainable = True
    #: True when the backend adds ``layout.key_bias[b, t]`` to every logit towards key ``t`` before the softmax
    #: (:func:`with_key_bias`; DoT, Krichene et al. 2021, eq. 2); the encoder refuses a biased layout on the others
    supports_key_bias = False

    def __init__(
        self, *, num_heads: int, head_dim: int, max_length: int = 512, dropout: float = 0.0, layer_index: int = 0
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.max_length = num_heads, head_dim, max_length
        self.dropout, self.layer_index = dropout, layer_index

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None
    ) -> torch.Tensor:  # pragma: no cover - interface
        """``q, k, v``: ``[batch, heads, seq, head_dim]``, ``q`` not pre-scaled (backends apply ``1 / sqrt(head_dim)``)
        -> the context, same shape."""
        raise NotImplementedError

    def embedding_layout(self, layout: TableLayout | None) -> TableLayout | None:
        """Encoder hook, on the first layer's backend before the embeddings: the layout they see (SAT's ``text_only``
        zeroes every token type but the segment). Default: unchanged."""
        return layout

    def extend_inputs(
        self, hidden: torch.Tensor, layout: TableLayout | None
    ) -> tuple[torch.Tensor, TableLayout | None, int]:
        """Encoder hook, on the first layer's backend after the embeddings: ``(hidden, layout, num_prefix)`` with
        ``num_prefix`` tokens added in front (TableETC's global memory), which the encoder drops from the last hidden
        state. Default: none added."""
        return hidden, layout, 0

    def prepare(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout) -> Any:
        """Encoder hook, before a compiled layer stack (``model.encoder.compile``): build what a call on ``layout``
        reads beyond its tensors, eagerly (host logic a compiled graph would guard on), into the layout's cache where
        the call finds it. ``q``, ``k``, ``v``: stand-ins of the calls' shape, device, dtype and gradient need.
        Default: nothing."""
        return None

    def require_layout(self, layout: TableLayout | None) -> TableLayout:
        if layout is None:
            raise MateError(
                f"attention backend '{self.name}' needs a table layout but got none; "
                "pass the TableLayout from the tokenizer, or use attention=dense"
            )
        return layout

    def attention_dropout(self, probs: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(probs, p=self.dropout, training=self.training)


def check_range(key: str, value: float, low: float, high: float | None = None) -> None:
    """Raise a one-line `MateError` naming the config key when ``value`` is out of range."""
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise MateError(f"{key}={value} is invalid: it must be {bound}; set {key}=<value> accordingly")


def with_key_bias(allowed: torch.Tensor, layout: TableLayout | None, dtype: torch.dtype) -> torch.Tensor:
    """An SDPA ``attn_mask`` from a boolean ``allowed`` mask ``[batch, 1 or heads, 1 or seq, seq]``:
    ``allowed`` itself without a key bias; otherwise ``key_bias[b, t]`` where allowed, ``-inf`` elsewhere."""
    if layout is None or layout.key_bias is None:
        return allowed
    bias = layout.key_bias.to(device=allowed.device, dtype=dtype)[:, None, None, :]
    return torch.where(allowed, bias, torch.tensor(float("-inf"), dtype=dtype, device=allowed.device))


def block_windows(blocks: torch.Tensor) -> torch.Tensor:
    """``[..., num_blocks, size, d]`` -> ``[..., num_blocks, 3 * size, d]``: previous, own, next block (0 past ends)."""
    padded = F.pad(blocks, (0, 0, 0, 0, 1, 1))
    return torch.cat([padded[..., :-2, :, :], padded[..., 1:-1, :, :], padded[..., 2:, :, :]], dim=-2)
