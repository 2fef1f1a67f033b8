"""LINFORMER backend (MATE §5.1): reference equality, padding, errors, linear cost."""

import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from mate_cli.errors import MateError
from mate_cli.modeling.attention.backend import REGISTRY
from mate_cli.modeling.attention.linformer import LinformerAttention
from tests.modeling.random_layouts import shaped_layout

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention" / "linformer.yaml"
HEADS, HEAD_DIM = 2, 4


def qkv(layout, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (layout.batch_size, HEADS, layout.seq_len, HEAD_DIM)
    return [torch.randn(shape, generator=gen, dtype=dtype) for _ in range(3)]


def backend(max_length=64, **options) -> LinformerAttention:
    torch.manual_seed(0)
    return LinformerAttention(num_heads=HEADS, head_dim=HEAD_DIM, max_length=max_length, **options).double()


def reference(q, k, v, mask, E, F):
    """softmax(q (E k)^T / sqrt(d)) (F v), one example and head at a time, padding keys zeroed."""
    out = torch.empty_like(q)
    seq = q.shape[2]
    for b in range(q.shape[0]):
        real = mask[b].to(q.dtype)[:, None]
        for h in range(q.shape[1]):
            k_slots = E[:, :seq] @ (k[b, h] * real)
            v_slots = F[:, :seq] @ (v[b, h] * real)
            probs = torch.softmax(q[b, h] @ k_slots.T / math.sqrt(q.shape[-1]), dim=-1)
            out[b, h] = probs @ v_slots
    return out


SHAPES = [(3, 2, 2), (5, 4, 3), (2, 1, 4)]


def test_matches_independent_reference():
    layout = shaped_layout(SHAPES, extra_pad=2)
    attn = backend(k=16)
    q, k, v = qkv(layout)
    out = attn(q, k, v, layout)
    assert out.shape == q.shape
    torch.testing.assert_close(out, reference(q, k, v, layout.attention_mask, attn.E, attn.F))


def test_share_kv_uses_E_for_values():
    layout = shaped_layout(SHAPES)
    attn = backend(k=8, share_kv=True)
    assert attn.F is None and [n for n, _ in attn.named_parameters()] == ["E"]
    q, k, v = qkv(layout)
    torch.testing.assert_close(attn(q, k, v, layout), reference(q, k, v, layout.attention_mask, attn.E, attn.E))


def test_none_layout_means_no_padding():
    layout = shaped_layout([(3, 2, 2), (3, 2, 2)])
    layout = layout.with_fields(attention_mask=torch.ones_like(layout.attention_mask))
    attn = backend(k=8, init="xavier")
    q, k, v = qkv(layout)
    torch.testing.assert_close(attn(q, k, v, None), attn(q, k, v, layout))


def test_padding_never_influences_real_tokens():
    layout = shaped_layout(SHAPES, extra_pad=3)
    attn = backend(k=12)
    q, k, v = qkv(layout)
    pad = ~layout.attention_mask[:, None, :, None]
    noisy = [x + 100.0 * torch.randn_like(x) * pad for x in (q, k, v)]
    real = layout.attention_mask[:, None, :, None].expand_as(q)
    torch.testing.assert_close(attn(*noisy, layout)[real], attn(q, k, v, layout)[real])


def test_amount_of_padding_does_not_matter():
    short, long = shaped_layout(SHAPES, seed=3), shaped_layout(SHAPES, extra_pad=9, seed=3)
    attn = backend(k=12)
    q, k, v = qkv(long)
    n = short.seq_len
    out_short = attn(q[:, :, :n], k[:, :, :n], v[:, :, :n], short)
    out_long = attn(q, k, v, long)
    real = short.attention_mask[:, None, :, None].expand_as(out_short)
    torch.testing.assert_close(out_long[:, :, :n][real], out_short[real])


def test_finite_outputs_and_gradients():
    layout = shaped_layout(SHAPES, extra_pad=2)
    attn = LinformerAttention(num_heads=HEADS, head_dim=HEAD_DIM, max_length=64, k=16, dropout=0.1)
    q, k, v = (x.float().requires_grad_() for x in qkv(layout))
    out = attn(q, k, v, layout)
    out.pow(2).sum().backward()
    assert torch.isfinite(out).all()
    for grad in (q.grad, k.grad, v.grad, attn.E.grad, attn.F.grad):
        assert grad is not None and torch.isfinite(grad).all()
    assert attn.E.grad.abs().sum() > 0 and attn.F.grad.abs().sum() > 0
    assert attn.E.grad[:, layout.seq_len :].abs().sum() == 0  # columns past seq unused


def test_sequence_longer_than_the_projections_names_the_config_key():
    layout = shaped_layout([(3, 4, 4)])
    attn = backend(max_length=layout.seq_len - 1, k=4)
    with pytest.raises(MateError, match="dataset.max_length"):
        attn(*qkv(layout), layout)


def test_cost_is_linear_in_length():
    attn = LinformerAttention(num_heads=HEADS, head_dim=HEAD_DIM, max_length=4096, k=64)

    def flops(seq):
        q = torch.randn(1, HEADS, seq, HEAD_DIM)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            attn(q, q, q, None)
        return counter.get_total_flops()

    assert flops(2048) / flops(1024) <= 2.1


def test_yaml_builds_registered_backend():
    partial = instantiate(OmegaConf.load(CONF))
    attn = partial(num_heads=HEADS, head_dim=HEAD_DIM, max_length=512, dropout=0.1, layer_index=3)
    assert isinstance(attn, REGISTRY["linformer"]) and attn.k == 256
    assert attn.E.shape == (256, 512) and attn.F.shape == (256, 512)
