"""SAT (Zhang et al., EMNLP 2020): one structure-aware mask shared by every head.

A table token attends to the query set Q (query, [CLS], [SEP]) and to the tokens of
its own row *or* its own column; Q attends to everything; padding is never attended.
Unlike MATE the pattern does not depend on the head, so it has no efficient sorted
form: this backend is exact and quadratic (``[batch, 1, seq, seq]`` mask + SDPA).

``text_only=True`` encodes the table as text only, as SAT does: through the
``embedding_layout`` hook the embeddings see no row/column/rank ids (the mask still
uses them). No parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mate_cli.modeling.attention.base import AttentionBackend, register, with_key_bias
from mate_cli.modeling.layout import TableLayout


def sat_mask(layout: TableLayout) -> torch.Tensor:
    """``[batch, seq, seq]`` bool (from, to): same row or same column, or Q involved."""
    return layout.cached("sat_mask", lambda: layout.allowed("row") | layout.allowed("column"))


@register("sat")
class SatAttention(AttentionBackend):
    """Same-row-or-column attention on all heads.

    Args:
        text_only: drop row/column/rank embeddings (the table is read as text).
        (plus the shared ``num_heads, head_dim, max_length, dropout, layer_index``)
    """

    supports_key_bias = True

    def __init__(self, *, text_only: bool = False, **shared) -> None:
        super().__init__(**shared)
        self.text_only = bool(text_only)

    def embedding_layout(self, layout: TableLayout | None) -> TableLayout | None:
        if not self.text_only or layout is None:
            return layout
        zeros = torch.zeros_like(layout.segment_ids)
        return layout.with_fields(
            row_ids=zeros,
            column_ids=zeros,
            column_ranks=zeros,
            inv_column_ranks=zeros,
            numeric_relations=zeros,
            prev_labels=zeros,
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        """``q, k, v``: ``[batch, heads, seq, head_dim]`` (q not pre-scaled) -> same shape."""
        layout = self.require_layout(layout)
        dropout_p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=with_key_bias(sat_mask(layout)[:, None], layout, q.dtype), dropout_p=dropout_p
        )
