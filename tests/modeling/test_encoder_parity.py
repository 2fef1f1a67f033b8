"""TableEncoder with attention=dense reproduces transformers' TapasModel and BertModel.

The reference models are built independently here (random TapasConfig; the bundled
MiniLM through BertModel), so a shared bug cannot hide. Measured max |diff| values
are logged (run with ``-o log_cli=true --log-cli-level=INFO`` to see them) and
recorded as junit properties.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mate_cli.errors import MateError
from mate_cli.modeling.attention.backend import AttentionBackend
from mate_cli.modeling.attention.dense import DenseAttention
from mate_cli.pretrained import bundled_model_dir, load_tokenizer
from mate_cli.modeling.embeddings import cell_position_ids
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import TableLayout
from tests.modeling.table_batches import VOCAB, table_batch

transformers = pytest.importorskip("transformers")
log = logging.getLogger(__name__)
TOLERANCE = 1e-5


def report(record_property, name: str, value: float) -> None:
    log.info("max |diff| %s = %.3e", name, value)
    record_property(f"max_abs_diff[{name}]", f"{value:.3e}")


def tiny_tapas_config(reset: bool):
    return transformers.TapasConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        reset_position_index_per_cell=reset,
    )


# ------------------------------------------------------------------- TAPAS
@pytest.mark.parametrize("scrambled", [False, True], ids=["table", "scrambled"])
@pytest.mark.parametrize("reset", [False, True], ids=["absolute", "reset"])
def test_dense_matches_tapas_model(tmp_path, record_property, reset, scrambled):
    torch.manual_seed(0)
    reference = transformers.TapasModel(tiny_tapas_config(reset)).eval()
    reference.save_pretrained(tmp_path)
    ours = TableEncoder.from_pretrained(tmp_path, "dense").eval()
    assert ours.config.reset_position_index_per_cell is reset  # follows the TAPAS config

    input_ids, layout = table_batch(seed=1, lengths=[48, 31, 12], scrambled=scrambled)
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids, attention_mask=layout.attention_mask.long(), token_type_ids=layout.token_type_ids
        )
        hidden = ours(input_ids, layout)
    diff = (hidden - expected.last_hidden_state).abs().max().item()
    pooled = (ours.pooler(hidden) - expected.pooler_output).abs().max().item()
    case = f"{'reset' if reset else 'absolute'},{'scrambled' if scrambled else 'table'}"
    report(record_property, f"tapas[{case}]", diff)
    report(record_property, f"tapas_pooler[{case}]", pooled)
    assert diff <= TOLERANCE and pooled <= TOLERANCE


def test_reset_positions_restart_per_cell():
    # [CLS] q q [SEP] | h1 h1 h2 | c11 c11 c12 | pad pad      (column, row) per token
    columns = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 1, 1, 2, 0, 0]])
    rows = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0]])
    positions = cell_position_ids(columns, rows, max_position=11, num_rows=256)
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 0, 0, 1, 0, 10, 10]]  # padding clipped to 10


def test_token_type_ids_beyond_their_table_are_one_line_naming_the_field():
    """Checked on the host: in the CPU forward, and by the Lightning modules before a batch moves to a GPU (the
    same method), so a GPU forward never waits for the host."""
    input_ids, layout = table_batch(seed=3, lengths=[40, 30])
    config = EncoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                           max_position_embeddings=64)  # fmt: skip
    model = TableEncoder(config, "dense").eval()
    model(input_ids, layout)
    model.embeddings.check_type_ids(layout)  # within the tables
    wide = layout.with_fields(row_ids=layout.row_ids + config.type_vocab_sizes[2])
    message = (
        r"^layout\.row_ids holds id \d+ but token_type_embeddings_2 has only 256 entries; .*type_vocab_sizes\[2\]$"
    )
    with pytest.raises(MateError, match=message):
        model.embeddings.check_type_ids(wide)
    with pytest.raises(MateError, match=message):
        model(input_ids, wide)
    negative = layout.with_fields(row_ids=layout.row_ids.masked_fill(layout.row_ids == 0, -1))
    with pytest.raises(MateError, match=r"^layout\.row_ids holds id -1 but"):  # the id that is wrong, not the largest
        model.embeddings.check_type_ids(negative)


def test_reset_changes_the_output():
    input_ids, layout = table_batch(seed=2, lengths=[40])
    torch.manual_seed(0)
    config = EncoderConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    model = TableEncoder(config, "dense").eval()
    with torch.no_grad():
        absolute = model(input_ids, layout)
        model.embeddings.reset_position_index_per_cell = True
        reset = model(input_ids, layout)
    assert (absolute - reset).abs().max() > 1e-3


# ------------------------------------------------------------------- BERT (bundled MiniLM)
def test_dense_matches_bert_model_on_bundled_minilm(record_property):
    reference = transformers.BertModel.from_pretrained(str(bundled_model_dir())).eval()
    ours = TableEncoder.from_pretrained("minilm", "dense").eval()
    assert ours.config.reset_position_index_per_cell is False
    with torch.no_grad():  # the TAPAS-only tables are new: silence them to compare with BERT
        for table in ours.embeddings.token_type_tables()[1:]:
            table.weight.zero_()

    tokenizer = load_tokenizer("minilm")
    batch = tokenizer(
        ["which county is the town of ashford in?", "year?"],
        ["ashford | kent | england | 1 | 2 | 3 | borough", "1999"],
        padding=True,
        return_tensors="pt",
    )
    mask = batch["attention_mask"].bool()
    assert not mask.all()  # the batch has padding
    segments = batch["token_type_ids"]
    layout = TableLayout(
        attention_mask=mask,
        segment_ids=segments,
        row_ids=torch.zeros_like(segments),
        column_ids=torch.zeros_like(segments),
    )
    with torch.no_grad():
        expected = reference(**batch)
        hidden = ours(batch["input_ids"], layout)
    diff = (hidden - expected.last_hidden_state).abs()[mask].max().item()
    pooled = (ours.pooler(hidden) - expected.pooler_output).abs().max().item()
    report(record_property, "bert_minilm", diff)
    report(record_property, "bert_minilm_pooler", pooled)
    assert diff <= TOLERANCE and pooled <= TOLERANCE


def test_bert_task_checkpoint_with_prefix_loads(tmp_path, record_property, caplog):
    """A ``BertForSequenceClassification`` save (``bert.`` keys + a head) loads into the encoder."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    reference = transformers.BertModel.from_pretrained(tmp_path).eval()
    with caplog.at_level(logging.INFO, logger="mate_cli.modeling.checkpoints"):
        ours = TableEncoder.from_pretrained(tmp_path, "dense").eval()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded"))
    assert "classifier.weight" in line and "token_type_embeddings_1.weight" in line
    with torch.no_grad():
        for table in ours.embeddings.token_type_tables()[1:]:
            table.weight.zero_()
        input_ids, layout = table_batch(seed=3, lengths=[30, 20])
        layout = layout.with_fields(
            row_ids=torch.zeros_like(layout.row_ids), column_ids=torch.zeros_like(layout.column_ids)
        )
        expected = reference(
            input_ids=input_ids, attention_mask=layout.attention_mask.long(), token_type_ids=layout.segment_ids
        ).last_hidden_state
        hidden = ours(input_ids, layout)
    diff = (hidden - expected).abs()[layout.attention_mask].max().item()
    report(record_property, "bert_prefixed", diff)
    assert diff <= TOLERANCE


