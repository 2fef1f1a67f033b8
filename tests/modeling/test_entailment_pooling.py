"""TabFact's classifier input (``model.pooling``): TAPAS's pooled [CLS], or the mean of the last
states over the real tokens, on the real MiniLM and the bundled TabFact sample."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from mate_cli.errors import MateError
from tests.conf.test_compose import compose_train


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pooling")
    overrides = ["experiment=tabfact_tapas", "dataset.max_length=128", "dataset.num_proc=1", "dataset.num_workers=0"]
    datamodule = instantiate(compose_train(overrides, tmp).dataset, cache_dir=str(tmp / "cache"))
    datamodule.prepare_data()
    datamodule.setup("fit")
    examples = [datamodule.datasets["train"][i] for i in range(4)]
    return overrides, tmp, examples, datamodule.collator()


def build(sample, pooling: str):
    overrides, tmp, _, _ = sample
    torch.manual_seed(0)
    return instantiate(compose_train([*overrides, f"model.pooling={pooling}"], tmp).model).eval()


def test_mean_pooling_ignores_padding_and_the_pooler(sample):
    _, _, examples, collate = sample
    lengths = [len(e["input_ids"]) for e in examples]
    short = lengths.index(min(lengths))
    assert min(lengths) < max(lengths)  # the batch pads the shortest example
    model = build(sample, "mean")
    with torch.no_grad():
        together = model(collate(examples))[short]
        alone = model(collate([examples[short]]))[0]
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
        model.encoder.pooler.dense.weight.normal_()  # nothing reads the pooler
        torch.testing.assert_close(model(collate([examples[short]]))[0], alone)
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())


def test_cls_pooling_reads_the_pooler(sample):
    _, _, examples, collate = sample
    model = build(sample, "cls")
    batch = collate(examples)
    with torch.no_grad():
        before = model(batch)
        torch.testing.assert_close(before, build(sample, "cls")(batch))  # one function: same seed, same logits
        assert not torch.allclose(before, build(sample, "mean")(batch))
        model.encoder.pooler.dense.weight.normal_()
        assert not torch.allclose(before, model(batch))


def test_an_unknown_pooling_is_one_line_naming_the_key(sample):
    with pytest.raises(Exception) as raised:  # Hydra wraps it; `mate` prints the cause, one line
        build(sample, "max")
    cause = raised.value.__cause__ or raised.value
    assert isinstance(cause, MateError)
    assert str(cause) == "model.pooling='max' is invalid; use one of cls, mean"
