"""The masked-LM head: TAPAS/BERT checkpoints' ``cls.predictions`` load into it, a saved
encoder + head loads in ``transformers.TapasForMaskedLM``, and both give the same logits."""

from __future__ import annotations

import logging

import pytest
import torch

from mate_cli.modeling.encoder import TableEncoder
from mate_cli.modeling.mlm import MaskedLMHead, load_mlm_head, mlm_state_dict
from tests.modeling.table_batches import VOCAB, table_batch

transformers = pytest.importorskip("transformers")
log = logging.getLogger(__name__)
TOLERANCE = 1e-5


def tiny_tapas_mlm(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.TapasConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.TapasForMaskedLM(config)
    with torch.no_grad():  # non-zero bias and LayerNorm so loading them is checked
        model.cls.predictions.bias.normal_()
        model.cls.predictions.transform.LayerNorm.weight.normal_()
    return model.eval()


def ours_from(directory) -> tuple[TableEncoder, MaskedLMHead]:
    encoder = TableEncoder.from_pretrained(directory, "dense").eval()
    head = MaskedLMHead(encoder.config, encoder.embeddings.word_embeddings).eval()
    return encoder, head


def assert_same_logits(record_property, name, reference, encoder, head, seed, lengths) -> None:
    """Our encoder + head and a ``TapasForMaskedLM`` give the same logits on a TAPAS-style batch."""
    input_ids, layout = table_batch(seed=seed, lengths=lengths)
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids, attention_mask=layout.attention_mask.long(), token_type_ids=layout.token_type_ids
        ).logits
        logits = head(encoder(input_ids, layout))
    diff = (logits - expected).abs()[layout.attention_mask].max().item()
    record_property(f"max_abs_diff[{name}]", f"{diff:.3e}")
    assert diff <= TOLERANCE


def test_tapas_masked_lm_loads_with_the_same_logits(tmp_path, record_property):
    reference = tiny_tapas_mlm()
    reference.save_pretrained(tmp_path)
    encoder, head = ours_from(tmp_path)
    assert "transform.dense.weight" in load_mlm_head(head, str(tmp_path))
    assert_same_logits(record_property, "mlm.load", reference, encoder, head, seed=3, lengths=[40, 27])


def test_saved_encoder_and_head_load_in_tapas_for_masked_lm(tmp_path, record_property):
    reference = tiny_tapas_mlm(seed=1)
    reference.save_pretrained(tmp_path / "start")
    encoder, head = ours_from(tmp_path / "start")
    load_mlm_head(head, str(tmp_path / "start"))
    with torch.no_grad():  # move away from the start so the round trip carries our values
        head.bias.add_(0.5)
        encoder.embeddings.word_embeddings.weight.mul_(1.1)
    encoder.save_pretrained(tmp_path / "saved", extra_state=mlm_state_dict(head), prefix="tapas.")
    loaded = transformers.TapasForMaskedLM.from_pretrained(tmp_path / "saved").eval()
    assert_same_logits(record_property, "mlm.save", loaded, encoder, head, seed=4, lengths=[33, 40])
    again, _ = ours_from(tmp_path / "saved")  # and our own loader reads the prefixed directory
    assert torch.equal(again.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight)


def test_the_decoder_is_the_word_embedding_table(tmp_path):
    tiny_tapas_mlm().save_pretrained(tmp_path)
    encoder, head = ours_from(tmp_path)
    hidden = torch.randn(2, 5, encoder.config.hidden_size)
    head(hidden).sum().backward()
    assert encoder.embeddings.word_embeddings.weight.grad is not None  # one table, trained from both ends
    with torch.no_grad():
        encoder.embeddings.word_embeddings.weight[7].zero_()
        assert torch.allclose(head(hidden)[..., 7], head.bias[7].expand(2, 5))


def test_bundled_minilm_has_no_mlm_head_and_starts_tied():
    encoder = TableEncoder.from_pretrained("minilm", "dense")
    head = MaskedLMHead(encoder.config, encoder.embeddings.word_embeddings)
    assert load_mlm_head(head, "minilm") == []  # a sentence encoder: no cls.predictions tensors
    assert head.decoder_weight is encoder.embeddings.word_embeddings.weight
    assert "decoder_weight" not in head.state_dict() and set(head.state_dict()) == {
        "bias",
        "transform.dense.weight",
        "transform.dense.bias",
        "transform.LayerNorm.weight",
        "transform.LayerNorm.bias",
    }
