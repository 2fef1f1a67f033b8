"""Transformer-XH (Zhao et al. 2020): extra hop attention between the [CLS] hubs of linked sequences.

A batch holds the nodes of one or more graphs, each a sequence with its [CLS] (the node's *hub*) at position 0, and a
bool adjacency ``edges[tau, eta]`` (``tau`` reads ``eta``). In each of the last ``hop_layers`` layers (``None``: all)
tokens attend inside their sequence (any backend), and the hub of ``tau`` also attends to its neighbours' hubs with hop
projections of its own (``q^ = W_q^ h_tau,0``, ``k^``, ``v^`` from ``h_eta,0``, the layer's input; multi-head, zero
without neighbours); its context becomes ``W_c [in-sequence context ; hop context] + b_c`` before the output block.

``W_c`` starts as ``[I | 0]``, zero bias (the paper does not say): before training the model is exactly the
pre-trained encoder. The hop projections' gradient passes through the ``0`` block, so they learn after the first step.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.layout import TableLayout


class HopAttention(nn.Module):
    """One layer's hop attention and the hub's combination ``W_c``."""

    def __init__(self, hidden_size: int, num_heads: int, initializer_range: float = 0.02) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.query, self.key, self.value = (nn.Linear(hidden_size, hidden_size) for _ in range(3))
        for layer in (self.query, self.key, self.value):
            nn.init.normal_(layer.weight, std=initializer_range)
            nn.init.zeros_(layer.bias)
        self.combine = nn.Linear(2 * hidden_size, hidden_size)
        with torch.no_grad():
            self.combine.weight.zero_()
            self.combine.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
            self.combine.bias.zero_()

    def hop_context(self, hubs: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        """``hubs`` ``[nodes, hidden]``, ``edges`` ``[nodes, nodes]`` -> ``[nodes, hidden]`` (0 without neighbours)."""
        q, k, v = (
            proj(hubs).unflatten(-1, (self.num_heads, self.head_dim)).transpose(0, 1)
            for proj in (self.query, self.key, self.value)
        )  # [heads, nodes, head_dim]
        scores = (q @ k.transpose(1, 2)) * self.head_dim**-0.5
        has_neighbour = edges.any(dim=-1)[None, :, None]
        # a hub with no neighbour: scores 0 (no NaN, forward or backward), then its weights zeroed
        scores = scores.masked_fill(~edges & has_neighbour, float("-inf"))
        probs = torch.softmax(scores, dim=-1) * has_neighbour
        return (probs @ v).transpose(0, 1).flatten(1)

    def forward(self, context: torch.Tensor, hidden: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        """A :data:`~mate_cli.modeling.encoder.ContextMix`: only the hubs' contexts change."""
        hub = self.combine(torch.cat([context[:, 0], self.hop_context(hidden[:, 0], edges)], dim=-1))
        return torch.cat([hub[:, None], context[:, 1:]], dim=1)


class HopLayers(nn.Module):
    """The hop attention of the last ``hop_layers`` layers (``None``: all, the paper's), run around an encoder it does
    not own (the task module keeps it as its ``encoder``, exported as usual)."""

    def __init__(self, config, hop_layers: int | None = None) -> None:
        super().__init__()
        count = config.num_layers if hop_layers is None else int(hop_layers)
        if not 0 <= count <= config.num_layers:
            raise MateError(
                f"model.hop_layers={hop_layers} is invalid: the encoder has {config.num_layers} layers; "
                f"set model.hop_layers to 0..{config.num_layers} (null: all)"
            )
        self.first_hop = config.num_layers - count
        self.hops = nn.ModuleList(
            HopAttention(config.hidden_size, config.num_heads, config.initializer_range) for _ in range(count)
        )

    def forward(
        self, encoder: nn.Module, input_ids: torch.Tensor, layout: TableLayout | None, edges: torch.Tensor
    ) -> torch.Tensor:
        """``encoder``'s last hidden state ``[nodes, seq, hidden]`` with hop attention; ``edges`` ``[nodes, nodes]``."""
        if edges.shape != (input_ids.shape[0],) * 2:
            raise MateError(
                f"Transformer-XH: edges has shape {tuple(edges.shape)} for {input_ids.shape[0]} nodes; "
                "it must be [nodes, nodes]"
            )
        hidden, layout, num_prefix = encoder.embed(input_ids, layout)
        if num_prefix:
            raise MateError(
                "Transformer-XH needs each node's [CLS] at position 0, but this attention backend puts "
                "tokens in front; use attention=dense, mate, sat or linformer"
            )
        edges = edges.to(hidden.device).bool()
        for i, layer in enumerate(encoder.encoder.layer):
            mix = functools.partial(self.hops[i - self.first_hop], edges=edges) if i >= self.first_hop else None
            hidden = encoder.run_layer(layer, hidden, layout, mix)
        return hidden
