"""The encoder's configuration (apart from the modules, as Hugging Face does) and BERT/TAPAS ``config.json``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mate_cli.errors import MateError
from mate_cli.layout import TAPAS_TYPE_VOCAB_SIZES

#: EncoderConfig field -> Hugging Face (BertConfig/TapasConfig) key, where they differ.
HF_NAMES = {
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "hidden_dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
}


@dataclass
class EncoderConfig:
    """Shape and regularisation of a :class:`TableEncoder` (BERT-base sizes by default)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_sizes: list[int] = field(default_factory=lambda: list(TAPAS_TYPE_VOCAB_SIZES))
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    pad_token_id: int = 0
    initializer_range: float = 0.02
    reset_position_index_per_cell: bool = False

    @classmethod
    def from_hf_dict(cls, hf: dict) -> "EncoderConfig":
        """From a BERT or TAPAS ``config.json``; BERT's ``type_vocab_size`` sizes the segment table, so its weights
        load unchanged, and the other six sizes are TAPAS's."""
        values = {}
        for f in dataclasses.fields(cls):
            key = HF_NAMES.get(f.name, f.name)
            if key in hf and f.name not in ("type_vocab_sizes", "reset_position_index_per_cell"):
                values[f.name] = hf[key]
        if hf.get("model_type") == "tapas":
            values["type_vocab_sizes"] = list(hf.get("type_vocab_sizes", TAPAS_TYPE_VOCAB_SIZES))
            values["reset_position_index_per_cell"] = bool(hf.get("reset_position_index_per_cell", True))
        else:
            values["type_vocab_sizes"] = [int(hf.get("type_vocab_size", 2)), *TAPAS_TYPE_VOCAB_SIZES[1:]]
        return cls(**values)

    def to_tapas_dict(self) -> dict:
        hf = {HF_NAMES.get(k, k): v for k, v in dataclasses.asdict(self).items()}
        hf["type_vocab_sizes"] = [int(size) for size in self.type_vocab_sizes]
        return {"architectures": ["TapasModel"], "model_type": "tapas", **hf}


def apply_overrides(config: EncoderConfig, overrides: dict[str, Any]) -> EncoderConfig:
    """``config`` with ``model.<field>=value`` overrides; unknown fields raise `MateError`."""
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise MateError(f"unknown model option(s) {unknown}; valid ones are {sorted(names)}")
    if "type_vocab_sizes" in overrides:
        overrides = {**overrides, "type_vocab_sizes": [int(s) for s in overrides["type_vocab_sizes"]]}
    return dataclasses.replace(config, **overrides)
