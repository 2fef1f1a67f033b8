"""SQA's metrics: question accuracy (ALL), the share of questions right by :func:`question_correct`, and sequence
accuracy (SEQ), the share of question sequences answered correctly throughout. Scores are fractions in [0, 1], 0.0 when there is
nothing to score.

:class:`SequenceAccuracy` is SEQ for training loops, exact under DDP: its states (each question's sequence key and
verdict) are gathered by concatenation, not averaged per process, and a question seen twice (a sampler's padding) cannot
change a sequence's verdict. :func:`sequence_key` is the same on every process and run, unlike Python's salted ``hash``.
"""

from __future__ import annotations

import hashlib
from typing import Hashable, Iterable, Sequence

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

Coordinate = Sequence[int]


def _coordinate_set(coords: Iterable[Coordinate]) -> set[tuple[int, int]]:
    return {(int(row), int(column)) for row, column in coords}


def question_correct(predicted_coords: Iterable[Coordinate], gold_coords: Iterable[Coordinate]) -> bool:
    """Whether the predicted answer cells equal the gold ones as sets of (row, column)."""
    return _coordinate_set(predicted_coords) == _coordinate_set(gold_coords)


def sqa_scores(records: Iterable[tuple[Hashable, int, bool]]) -> dict[str, float | int]:
    """``{"all", "seq", "questions", "sequences"}`` of ``(sequence_id, position, correct)`` records; a record repeated
    with the same verdict counts once, the same ``(sequence_id, position)`` with two verdicts raises ``ValueError``."""
    verdicts: dict[tuple[Hashable, int], bool] = {}
    for sequence_id, position, correct in records:
        key = (sequence_id, int(position))
        correct = bool(correct)
        if verdicts.setdefault(key, correct) != correct:
            raise ValueError(f"question {key} has two different verdicts")
    sequences: dict[Hashable, bool] = {}
    for (sequence_id, _), correct in verdicts.items():
        sequences[sequence_id] = sequences.get(sequence_id, True) and correct
    n, m = len(verdicts), len(sequences)
    return {
        "all": sum(verdicts.values()) / n if n else 0.0,
        "seq": sum(sequences.values()) / m if m else 0.0,
        "questions": n,
        "sequences": m,
    }


def sequence_key(sequence_id: str) -> int:
    """A stable non-negative int63 key for ``sequence_id``: the first 8 bytes of its SHA-256."""
    digest = hashlib.sha256(sequence_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


class SequenceAccuracy(Metric):
    """SEQ over a stream of per-question verdicts, by distinct sequence key (module docstring)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("sequence_keys", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, sequence_keys: torch.Tensor, correct: torch.Tensor) -> None:
        """Args: ``sequence_keys`` int64 and ``correct`` bool, one entry per question (same shape)."""
        if sequence_keys.shape != correct.shape:
            raise ValueError(f"sequence_keys {tuple(sequence_keys.shape)} and correct {tuple(correct.shape)} differ")
        self.sequence_keys.append(sequence_keys.reshape(-1).to(torch.int64))
        self.correct.append(correct.reshape(-1).to(torch.bool))

    def compute(self) -> torch.Tensor:
        if isinstance(self.sequence_keys, list) and not self.sequence_keys:
            return torch.tensor(0.0, device=self.device)
        keys = dim_zero_cat(self.sequence_keys)
        correct = dim_zero_cat(self.correct)
        if keys.numel() == 0:
            return torch.tensor(0.0, device=keys.device)
        unique, inverse = torch.unique(keys, return_inverse=True)
        wrong = torch.zeros(unique.numel(), dtype=torch.int64, device=keys.device)
        wrong.index_add_(0, inverse, (~correct).to(torch.int64))
        return (wrong == 0).float().mean()
