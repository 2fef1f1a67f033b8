"""What a head on the whole sequence reads (``model.pooling``): TAPAS's pooled [CLS], or the mean
of the last states over the real tokens, for TabFact's classifier and WikiTQ's aggregation
classifier, on the real MiniLM and the bundled samples."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from mate_cli.errors import MateError
from tests.inprocess import compose_command

#: experiment -> what its sequence-level head outputs, from the module's forward
HEADS = {"tabfact_tapas": lambda out: out, "wtq_tapas": lambda out: out.aggregation_logits}


@pytest.fixture(scope="module", params=list(HEADS))
def sample(request, module_tmp):
    tmp = module_tmp("pooling")
    overrides = [f"experiment={request.param}", "dataset.max_length=128", "dataset.num_proc=1", "dataset.num_workers=0"]
    datamodule = instantiate(compose_command("train", overrides, tmp).dataset, cache_dir=str(tmp / "cache"))
    datamodule.prepare_data()
    datamodule.setup("fit")
    examples = [datamodule.datasets["train"][i] for i in range(4)]
    return overrides, tmp, examples, datamodule.collator(), HEADS[request.param]


def build(sample, pooling: str):
    overrides, tmp, _, _, head = sample
    torch.manual_seed(0)
    model = instantiate(compose_command("train", [*overrides, f"model.pooling={pooling}"], tmp).model).eval()
    return lambda batch: head(model(batch)), model


def test_mean_pooling_ignores_padding_and_the_pooler(sample):
    _, _, examples, collate, _ = sample
    lengths = [len(e["input_ids"]) for e in examples]
    short = lengths.index(min(lengths))
    assert min(lengths) < max(lengths)  # the batch pads the shortest example
    head, model = build(sample, "mean")
    with torch.no_grad():
        together = head(collate(examples))[short]
        alone = head(collate([examples[short]]))[0]
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
        model.encoder.pooler.dense.weight.normal_()  # nothing reads the pooler
        torch.testing.assert_close(head(collate([examples[short]]))[0], alone)
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())


def test_query_pooling_reads_the_query_set_only(sample):
    """``query``: the mean of the query set's last states; a table token's state changes nothing, a query token's
    does (the states are changed after the encoder, as the head sees them)."""
    _, _, examples, collate, _ = sample
    head, model = build(sample, "query")
    batch = collate(examples[:1])
    layout = batch.layout
    with torch.no_grad():
        hidden = model.encode(batch.input_ids, layout)
        pooled = model.pool(hidden, layout)
        table = layout.is_table[0].nonzero()[0, 0]
        query = layout.is_query[0].nonzero()[-1, 0]
        changed = hidden.clone()
        changed[0, table] += 1.0
        torch.testing.assert_close(model.pool(changed, layout), pooled)
        changed[0, query] += 1.0
        assert not torch.allclose(model.pool(changed, layout), pooled)
        assert not torch.allclose(pooled, build(sample, "mean")[1].pool(hidden, layout))
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())


def test_cls_pooling_reads_the_pooler(sample):
    _, _, examples, collate, _ = sample
    head, model = build(sample, "cls")
    batch = collate(examples)
    with torch.no_grad():
        before = head(batch)
        torch.testing.assert_close(before, build(sample, "cls")[0](batch))  # one function: same seed, same logits
        assert not torch.allclose(before, build(sample, "mean")[0](batch))
        model.encoder.pooler.dense.weight.normal_()
        assert not torch.allclose(before, head(batch))
    assert all(p.requires_grad for p in model.encoder.pooler.parameters())


def test_an_unknown_pooling_is_one_line_naming_the_key(sample):
    with pytest.raises(Exception) as raised:  # Hydra wraps it; `mate` prints the cause, one line
        build(sample, "max")
    cause = raised.value.__cause__ or raised.value
    assert isinstance(cause, MateError)
    assert str(cause) == "model.pooling='max' is invalid; use one of cls, mean, query"
