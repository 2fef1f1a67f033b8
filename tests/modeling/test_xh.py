"""Transformer-XH's hop attention against its definition, on the real MiniLM: with no hop layers
(and, at initialisation, with them) it is the plain encoder per sequence; a hub reads only the
hubs it has an edge to, one edge per hop layer; a node with no edge is unaffected by the others."""

from __future__ import annotations

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import TableLayout
from mate_cli.modeling.xh import HopLayers


@pytest.fixture(scope="module")
def minilm() -> TableEncoder:
    """MiniLM with its missing token-type tables drawn from a fixed seed: the same function whichever tests ran
    before in this process (the tolerances below are float32 round-off of that one function)."""
    torch.manual_seed(0)
    return TableEncoder.from_pretrained("minilm", "dense").eval()


def nodes(seed: int, count: int = 4, length: int = 12):
    """``count`` sequences ``[CLS] ... [SEP] ...`` of random real word pieces, some padded."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 20000, (count, length), generator=generator)
    ids[:, 0], ids[:, 5] = 101, 102
    lengths = [length - (i % 3) for i in range(count)]
    layout = TableLayout.from_lists(
        [
            {
                "segment_ids": [0] * 6 + [1] * (n - 6),
                "row_ids": [0] * 6 + [1] * (n - 6),
                "column_ids": [0] * 6 + [1] * (n - 6),
            }
            for n in lengths
        ],
        seq_len=length,
    )
    return ids, layout


def randomise(hop: HopLayers) -> HopLayers:
    """Hop weights away from their [I | 0] start, so the hops really mix."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in hop.hops:
            for param in layer.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return hop


def test_with_no_hop_layers_and_at_initialisation_it_is_the_plain_encoder(minilm):
    ids, layout = nodes(1)
    edges = torch.ones(4, 4, dtype=torch.bool)
    with torch.no_grad():
        plain = minilm(ids, layout)
        assert torch.equal(HopLayers(minilm.config, hop_layers=0)(minilm, ids, layout, edges), plain)
        started = HopLayers(minilm.config)(minilm, ids, layout, edges)
    assert float((started - plain)[layout.attention_mask].abs().max()) <= 1e-5


def test_a_hub_reads_only_its_neighbours_one_edge_per_hop_layer(minilm):
    ids, layout = nodes(2)
    # 0 - 1 - 2 in a chain, 3 alone
    edges = torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    changed = ids.clone()
    changed[2, 6:9] = torch.tensor([3000, 4000, 5000])  # node 2's text only
    for hop_layers, reaches_node_0 in ((1, False), (2, True)):
        hop = randomise(HopLayers(minilm.config, hop_layers=hop_layers)).eval()
        with torch.no_grad():
            before, after = hop(minilm, ids, layout, edges), hop(minilm, changed, layout, edges)
        moved = (after - before).abs().amax(dim=(1, 2))
        assert float(moved[1]) > 1e-4  # node 1 reads node 2 over their edge
        assert (float(moved[0]) > 1e-4) == reaches_node_0  # node 0 is two edges away
        assert float(moved[3]) == 0.0  # no edge: unaffected by every other node
    # and the isolated node computes what the plain encoder's layers compute for it alone
    hop = randomise(HopLayers(minilm.config, hop_layers=2)).eval()
    with torch.no_grad():
        alone = hop(minilm, ids[3:], layout.select(slice(3, 4)), torch.zeros(1, 1, dtype=torch.bool))
        together = hop(minilm, ids, layout, edges)[3:]
    real = layout.attention_mask[3:]
    assert float((alone - together)[real].abs().max()) <= 1e-5


