"""`dense`: full softmax attention (BERT's), the exact baseline every backend is checked against.

Owns no parameters. Uses ``torch.nn.functional.scaled_dot_product_attention`` (fused
kernels where the device has them) with a key-padding mask from
``layout.attention_mask`` (plus ``layout.key_bias`` when set); no layout means no mask.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from mate_cli.modeling.attention.base import AttentionBackend, register, with_key_bias
from mate_cli.modeling.layout import TableLayout


@register("dense")
class DenseAttention(AttentionBackend):
    """Every token attends to every real token. Cost O(seq^2) time and memory."""

    supports_key_bias = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        """``q, k, v``: ``[batch, heads, seq, head_dim]`` -> context ``[batch, heads, seq, head_dim]``."""
        mask = None
        if layout is not None:
            mask = layout.attention_mask[:, None, None, :].to(q.device)  # [batch, 1, 1, seq]: keys allowed
            mask = with_key_bias(mask, layout, q.dtype)
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
