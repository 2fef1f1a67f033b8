"""The attention interface every backend implements, and the backend registry.

The encoder layer owns the Q/K/V projections, the output dense, dropout, residual
and LayerNorm (so BERT/TAPAS weights load unchanged into any backend). A backend
only mixes values:

    context = backend(q, k, v, layout)      # q, k, v, context: [batch, heads, seq, head_dim]

``q`` is *not* pre-scaled: backends apply ``1 / sqrt(head_dim)`` themselves.

Construction: every backend's ``__init__`` takes keyword arguments
``num_heads, head_dim, max_length, dropout, layer_index`` (from the encoder) plus its
own options (from ``conf/attention/<name>.yaml``). Hydra builds a *partial* from that
yaml (``_partial_: true``); the encoder calls it once per layer with the shared
keywords. A backend may own parameters only when the method needs them (say so in
its docstring).

Encoder-level hooks (default: identity), used by backends that add tokens, e.g.
TableETC's global memory:

- ``embedding_layout(layout) -> layout`` is called once on the first layer's backend
  before the embeddings: the layout the *embeddings* see (SAT's ``text_only`` drops
  the row/column/rank ids here, so the table is encoded as text only).
- ``extend_inputs(hidden, layout) -> (hidden, layout, num_prefix)`` is called once on
  the first layer's backend after the embeddings; the encoder drops the first
  ``num_prefix`` positions of the last hidden state before returning it.

Key bias (DoT, Krichene et al. 2021, eq. 2): when ``layout.key_bias`` is set, a backend
adds ``key_bias[b, t]`` to the logit of every query towards key ``t`` before the softmax,
in every head. Backends that can say so set ``supports_key_bias``; they build their mask
with :func:`with_key_bias`. The encoder refuses a biased layout on any other backend.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling.layout import TableLayout

#: name -> backend class; filled by :func:`register`.
REGISTRY: dict[str, type["AttentionBackend"]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a backend discoverable by name (bench, ``auto``)."""

    def wrap(cls: type) -> type:
        REGISTRY[name] = cls
        cls.name = name
        return cls

    return wrap


class AttentionBackend(nn.Module):
    """Base class. Subclasses implement :meth:`forward`.

    Args:
        num_heads: attention heads of the layer.
        head_dim: size of each head.
        max_length: the longest sequence the model will see (Linformer needs it).
        dropout: dropout on attention probabilities (BERT's ``attention_probs_dropout_prob``).
        layer_index: index of the layer that owns this backend.
    """

    name = "base"
    #: False for the cost-floor backend that must not be trained.
    trainable = True
    #: True when the backend adds ``layout.key_bias`` to its attention logits (see the module docstring)
    supports_key_bias = False

    def __init__(
        self, *, num_heads: int, head_dim: int, max_length: int = 512, dropout: float = 0.0, layer_index: int = 0
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_length = max_length
        self.dropout = dropout
        self.layer_index = layer_index

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None
    ) -> torch.Tensor:  # pragma: no cover - interface
        """Mix values. ``q, k, v``: ``[batch, heads, seq, head_dim]``; returns the same shape."""
        raise NotImplementedError

    def embedding_layout(self, layout: TableLayout | None) -> TableLayout | None:
        """Encoder hook: the layout the embeddings see. Default: unchanged."""
        return layout

    def extend_inputs(
        self, hidden: torch.Tensor, layout: TableLayout | None
    ) -> tuple[torch.Tensor, TableLayout | None, int]:
        """Encoder hook: add tokens before the first layer. Default: none added."""
        return hidden, layout, 0

    # ---------------------------------------------------------------- helpers
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