# ------------------------------------------------------------------- encoder mechanics
class PrefixDense(DenseAttention):
    """Dense attention that prepends two learned-free memory tokens (tests the hook)."""

    def extend_inputs(self, hidden, layout):
        prefix = hidden.new_zeros(hidden.shape[0], 2, hidden.shape[2])
        ones = layout.attention_mask.new_ones(layout.batch_size, 2)
        zeros = layout.segment_ids.new_zeros(layout.batch_size, 2)
        grown = TableLayout(
            attention_mask=torch.cat([ones, layout.attention_mask], 1),
            **{name: torch.cat([zeros, getattr(layout, name)], 1) for name in ("segment_ids", "row_ids", "column_ids")},
        )
        return torch.cat([prefix, hidden], 1), grown, 2


def test_extend_inputs_prefix_is_dropped():
    input_ids, layout = table_batch(seed=4, lengths=[20, 16])
    config = EncoderConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    model = TableEncoder(config, PrefixDense).eval()
    with torch.no_grad():
        hidden = model(input_ids, layout)
    assert hidden.shape == (2, 20, 32)


def test_backend_factory_receives_layer_keywords():
    seen = []

    def factory(**kwargs) -> AttentionBackend:
        seen.append(kwargs)
        return DenseAttention(**kwargs)

    config = EncoderConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        attention_dropout=0.25,
        reset_position_index_per_cell=True,
    )
    TableEncoder(config, factory, max_length=256)
    assert seen == [dict(num_heads=4, head_dim=8, max_length=256, dropout=0.25, layer_index=i) for i in range(2)]


def test_hydra_yaml_builds_the_backend():
    root = Path(__file__).resolve().parents[2] / "conf" / "attention"
    for name in ("dense", "none"):
        factory = instantiate(OmegaConf.load(root / f"{name}.yaml"))
        backend = factory(num_heads=2, head_dim=8, max_length=64, dropout=0.0, layer_index=0)
        assert backend.name == name


def test_too_long_without_reset_is_a_mate_error():
    config = EncoderConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=16
    )
    with pytest.raises(MateError, match=r"dataset\.max_length.*model\.encoder\.reset_position_index_per_cell=true"):
        TableEncoder(config, "dense", max_length=32)
    model = TableEncoder(config, "dense").eval()
    input_ids, layout = table_batch(seed=5, lengths=[24])
    with pytest.raises(MateError, match=r"dataset\.max_length.*model\.encoder\.reset_position_index_per_cell=true"):
        model(input_ids, layout)


def test_token_type_overflow_is_a_mate_error():
    config = EncoderConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_sizes=[3, 256, 4, 2, 256, 256, 10],
    )
    input_ids, layout = table_batch(seed=6, lengths=[60])
    with pytest.raises(MateError, match=r"layout\.row_ids .*type_vocab_sizes\[2\]"):
        TableEncoder(config, "dense")(input_ids, layout)


def test_none_backend_refuses_training():
    input_ids, layout = table_batch(seed=7, lengths=[20])
    config = EncoderConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    model = TableEncoder(config, "none")
    with pytest.raises(MateError, match=r"attention=none.*benchmark floor.*attention=dense"):
        model.train()(input_ids, layout)
    with torch.no_grad():  # benchmarking (no grad) is what it is for
        assert model(input_ids, layout).shape == (1, 20, 32)
    assert model.eval()(input_ids, layout).shape == (1, 20, 32)
