"""TABLEETC backend (MATE §5.1): memory construction, dense reference, padding, errors, cost."""

import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from mate_cli.errors import MateError
from mate_cli.modeling.attention.backend import REGISTRY
from mate_cli.modeling.attention.table_etc import MEMORY_SEGMENT, TableETCAttention
from mate_cli.layout import TableLayout
from tests.modeling.random_layouts import shaped_layout

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention" / "table_etc.yaml"
HEADS, HEAD_DIM = 2, 4
HIDDEN = HEADS * HEAD_DIM


def backend(dtype=torch.float64, **options) -> TableETCAttention:
    torch.manual_seed(0)
    options = {"num_global": 8, "local_radius": 3, "max_relative_distance": 2, **options}
    return TableETCAttention(num_heads=HEADS, head_dim=HEAD_DIM, max_length=512, **options).to(dtype)


def extended(attn, layout, dtype=torch.float64, seed=0):
    """Random embeddings through ``extend_inputs`` -> ``(hidden, extended layout, q, k, v)``."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(layout.batch_size, layout.seq_len, HIDDEN, generator=gen, dtype=dtype)
    hidden, ext, num_prefix = attn.extend_inputs(hidden, layout)
    shape = (ext.batch_size, HEADS, ext.seq_len, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(3))
    return hidden, ext, q, k, v


# Half = 4 slots: example 0 has 6 rows (rows 5, 6 fold onto slots 0, 1), example 1 has
# 2 rows and 3 columns (masked slots sit between real row and column slots), example 2
# is short and padded.
SHAPES = [(3, 6, 2), (4, 2, 3), (2, 1, 1)]


def slot_of(row_or_column, half):
    return (row_or_column - 1) % half if row_or_column > 0 else None


def reference(q, k, v, ext, num_global, radius, max_distance, rel):
    """Dense attention with masks and relative ids built pair by pair in Python."""
    half = num_global // 2
    out = torch.zeros_like(q)
    n = ext.seq_len
    for b in range(ext.batch_size):
        mask = ext.attention_mask[b].tolist()
        is_table = [(s == 1 and m) for s, m in zip(ext.segment_ids[b].tolist(), mask)]
        rows = [slot_of(r, half) if t else None for r, t in zip(ext.row_ids[b].tolist(), is_table)]
        columns = [slot_of(c, half) if t else None for c, t in zip(ext.column_ids[b].tolist(), is_table)]
        allowed = torch.zeros(n, n, dtype=torch.bool)
        ids = torch.zeros(n, n, dtype=torch.long)
        for i in range(n):
            for j in range(n):
                if not mask[j]:
                    continue
                if i < num_global:  # memory -> everything
                    allowed[i, j] = True
                    if j >= num_global and i < half and rows[j] == i:
                        ids[i, j] = 3
                    elif j >= num_global and i >= half and columns[j] == i - half:
                        ids[i, j] = 4
                elif j < num_global:  # long -> memory
                    allowed[i, j] = True
                    if j < half and rows[i] == j:
                        ids[i, j] = 1
                    elif j >= half and columns[i] == j - half:
                        ids[i, j] = 2
                elif abs(i - j) <= radius:  # long -> long, local
                    allowed[i, j] = True
                    ids[i, j] = 5 + max(-max_distance, min(max_distance, j - i)) + max_distance
        for h in range(q.shape[1]):
            qh = q[b, h]
            scores = (qh @ k[b, h].T + (qh[:, None, :] * rel[ids]).sum(-1)) / math.sqrt(q.shape[-1])
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            out[b, h] = probs.nan_to_num() @ v[b, h]
    return out


def real_positions(ext, like):
    return ext.attention_mask[:, None, :, None].expand_as(like)


def test_extend_inputs_returns_memory_and_consistent_layout():
    layout = shaped_layout(SHAPES, extra_pad=2)
    attn = backend()
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(layout.batch_size, layout.seq_len, HIDDEN, generator=gen, dtype=torch.float64)
    out, ext, num_prefix = attn.extend_inputs(hidden, layout)
    g = attn.num_global
    assert num_prefix == g and out.shape == (3, g + layout.seq_len, HIDDEN) and ext.seq_len == g + layout.seq_len
    torch.testing.assert_close(out[:, g:], hidden)
    for name in ("attention_mask", "segment_ids", "row_ids", "column_ids", "cell_ids", "column_ranks"):
        assert torch.equal(getattr(ext, name)[:, g:], getattr(layout, name))
    assert (ext.segment_ids[:, :g] == MEMORY_SEGMENT).all() and (ext.cell_ids[:, :g] == 0).all()
    assert ext.row_ids[0, :g].tolist() == [1, 2, 3, 4, 0, 0, 0, 0]
    assert ext.column_ids[0, :g].tolist() == [0, 0, 0, 0, 1, 2, 3, 4]
    # slot exists iff it has members: 6 rows fold onto 4 slots; 2 rows; 1 row.
    assert ext.attention_mask[:, :g].tolist() == [
        [True, True, True, True, True, True, False, False],
        [True, True, False, False, True, True, True, False],
        [True, False, False, False, True, False, False, False],
    ]
    # Memory state = mean of the members' embeddings + the row/column type embedding.
    types = attn.memory_type_embeddings
    real = layout.attention_mask[0] & (layout.segment_ids[0] == 1)
    row_members = real & ((layout.row_ids[0] == 1) | (layout.row_ids[0] == 5))  # folded
    torch.testing.assert_close(out[0, 0], hidden[0][row_members].mean(0) + types[0])
    column_members = real & (layout.column_ids[0] == 2)  # header included
    torch.testing.assert_close(out[0, 5], hidden[0][column_members].mean(0) + types[1])


def test_matches_dense_reference_with_python_masks():
    layout = shaped_layout(SHAPES, extra_pad=2, seed=4)
    attn = backend()
    with torch.no_grad():
        attn.relative_embeddings.normal_()  # make the relative bias matter
    _, ext, q, k, v = extended(attn, layout)
    out = attn(q, k, v, ext)
    ref = reference(
        q, k, v, ext, attn.num_global, attn.local_radius, attn.max_relative_distance, attn.relative_embeddings
    )
    real = real_positions(ext, out)
    assert out.shape == q.shape
    torch.testing.assert_close(out[real], ref[real])


@pytest.mark.parametrize("radius", [1, 5])
def test_matches_reference_for_other_radii(radius):
    layout = shaped_layout(SHAPES[:2], seed=5)
    attn = backend(local_radius=radius, max_relative_distance=0)
    _, ext, q, k, v = extended(attn, layout, seed=2)
    ref = reference(q, k, v, ext, attn.num_global, radius, 0, attn.relative_embeddings)
    out = attn(q, k, v, ext)
    real = real_positions(ext, out)
    torch.testing.assert_close(out[real], ref[real])


def test_padding_and_masked_memory_slots_never_influence_real_tokens():
    layout = shaped_layout(SHAPES, extra_pad=3)
    attn = backend()
    _, ext, q, k, v = extended(attn, layout)
    masked = ~ext.attention_mask[:, None, :, None]
    assert masked[1, 0, 2:4].all() and not masked[1, 0, 4]  # masked slots in the middle of the memory
    noisy = [x + 100.0 * torch.randn_like(x) * masked for x in (q, k, v)]
    out, out_noisy = attn(q, k, v, ext), attn(*noisy, ext)
    real = real_positions(ext, out)
    assert torch.isfinite(out_noisy).all()
    torch.testing.assert_close(out_noisy[real], out[real])


def test_padding_embeddings_do_not_reach_memory():
    layout = shaped_layout(SHAPES, extra_pad=3)
    attn = backend()
    hidden = torch.randn(layout.batch_size, layout.seq_len, HIDDEN, dtype=torch.float64)
    noisy = hidden + 100.0 * torch.randn_like(hidden) * ~layout.attention_mask[..., None]
    a, ext, _ = attn.extend_inputs(hidden, layout)
    b, _, _ = attn.extend_inputs(noisy, layout)
    real = ext.attention_mask[..., None].expand_as(a)
    torch.testing.assert_close(a[real], b[real])


def test_finite_outputs_and_gradients_through_memory():
    layout = shaped_layout(SHAPES, extra_pad=2)
    torch.manual_seed(0)
    attn = TableETCAttention(num_heads=HEADS, head_dim=HEAD_DIM, num_global=8, local_radius=4, dropout=0.1)
    hidden = torch.randn(layout.batch_size, layout.seq_len, HIDDEN, requires_grad=True)
    ext_hidden, ext, _ = attn.extend_inputs(hidden, layout)
    shape = (ext.batch_size, ext.seq_len, HEADS, HEAD_DIM)
    q, k, v = (ext_hidden.reshape(shape).transpose(1, 2) * s for s in (1.0, 0.5, 2.0))
    out = attn(q, k, v, ext)
    out[:, :, attn.num_global :].pow(2).sum().backward()  # heads read long tokens only
    assert torch.isfinite(out).all()
    for grad in (hidden.grad, attn.relative_embeddings.grad, attn.memory_type_embeddings.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_plan_is_cached_and_shared_by_layers():
    layout = shaped_layout(SHAPES)
    layer0, layer1 = backend(), backend(layer_index=1)
    assert layer1.memory_type_embeddings is None
    _, ext, q, k, v = extended(layer0, layout)
    layer0(q, k, v, ext)
    plan = layer0.plan(ext)
    layer1(q, k, v, ext)
    assert layer1.plan(ext) is plan


def test_cost_is_linear_in_length():
    attn = TableETCAttention(num_heads=HEADS, head_dim=HEAD_DIM, num_global=16, local_radius=16)

    def flops(seq):
        pos = torch.arange(seq)[None]
        table = pos >= 8
        layout = TableLayout(
            attention_mask=torch.ones_like(pos, dtype=torch.bool),
            segment_ids=table.long(),
            row_ids=torch.where(table, (pos - 8) // 12 + 1, 0),
            column_ids=torch.where(table, (pos - 8) % 4 + 1, 0),
        )
        _, ext, q, k, v = extended(attn, layout, dtype=torch.float32)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            attn(q, k, v, ext)
        return counter.get_total_flops()

    ratios = [flops(2 * n) / flops(n) for n in (512, 1024)]
    assert max(ratios) <= 2.1, ratios


def test_wiring_errors():
    layout = shaped_layout(SHAPES)
    attn = backend()
    q = torch.randn(layout.batch_size, HEADS, layout.seq_len, HEAD_DIM, dtype=torch.float64)
    with pytest.raises(MateError, match="extend_inputs"):
        attn(q, q, q, layout)  # layout without the memory prefix
    with pytest.raises(MateError, match="layout"):
        attn(q, q, q, None)
    with pytest.raises(MateError, match="layer 0"):
        backend(layer_index=2).extend_inputs(torch.zeros(3, layout.seq_len, HIDDEN, dtype=torch.float64), layout)


def test_yaml_builds_registered_backend():
    partial = instantiate(OmegaConf.load(CONF))
    attn = partial(num_heads=HEADS, head_dim=HEAD_DIM, max_length=512, dropout=0.1, layer_index=0)
    assert isinstance(attn, REGISTRY["table_etc"])
    assert (attn.num_global, attn.local_radius, attn.max_relative_distance) == (256, 84, 12)
    assert attn.relative_embeddings.shape == (5 + 25, HEAD_DIM)
