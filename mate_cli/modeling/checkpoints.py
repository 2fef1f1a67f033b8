"""How a checkpoint's tensors are named (:data:`RENAMES`) and copied into the encoder's modules; where checkpoints come
from and how their files are read is :mod:`mate_cli.pretrained`."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.pretrained import COPY_AGAIN, load_weights_only, resolve_pretrained, weight_files

log = logging.getLogger(__name__)

#: Prefixes of task-model checkpoints (``BertForX``, ``TapasForX``) stripped before renaming.
PREFIXES = ("bert.", "tapas.")

#: (pattern, replacement) applied in order to every key after the prefix is stripped; only these names differ.
RENAMES: tuple[tuple[str, str], ...] = (
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type_embeddings_0."),  # BERT segment table
    (r"LayerNorm\.gamma$", "LayerNorm.weight"),  # pre-2019 PyTorch ports of TF checkpoints
    (r"LayerNorm\.beta$", "LayerNorm.bias"),
)

#: Keys dropped silently: buffers older transformers versions saved with the weights.
IGNORED = (r"^embeddings\.position_ids$",)


def read_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    """The tensors of ``files``; a file cut short or not a weight file at all is one `MateError` line naming it."""
    fix = "save the weights as a state_dict (or .safetensors) and point model.encoder.pretrained at them"
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                loaded = load_file(str(path), device="cpu")
            else:
                loaded = load_weights_only(path, fix)
        except (MateError, MemoryError):
            raise
        except PermissionError as error:
            raise MateError(f"cannot read {path} ({error.strerror}); make it readable") from None
        except Exception as error:  # safetensors' and torch's readers raise many kinds for a damaged file
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0][:160]
            raise MateError(
                f"{path} is not a whole weight file ({reason}): truncated, or another kind of file; {COPY_AGAIN}"
            ) from None
        if not isinstance(loaded, dict) or not all(isinstance(value, torch.Tensor) for value in loaded.values()):
            raise MateError(f"{path} holds no state_dict of tensors; {fix}")
        state.update(loaded)
    return state


def _renamed(key: str) -> str:
    for pattern, replacement in RENAMES:
        key = re.sub(pattern, replacement, key)
    return key


def rename_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BERT/TAPAS key names -> ours (strip task prefixes, apply :data:`RENAMES`, drop :data:`IGNORED`)."""
    renamed = {}
    for key, tensor in state.items():
        key = _renamed(key.removeprefix(next((p for p in PREFIXES if key.startswith(p)), "")))
        if not any(re.search(pattern, key) for pattern in IGNORED):
            renamed[key] = tensor
    return renamed


def load_state_dict(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> tuple[list[str], list[str]]:
    """Copy ``state`` into ``module`` (non-strict; a shared key's shape mismatch is a `MateError`); returns and logs
    ``(missing, unexpected)``."""
    for key, expected in module.state_dict().items():  # model order: the first mismatch is reported
        if key in state and tuple(state[key].shape) != tuple(expected.shape):
            raise MateError(
                f"checkpoint {source}: {key} has shape {tuple(state[key].shape)} but the model expects "
                f"{tuple(expected.shape)}; drop the conflicting model.* override or use a matching checkpoint"
            )
    result = module.load_state_dict(state, strict=False)
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    log.info(
        "loaded %s: %d tensors; missing (freshly initialised): %s; unexpected (ignored): %s",
        source,
        len(state) - len(unexpected),
        missing or "none",
        unexpected or "none",
    )
    return missing, unexpected


def load_head(head: nn.Module, pretrained: str, what: str, prefix: str = "", warn_partial: bool = False) -> list[str]:
    """Copy the checkpoint's tensors named ``prefix`` + one of ``head``'s keys (after :data:`RENAMES`) into ``head``;
    returns the names loaded (``[]``: none, the head keeps its initialisation)."""
    state = read_state_dict(weight_files(resolve_pretrained(pretrained)))
    own = head.state_dict()
    renamed = {_renamed(key[len(prefix) :]): value for key, value in state.items() if key.startswith(prefix)}
    found = {name: value for name, value in renamed.items() if name in own}
    if warn_partial and found and len(found) < len(own):
        log.warning("%s: the %s loads only %s; the rest keeps its initialisation", pretrained, what, sorted(found))
    if found:
        load_state_dict(head, found, source=f"{pretrained} ({what})")
    return sorted(found)
