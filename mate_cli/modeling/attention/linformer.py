"""LINFORMER attention (Wang et al., 2020), the low-rank baseline of MATE §5.1.

``context = softmax(q (E k)^T / sqrt(head_dim)) (F v)`` with learned E, F ``[k, max_length]`` projecting the sequence
axis to ``k`` slots: ``O(seq * k)`` per head. The paper keeps TAPAS's row/column/rank embeddings and uses ``k = 256``
(better than 128 and 512). One E and one F per layer, shared by all heads (headwise sharing); ``share_kv=True`` ties F
to E. E and F are new parameters, absent from BERT/TAPAS checkpoints. Padding keys and values are zeroed before the
projection and a shorter sequence uses E and F's first ``seq`` columns, so trailing padding does not change the result.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling.attention.backend import AttentionBackend, check_range, register
from mate_cli.layout import TableLayout

INITS = ("normal", "xavier")


@register("linformer")
class LinformerAttention(AttentionBackend):
    """``init``: ``"normal"`` (N(0, ``init_std``), BERT's) or ``"xavier"`` (Xavier-uniform); with ``share_kv`` F is
    None. Only the padding mask is read from the layout; ``layout=None`` means no padding."""

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
        self.k, self.share_kv = int(k), bool(share_kv)
        self.E = nn.Parameter(torch.empty(self.k, self.max_length))
        if self.share_kv:
            self.register_parameter("F", None)
        else:
            self.F = nn.Parameter(torch.empty(self.k, self.max_length))
        for weight in (self.E,) if self.F is None else (self.E, self.F):
            if init == "normal":
                nn.init.normal_(weight, mean=0.0, std=init_std)
            else:
                nn.init.xavier_uniform_(weight)

    def extra_repr(self) -> str:
        return f"k={self.k}, max_length={self.max_length}, share_kv={self.share_kv}"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
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
        k_slots = torch.einsum("kn,bhnd->bhkd", key_proj, k)
        v_slots = torch.einsum("kn,bhnd->bhkd", value_proj, v)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k_slots) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(v.dtype)
        probs = self.attention_dropout(probs)
        return torch.einsum("bhqk,bhkd->bhqd", probs, v_slots)
