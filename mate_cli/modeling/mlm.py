"""BERT's masked-LM head, for TAPAS-style pre-training (MATE §3.2, App. A.1; the masking: :mod:`mate_cli.data.masking`).

BERT and TAPAS save it as ``cls.predictions.{transform.dense, transform.LayerNorm, bias}`` (``decoder.weight`` is the
tied word-embedding table, ``decoder.bias`` the bias). A checkpoint without those tensors (the bundled MiniLM,
sentence-transformers/all-MiniLM-L6-v2, a sentence encoder) leaves the head at BERT's initialisation, its decoder tied
to the encoder's word embeddings. A directory saved with :func:`mlm_state_dict`
(``TableEncoder.save_pretrained(..., extra_state=mlm_state_dict(head), prefix="tapas.")``) loads in
``transformers.TapasForMaskedLM``.
"""

from __future__ import annotations

import logging
import re

import torch
from torch import nn

from mate_cli.modeling.config import EncoderConfig
from mate_cli.modeling.encoder import ACTIVATIONS

log = logging.getLogger(__name__)

#: the checkpoint prefix of the head's tensors (BertForPreTraining / BertForMaskedLM / TapasForMaskedLM)
PREFIX = "cls.predictions."


class Transform(nn.Module):
    """``LayerNorm(act(dense(h)))``: BERT's ``cls.predictions.transform``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden)))


class MaskedLMHead(nn.Module):
    """Token logits over the vocabulary: ``transform(h) @ E^T + b``, with ``E`` the encoder's ``word_embeddings`` table,
    shared, not copied (the decoder is tied to it, as in BERT)."""

    def __init__(self, config: EncoderConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = Transform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self._tied = (word_embeddings,)  # a tuple: not registered twice in the state dict
        nn.init.normal_(self.transform.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.dense.bias)

    @property
    def decoder_weight(self) -> torch.Tensor:
        return self._tied[0].weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., hidden]`` -> ``[..., vocab]`` logits."""
        return self.transform(hidden) @ self.decoder_weight.T + self.bias


def mlm_state_dict(head: MaskedLMHead) -> dict[str, torch.Tensor]:
    """The head's own tensors under BERT/TAPAS names, without the tied decoder, as transformers saves it (loading ties
    ``decoder.weight`` to the word embeddings and ``decoder.bias`` to ``bias``)."""
    return {PREFIX + k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}


def load_mlm_head(head: MaskedLMHead, pretrained: str) -> list[str]:
    """Copy a checkpoint's ``cls.predictions.*`` tensors into ``head``; returns the names loaded
    (``[]``: the checkpoint has no MLM head, the head keeps its initialisation)."""
    from mate_cli.modeling import checkpoints

    resolved = checkpoints.resolve_pretrained(pretrained)
    state = checkpoints.read_state_dict(checkpoints.weight_files(resolved))
    own = head.state_dict()
    found = {}
    for key, value in state.items():
        if key.startswith(PREFIX):
            name = key[len(PREFIX) :]
            for pattern, replacement in checkpoints.RENAMES:  # LayerNorm.gamma/beta of TF ports
                name = re.sub(pattern, replacement, name)
            if name in own:
                found[name] = value
    if found and len(found) < len(own):
        log.warning(
            "%s: the masked-LM head loads only %s; the rest keeps its initialisation", pretrained, sorted(found)
        )
    if found:
        checkpoints.load_state_dict(head, found, source=f"{pretrained} (masked-LM head)")
    return sorted(found)
