"""SAT (Zhang et al., EMNLP 2020): one structure-aware mask shared by every head, no parameters.

A table token attends to the query set and to its own row *or* column (the union of MATE's row and column patterns).
One pattern for all heads has no sorted form, so this is exact and quadratic (``[batch, 1, seq, seq]`` mask + SDPA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mate_cli.modeling.attention.backend import AttentionBackend, register, with_key_bias
from mate_cli.layout import TOKEN_TYPE_FIELDS, TableLayout


def sat_mask(layout: TableLayout) -> torch.Tensor:
    """``[batch, seq, seq]`` bool (from, to), cached on the layout."""
    return layout.cached("sat_mask", lambda: layout.allowed("row") | layout.allowed("column"))


@register("sat")
class SatAttention(AttentionBackend):
    """``text_only``: the table is read as text, as SAT does: of TAPAS's token types the embeddings see only the
    segment ids (row, column, rank, numeric-relation and previous-answer ids zeroed; the mask still reads rows and
    columns)."""

    supports_key_bias = True

    def __init__(self, *, text_only: bool = False, **shared) -> None:
        super().__init__(**shared)
        self.text_only = bool(text_only)

    def embedding_layout(self, layout: TableLayout | None) -> TableLayout | None:
        if not self.text_only or layout is None:
            return layout
        zeros = torch.zeros_like(layout.segment_ids)  # every token type but the segment
        return layout.with_fields(**dict.fromkeys(TOKEN_TYPE_FIELDS[1:], zeros))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        layout = self.require_layout(layout)
        dropout_p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=with_key_bias(sat_mask(layout)[:, None], layout, q.dtype), dropout_p=dropout_p
        )
