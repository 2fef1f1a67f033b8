"""Transformer-XH's hop attention against its definition, on the real MiniLM: with no hop layers
(and, at initialisation, with them) it is the plain encoder per sequence; a hub reads only the
hubs it has an edge to, one edge per hop layer; a node with no edge is unaffected by the others."""

from __future__ import annotations

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.modeling.layout import TableLayout
from mate_cli.modeling.xh import TransformerXH


@pytest.fixture(scope="module")
def minilm() -> TableEncoder:
    return TableEncoder.from_pretrained("minilm", "dense").eval()


def nodes(seed: int, count: int = 4, length: int = 12):
    """``count`` sequences ``[CLS] ... [SEP] ...`` of random real word pieces, some padded."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 20000, (count, length), generator=generator)
    ids[:, 0], ids[:, 5] = 101, 102
    lengths = [length - (i % 3) for i in range(count)]
    layout = TableLayout.from_lists([{"segment_ids": [0] * 6 + [1] * (n - 6), "row_ids": [0] * 6 + [1] * (n - 6),
                                      "column_ids": [0] * 6 + [1] * (n - 6)} for n in lengths], seq_len=length)
    return ids, layout


def randomise(model: TransformerXH) -> TransformerXH:
    """Hop weights away from their [I | 0] start, so the hops really mix."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for hop in model.hops:
            for param in hop.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def test_with_no_hop_layers_and_at_initialisation_it_is_the_plain_encoder(minilm):
    ids, layout = nodes(1)
    edges = torch.ones(4, 4, dtype=torch.bool)
    with torch.no_grad():
        plain = minilm(ids, layout)
        assert torch.equal(TransformerXH(minilm, hop_layers=0)(ids, layout, edges), plain)
        started = TransformerXH(minilm)(ids, layout, edges)
    assert float((started - plain)[layout.attention_mask].abs().max()) <= 1e-5


def test_a_hub_reads_only_its_neighbours_one_edge_per_hop_layer(minilm):
    ids, layout = nodes(2)
    # 0 - 1 - 2 in a chain, 3 alone
    edges = torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    changed = ids.clone()
    changed[2, 6:9] = torch.tensor([3000, 4000, 5000])  # node 2's text only
    for hop_layers, reaches_node_0 in ((1, False), (2, True)):
        model = randomise(TransformerXH(minilm, hop_layers=hop_layers)).eval()
        with torch.no_grad():
            before, after = model(ids, layout, edges), model(changed, layout, edges)
        moved = (after - before).abs().amax(dim=(1, 2))
        assert float(moved[1]) > 1e-4  # node 1 reads node 2 over their edge
        assert (float(moved[0]) > 1e-4) == reaches_node_0  # node 0 is two edges away
        assert float(moved[3]) == 0.0  # no edge: unaffected by every other node
    # and the isolated node computes what the plain encoder's layers compute for it alone
    model = randomise(TransformerXH(minilm, hop_layers=2)).eval()
    with torch.no_grad():
        alone = model(ids[3:], layout.select(slice(3, 4)), torch.zeros(1, 1, dtype=torch.bool))
        together = model(ids, layout, edges)[3:]
    real = layout.attention_mask[3:]
    assert float((alone - together)[real].abs().max()) <= 1e-5


def test_hop_gradients_are_finite_with_an_isolated_node(minilm):
    ids, layout = nodes(3)
    edges = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    model = randomise(TransformerXH(minilm, hop_layers=1))
    model(ids, layout, edges)[:, 0].sum().backward()
    grads = [p.grad for p in model.hops.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert float(model.hops[0].query.weight.grad.abs().sum()) > 0  # node 0 weighs two neighbours


def test_bad_settings_are_one_line(minilm):
    with pytest.raises(MateError, match="model.hop_layers=7"):
        TransformerXH(minilm, hop_layers=7)
    ids, layout = nodes(4)
    with pytest.raises(MateError, match=r"edges has shape \(3, 3\)"):
        TransformerXH(minilm)(ids, layout, torch.ones(3, 3, dtype=torch.bool))
