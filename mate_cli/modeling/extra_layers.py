"""Transformer layers trained from scratch on a pre-trained encoder (``model.extra_layers=N``), and DT-Fixup (Xu et al.
2021, "Optimizing Deeper Transformers on Small Datasets", §3.3). The layers are dense and belong to the task model (an
exported encoder leaves them out). ``relative=True`` makes them relation-aware (Shaw et al. 2018, the paper's eq. 5-6:
learned ``r^K_ij``, ``r^V_ij`` per head dimension, indexed by the clipped distance ``j - i``).

``init`` (biases always zero): ``default`` is BERT's normal and ``xavier`` Xavier-uniform, both post-LN; ``dt_fixup`` is
§3.3 exactly: Xavier, **no LayerNorm** and no learning-rate warm-up (the task module refuses one); once
``mu = max_j ||x_j||`` over the encoder's outputs on the whole training set is known (before the first step), ``v``,
``w`` and both MLP weight matrices of every layer are scaled by ``N^-1/2 / (2 mu)`` (vanilla) or
``(N (4 mu^2 + 2 mu + 2))^-1/2`` (relation-aware, ``r^V`` too). ``mu`` is a buffer: a resumed run does not scale twice.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import ACTIVATIONS

INITS = ("default", "xavier", "dt_fixup")


def dt_fixup_scale(mu: float, num_layers: int, relative: bool) -> float:
    """The factor of Theorem 3.1, as §3.3 applies it (module docstring)."""
    if relative:
        return (num_layers * (4 * mu**2 + 2 * mu + 2)) ** -0.5
    return num_layers**-0.5 / (2 * mu)


class ExtraLayer(nn.Module):
    """One new layer: ``y~ = LN(x + W z)``, ``y = LN(y~ + MLP(y~))`` (LN = identity without LayerNorm)."""

    def __init__(self, config: EncoderConfig, layer_norm: bool, max_distance: int | None) -> None:
        super().__init__()
        size, self.heads = config.hidden_size, config.num_heads
        self.head_dim = size // config.num_heads
        self.query, self.key, self.value, self.output = (nn.Linear(size, size) for _ in range(4))
        self.fc1 = nn.Linear(size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, size)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.norm1 = nn.LayerNorm(size, eps=config.layer_norm_eps) if layer_norm else nn.Identity()
        self.norm2 = nn.LayerNorm(size, eps=config.layer_norm_eps) if layer_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.attention_dropout = nn.Dropout(config.attention_dropout)
        self.max_distance = max_distance
        if max_distance is not None:
            self.relative_key = nn.Embedding(2 * max_distance + 1, self.head_dim)
            self.relative_value = nn.Embedding(2 * max_distance + 1, self.head_dim)

    def scaled_weights(self) -> list[torch.Tensor]:
        """The weights DT-Fixup scales (module docstring)."""
        weights = [self.value.weight, self.output.weight, self.fc1.weight, self.fc2.weight]
        return weights + ([self.relative_value.weight] if self.max_distance is not None else [])

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``x`` ``[batch, seq, hidden]``; ``attention_mask`` ``[batch, seq]`` True for real tokens."""
        split = lambda t: t.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2)
        if self.max_distance is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            distance = (positions[None, :] - positions[:, None]).clamp(-self.max_distance, self.max_distance)
            relative_k = self.relative_key(distance + self.max_distance)  # [seq, seq, head_dim]
            scores = scores + torch.einsum("bhid,ijd->bhij", q, relative_k)
        scores = scores / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~attention_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        probs = self.attention_dropout(scores.softmax(-1))
        z = probs @ v
        if self.max_distance is not None:
            z = z + torch.einsum("bhij,ijd->bhid", probs, self.relative_value(distance + self.max_distance))
        hidden = self.norm1(x + self.dropout(self.output(z.transpose(1, 2).flatten(2))))
        return self.norm2(hidden + self.dropout(self.fc2(self.act(self.fc1(hidden)))))


class ExtraLayers(nn.Module):
    """``num_layers`` new layers (module docstring); relative distances clipped to ``[-max_distance, max_distance]``."""

    def __init__(
        self,
        config: EncoderConfig,
        num_layers: int,
        init: str = "default",
        relative: bool = False,
        max_distance: int = 16,
    ) -> None:
        super().__init__()
        if init not in INITS:
            raise MateError(f"model.extra_init={init!r} is not one of {', '.join(INITS)}")
        if num_layers < 1 or (relative and max_distance < 1):
            raise MateError(
                f"model.extra_layers={num_layers}, model.extra_max_distance={max_distance}: "
                "need at least one layer and a distance of at least 1"
            )
        self.init, self.relative = init, bool(relative)
        self.layers = nn.ModuleList(
            ExtraLayer(config, layer_norm=init != "dt_fixup", max_distance=max_distance if relative else None)
            for _ in range(num_layers)
        )
        self.register_buffer("mu", torch.zeros(()))  # DT-Fixup's mu once measured (0: not yet)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif "norm" in name:
                nn.init.ones_(parameter)
            elif init == "default":
                nn.init.normal_(parameter, std=config.initializer_range)
            else:
                nn.init.xavier_uniform_(parameter)

    @property
    def needs_mu(self) -> bool:
        """DT-Fixup still waits for ``mu`` (a fresh run before its first step)."""
        return self.init == "dt_fixup" and float(self.mu) == 0.0

    @torch.no_grad()
    def apply_dt_fixup(self, mu: float) -> float:
        """Scale the new layers for the measured ``mu``; returns the factor."""
        if not mu > 0 or not math.isfinite(mu):
            raise MateError(f"DT-Fixup measured mu={mu} over the training set; it needs a positive finite norm")
        scale = dt_fixup_scale(mu, len(self.layers), self.relative)
        for layer in self.layers:
            for weight in layer.scaled_weights():
                weight.mul_(scale)
        self.mu.fill_(mu)
        return scale

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden, attention_mask)
        return hidden
