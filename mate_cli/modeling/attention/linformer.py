"""LINFORMER attention (Wang et al., 2020), the low-rank baseline of MATE §5.1.

Keys and values are projected along the sequence axis to ``k`` slots by learned matrices E and F
``[k, max_length]``: ``context = softmax(q (E k)^T / sqrt(head_dim)) (F v)``, ``O(seq * k)`` per head. The paper keeps
TAPAS's row/column/rank embeddings (:mod:`mate_cli.modeling.embeddings`) and uses ``k = 256``, which beat 128 and 512.
One E and one F per layer, shared by all heads (the paper's headwise sharing); ``share_kv=True`` also ties F to E
(key-value sharing). E and F are new parameters, absent from BERT/TAPAS checkpoints. Padding keys and values are
zeroed before the projection, and a shorter sequence uses the first ``seq`` columns of E and F, so the result is the
same however much padding follows.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling.attention.base import AttentionBackend, check_range, register
from mate_cli.modeling.layout import TableLayout

INITS = ("normal", "xavier")


@register("linformer")
class LinformerAttention(AttentionBackend):
    """``k``: the sequence slots, ``1 <= k <= max_length``; with ``share_kv`` F is None; ``init``: ``"normal"``
    (N(0, ``init_std``), BERT's initialiser) or ``"xavier"`` (Xavier-uniform). Only the padding mask is read from the
    layout; ``layout=None`` means no padding."""

    def __init__(
        self, *, k: int = 256, share_kv: bool = False, init: str = "normal", init_std: float = 0.02, **shared
    ) -> None:
        super().__init__(**shared)
        check_range("attention.k", k, 1, self.max_length)
        if init not in INITS:
            raise MateError(
                f"attention.init={init!r} is invalid: choose one of {', '.join(INITS)}; set attention.init=normal"
            )
        check_range("attention.init_std", init_std, 0.0)
        self.k = int(k)
        self.share_kv = bool(share_kv)
        self.E = nn.Parameter(torch.empty(self.k, self.max_length))
        if self.share_kv:
            self.register_parameter("F", None)
        else:
            self.F = nn.Parameter(torch.empty(self.k, self.max_length))
        self._init(init, init_std)

    def _init(self, init: str, std: float) -> None:
        for weight in (self.E,) if self.F is None else (self.E, self.F):
            if init == "normal":
                nn.init.normal_(weight, mean=0.0, std=std)
            else:
                nn.init.xavier_uniform_(weight)

    def extra_repr(self) -> str:
        return f"k={self.k}, max_length={self.max_length}, share_kv={self.share_kv}"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        """``seq <= max_length``, the length of E and F."""
        seq = k.shape[-2]
        if seq > self.max_length:
            raise MateError(
                f"linformer: sequence length {seq} exceeds max_length={self.max_length}, the length of "
                f"its E/F projections; set dataset.max_length<={self.max_length} or rebuild the model with a "
                "larger max_length"
            )
        if layout is not None:
            real = layout.attention_mask[:, None, :, None].to(k.dtype)  # [batch, 1, seq, 1]
            k, v = k * real, v * real
        key_proj = self.E[:, :seq].to(k.dtype)
        value_proj = (self.E if self.F is None else self.F)[:, :seq].to(v.dtype)
        # Project along the sequence axis: seq positions -> k slots.
        k_slots = torch.einsum("kn,bhnd->bhkd", key_proj, k)
        v_slots = torch.einsum("kn,bhnd->bhkd", value_proj, v)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k_slots) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(v.dtype)
        probs = self.attention_dropout(probs)
        return torch.einsum("bhqk,bhkd->bhqd", probs, v_slots)