def test_hop_gradients_are_finite_with_an_isolated_node(minilm):
    ids, layout = nodes(3)
    edges = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    hop = randomise(HopLayers(minilm.config, hop_layers=1))
    hop(minilm, ids, layout, edges)[:, 0].sum().backward()
    grads = [p.grad for p in hop.hops.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert float(hop.hops[0].query.weight.grad.abs().sum()) > 0  # node 0 weighs two neighbours


def test_bad_settings_are_one_line(minilm):
    with pytest.raises(MateError, match="model.hop_layers=7"):
        HopLayers(minilm.config, hop_layers=7)
    ids, layout = nodes(4)
    with pytest.raises(MateError, match=r"edges has shape \(3, 3\)"):
        HopLayers(minilm.config)(minilm, ids, layout, torch.ones(3, 3, dtype=torch.bool))


# ---------------------------------------------------------------- the HybridQA baseline (PointR stage 1)
@pytest.fixture(scope="module")
def hybridqa_graphs(sample_root):
    """The graphs of 3 dev questions on tables of at most 10 rows (12 nodes of 48 tokens: passages too)."""
    from mate_cli.data.graph import encode_graph
    from mate_cli.data.hybridqa import HybridQAReader
    from mate_cli.data.tokenize import TableTokenizer
    from mate_cli.pretrained import load_tokenizer

    reader = HybridQAReader(sample_root)
    tok = TableTokenizer(load_tokenizer("minilm"), max_length=48)
    questions = [q for q in reader.questions("dev") if reader.table(q.table_id).num_rows <= 10][:3]
    return [
        encode_graph(
            tok,
            q,
            reader.table(q.table_id),
            reader.passages(q.table_id),
            {"k": 0, "scope": "table", "method": "tfidf"},
            max_nodes=12,
        )
        for q in questions
    ]


def xh_module(minilm, hop_layers):
    from mate_cli.lit_modules.xh import GraphCellSelectionModule

    module = GraphCellSelectionModule(minilm, torch.optim.AdamW, None, hop_layers=hop_layers).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.hop.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        module.head.token_scorer.weight.copy_(torch.randn(module.head.token_scorer.weight.shape, generator=generator))
    return module


def test_cell_logits_are_each_cells_token_mean_over_the_questions_row_nodes_whatever_the_batch(minilm, hybridqa_graphs):
    from mate_cli.data.graph import GraphCollator

    module = xh_module(minilm, hop_layers=2)
    batch = GraphCollator(0)(hybridqa_graphs)
    with torch.no_grad():
        logits = module(batch)
        hidden = module.hop(minilm, batch.input_ids, batch.layout, batch.edges)
        tokens = module.head.token_scorer(hidden).squeeze(-1)
    for q, graph in enumerate(hybridqa_graphs):
        assert not bool(batch.cell_mask[q, 0]) and float(logits[q, 0]) == torch.finfo(logits.dtype).min
        for k in range(1, len(graph["cell_coords"]) + 1):
            mine = (batch.node_graph[:, None] == q) & (batch.layout.cell_ids == k) & batch.layout.attention_mask
            assert torch.allclose(logits[q, k], tokens[mine].mean(), atol=1e-6)
        with torch.no_grad():  # alone, padded differently: the same function
            alone = module(GraphCollator(0)([graph]))
        cells = batch.cell_mask[q]
        assert float((alone[0, cells[: alone.shape[1]]] - logits[q, cells]).abs().max()) <= 1e-5


def test_passage_evidence_reaches_the_cells_of_the_rows_that_link_it_through_two_hop_layers(minilm, hybridqa_graphs):
    from mate_cli.data.graph import GraphCollator

    graph = next(g for g in hybridqa_graphs if len(g["node_input_ids"]) > g["row_nodes"])
    rows, passage = graph["row_nodes"], graph["row_nodes"]  # the first passage node
    linked = {a for a, b in graph["edges"] if b == passage}
    assert linked and len(linked) < rows, "the test needs a passage linked from some rows but not all"
    changed = {**graph, "node_input_ids": [list(ids) for ids in graph["node_input_ids"]]}
    start = graph["node_layouts"][passage]["segment_ids"].index(1)
    changed["node_input_ids"][passage][start:] = [2023] * (len(changed["node_input_ids"][passage]) - start)
    row_of = [xy[0] for xy in graph["cell_coords"]]
    for hop_layers, reaches in ((1, False), (2, True)):
        module = xh_module(minilm, hop_layers)
        with torch.no_grad():
            before, after = module(GraphCollator(0)([graph]))[0, 1:], module(GraphCollator(0)([changed]))[0, 1:]
        moved = {row: float((after - before)[[r == row for r in row_of]].abs().max()) for row in set(row_of)}
        # the last layer's hop only changes the hubs, which no cell token reads any more; one layer
        # earlier, a linked row's hub reads the passage and its cell tokens read the hub
        assert all((moved[r] > 1e-5) == reaches for r in linked), moved
        assert all(moved[r] == 0.0 for r in set(row_of) - linked)  # two edges away: needs a third hop layer


def test_a_compiled_encoder_is_refused_for_transformer_xh(tmp_path):
    """XH runs the encoder's layers one by one with hop attention between them: the compiled stack would be skipped
    silently, so ``model.encoder.compile`` is refused in one line when the model is built."""
    from hydra.utils import instantiate

    from tests.inprocess import compose_command

    from mate_cli.run.job import find_mate_error

    cfg = compose_command("train", ["experiment=hybridqa_xh", "model.encoder.compile=aot_eager"], tmp_path)
    with pytest.raises(Exception) as raised:  # Hydra's instantiate wraps it; the command prints the MateError's line
        instantiate(cfg.model)
    line = str(find_mate_error(raised.value))
    assert "Transformer-XH runs one layer at a time" in line and line.endswith(
        "set model.encoder.compile=false for model=xh"
    )
