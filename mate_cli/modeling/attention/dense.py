"""`dense`: BERT's full softmax attention, the exact baseline every backend is checked against; no parameters.
One SDPA call, its keys masked by ``layout.attention_mask`` (plus ``layout.key_bias``); no layout, no mask."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from mate_cli.modeling.attention.backend import AttentionBackend, register, with_key_bias
from mate_cli.layout import TableLayout


@register("dense")
class DenseAttention(AttentionBackend):
    supports_key_bias = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        mask = None
        if layout is not None:
            mask = layout.attention_mask[:, None, None, :].to(q.device)  # [batch, 1, 1, seq]: keys allowed
            mask = with_key_bias(mask, layout, q.dtype)
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
