"""BERT's masked-LM head, for TAPAS-style pre-training (MATE §3.2, App. A.1; the masking: :mod:`mate_cli.data.masking`).

Its checkpoint names are BERT's and TAPAS's ``cls.predictions.*``. A checkpoint without them (the bundled MiniLM, a
sentence encoder) leaves it at BERT's initialisation. ``TableEncoder.save_pretrained(..., extra_state=
mlm_state_dict(head), prefix="tapas.")`` writes a directory ``transformers.TapasForMaskedLM`` loads.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from mate_cli.modeling import checkpoints
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import ACTIVATIONS

#: the checkpoint prefix of the head's tensors (BertForPreTraining / BertForMaskedLM / TapasForMaskedLM)
PREFIX = "cls.predictions."


class MaskedLMHead(nn.Module):
    """``transform(h) @ E^T + b``, ``E`` the encoder's ``word_embeddings`` table, shared (tied, as in BERT)."""

    def __init__(self, config: EncoderConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        # LayerNorm(act(dense(h))): BERT's cls.predictions.transform
        self.transform = nn.Sequential(
            OrderedDict(
                dense=nn.Linear(config.hidden_size, config.hidden_size),
                act=ACTIVATIONS[config.hidden_act](),
                LayerNorm=nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
            )
        )
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
    """The head's tensors under BERT/TAPAS names, without the tied decoder, as transformers saves it."""
    return {PREFIX + k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}


def load_mlm_head(head: MaskedLMHead, pretrained: str) -> list[str]:
    """Copy a checkpoint's ``cls.predictions.*`` tensors into ``head``; the names loaded (``[]``: none)."""
    return checkpoints.load_head(head, pretrained, "masked-LM head", prefix=PREFIX, warn_partial=True)
