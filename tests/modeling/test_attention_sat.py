"""SAT: one same-row-or-column mask on every head; text-only embeddings."""

import torch

from mate_cli.modeling.attention.sat import SatAttention
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder
from tests.modeling.random_layouts import random_layout


def reference_allowed(layout, b, i, j) -> bool:
    """The SAT pattern from its definition, token by token."""
    m = layout.attention_mask[b]
    if not m[j]:
        return False
    q = lambda t: bool(m[t]) and int(layout.segment_ids[b, t]) == 0  # noqa: E731
    if not m[i] or q(i) or q(j):
        return True
    same_row = int(layout.row_ids[b, i]) == int(layout.row_ids[b, j])
    same_col = int(layout.column_ids[b, i]) == int(layout.column_ids[b, j])
    return same_row or same_col


def test_sat_equals_reference_softmax_with_set_definition():
    layout = random_layout(3, query_len=(2, 6), rows=(1, 4), cols=(1, 3), cell_tokens=(1, 3), pad=(0, 4), seed=5)
    b, n, h, d = layout.batch_size, layout.seq_len, 4, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    out = SatAttention(num_heads=h, head_dim=d)(q, k, v, layout)
    allowed = torch.tensor(
        [[[reference_allowed(layout, e, i, j) for j in range(n)] for i in range(n)] for e in range(b)]
    )
    scores = (q @ k.transpose(-1, -2)) / d**0.5
    ref = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), -1) @ v
    real = layout.attention_mask[:, None, :, None]
    diff = ((out - ref) * real).abs().max().item()
    assert diff <= 1e-10, diff


def test_padding_never_influences_real_outputs():
    layout = random_layout(2, query_len=(2, 4), rows=(2, 3), cols=(2, 3), cell_tokens=(1, 2), pad=(2, 5), seed=1)
    b, n = layout.batch_size, layout.seq_len
    q, k, v = (torch.randn(b, 2, n, 4) for _ in range(3))
    attn = SatAttention(num_heads=2, head_dim=4)
    out = attn(q, k, v, layout)
    pad = ~layout.attention_mask[:, None, :, None]
    out2 = attn(q + 5 * pad, k + 5 * pad, v + 5 * pad, layout)
    real = layout.attention_mask[:, None, :, None]
    assert torch.equal(out * real, out2 * real)


def test_text_only_drops_structure_embeddings_only():
    layout = random_layout(2, query_len=(2, 4), rows=(2, 3), cols=(2, 3), cell_tokens=(1, 2), pad=(0, 2), seed=3)
    config = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    structured = TableEncoder(config, SatAttention, max_length=64).eval()
    text_only = TableEncoder(config, lambda **kw: SatAttention(text_only=True, **kw), max_length=64).eval()
    text_only.load_state_dict(structured.state_dict())
    ids = torch.randint(1, 50, (layout.batch_size, layout.seq_len))
    flat = layout.with_fields(row_ids=torch.zeros_like(layout.row_ids), column_ids=torch.zeros_like(layout.column_ids))
    emb_text = text_only.embeddings(ids, text_only.backends[0].embedding_layout(layout))
    emb_flat = structured.embeddings(
        ids,
        flat.with_fields(
            column_ranks=torch.zeros_like(layout.row_ids), inv_column_ranks=torch.zeros_like(layout.row_ids)
        ),
    )
    torch.testing.assert_close(emb_text, emb_flat)
    assert not torch.allclose(text_only(ids, layout), structured(ids, layout))
