"""Extra layers on the encoder and DT-Fixup (Xu et al. 2021, §3.3): the initialisations, the
scaling factors for a known mu, LayerNorm and warm-up removed, and one function per config
(padding and batch-mates change nothing; relative positions make the layers order-aware)."""

from __future__ import annotations

import math

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.extra_layers import ExtraLayers, dt_fixup_scale

CONFIG = EncoderConfig(
    vocab_size=50,
    hidden_size=32,
    num_layers=1,
    num_heads=4,
    intermediate_size=64,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def layers(init="dt_fixup", relative=False, n=4, seed=0) -> ExtraLayers:
    torch.manual_seed(seed)
    return ExtraLayers(CONFIG, n, init, relative, max_distance=3).eval()


@pytest.mark.parametrize("relative, expected", [(False, 4**-0.5 / 20), (True, (4 * (400 + 20 + 2)) ** -0.5)])
def test_dt_fixup_scales_v_w_and_the_mlp_by_the_papers_factor(relative, expected):
    assert dt_fixup_scale(10.0, 4, relative) == pytest.approx(expected, rel=1e-12)
    model = layers(relative=relative)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert model.needs_mu
    assert model.apply_dt_fixup(10.0) == pytest.approx(expected, rel=1e-12)
    assert not model.needs_mu and float(model.mu) == 10.0
    scaled = ("value.weight", "output.weight", "fc1.weight", "fc2.weight") + (
        ("relative_value.weight",) if relative else ()
    )
    for name, parameter in model.named_parameters():
        factor = expected if name.endswith(scaled) else 1.0
        assert torch.allclose(parameter, before[name] * factor, rtol=1e-6, atol=0), name


def test_dt_fixup_layers_have_xavier_weights_and_no_layer_norm():
    model = layers()
    first = model.layers[0]
    assert isinstance(first.norm1, torch.nn.Identity) and isinstance(first.norm2, torch.nn.Identity)
    bound = math.sqrt(6 / (32 + 64))  # Xavier-uniform for fc1 [64, 32]
    assert 0.9 * bound < float(first.fc1.weight.detach().abs().max()) <= bound
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in model.named_parameters() if n.endswith("bias"))
    for init in ("default", "xavier"):
        assert isinstance(layers(init).layers[0].norm1, torch.nn.LayerNorm)
    assert float(layers("default").layers[0].fc1.weight.detach().std()) == pytest.approx(
        CONFIG.initializer_range, rel=0.1
    )


@pytest.mark.parametrize("relative", [False, True])
def test_padding_and_batch_mates_change_nothing(relative):
    model = layers("xavier", relative)
    torch.manual_seed(1)
    alone = torch.randn(1, 5, 32)
    batch = torch.cat([torch.cat([alone, torch.randn(1, 3, 32)], 1), torch.randn(1, 8, 32)])
    mask = torch.tensor([[True] * 5 + [False] * 3, [True] * 8])
    with torch.no_grad():
        expected = model(alone, torch.ones(1, 5, dtype=torch.bool))
        got = model(batch, mask)[:1, :5]
    assert (got - expected).abs().max() <= 1e-5


def test_relative_positions_make_the_layers_order_aware():
    torch.manual_seed(2)
    x, mask = torch.randn(1, 6, 32), torch.ones(1, 6, dtype=torch.bool)
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        for relative, equivariant in ((False, True), (True, False)):
            model = layers("xavier", relative)
            same = torch.allclose(model(x[:, order], mask), model(x, mask)[:, order], atol=1e-5)
            assert same == equivariant


def test_bad_settings_are_one_line():
    with pytest.raises(MateError, match="model.extra_init='fixup' is not one of default, xavier, dt_fixup"):
        ExtraLayers(CONFIG, 2, "fixup")
    with pytest.raises(MateError, match="positive finite norm"):
        layers().apply_dt_fixup(0.0)


def test_dt_fixup_refuses_a_warm_up():
    from functools import partial

    from mate_cli.lit_modules.cell_selection import CellSelectionModule
    from mate_cli.trainer.optim import linear_warmup
    from mate_cli.modeling.encoder import TableEncoder

    encoder = TableEncoder(CONFIG, "dense", max_length=16)
    with pytest.raises(MateError, match="set model.scheduler.warmup_ratio=0"):
        CellSelectionModule(
            encoder, torch.optim.AdamW, partial(linear_warmup, warmup_ratio=0.05), extra_layers=2, extra_init="dt_fixup"
        )
    module = CellSelectionModule(
        encoder, torch.optim.AdamW, partial(linear_warmup, warmup_ratio=0.0), extra_layers=2, extra_init="dt_fixup"
    )
    assert module.extra is not None and module.extra.needs_mu
    with pytest.raises(MateError, match="model.extra_init='dtfixup' is not one of"):  # a typo, even with no layers
        CellSelectionModule(encoder, torch.optim.AdamW, None, extra_layers=0, extra_init="dtfixup")
