"""SQA's question accuracy (ALL), sequence accuracy (SEQ, every question of a sequence right) and the accuracy at the
first, second and third question of a sequence (Q1-Q3), as fractions in [0, 1] (0.0 when there is nothing to score);
the answer sizes a model's accuracy is split by (:data:`ANSWER_SIZES`).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Hashable, Iterable, Sequence

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

Coordinate = Sequence[int]
#: SQA's Q1-Q3: question ``n`` of a sequence is the one at position ``n - 1``
QUESTION_NUMBERS = (1, 2, 3)
#: the gold answers' sizes scored apart (``<stage>/accuracy_<size>_cell_answers``), each by its test of the number of
#: distinct answer cells; a question without an answer cell is in neither
ANSWER_SIZES: dict[str, Callable[[int], bool]] = {"single": lambda n: n == 1, "multi": lambda n: n > 1}


def answer_cells(coords: Iterable[Coordinate]) -> set[tuple[int, int]]:
    """An answer's distinct cells as ``(row, column)`` ints."""
    return {(int(row), int(column)) for row, column in coords}


def question_correct(predicted_coords: Iterable[Coordinate], gold_coords: Iterable[Coordinate]) -> bool:
    """Whether the predicted answer cells equal the gold ones as sets of (row, column)."""
    return answer_cells(predicted_coords) == answer_cells(gold_coords)


def sqa_scores(records: Iterable[tuple[Hashable, int, bool]]) -> dict[str, float | int]:
    """``{"all", "seq", "q1", "q2", "q3", "questions", "sequences"}`` of ``(sequence_id, position, correct)`` records
    (``q<n>``: the questions at position ``n - 1``); a repeated record counts once, two verdicts for one
    ``(sequence_id, position)`` raise ``ValueError``."""
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
    by_position = {
        f"q{k}": _share([correct for (_, position), correct in verdicts.items() if position == k - 1])
        for k in QUESTION_NUMBERS
    }
    return {
        "all": _share(list(verdicts.values())),
        "seq": _share(list(sequences.values())),
        **by_position,
        "questions": n,
        "sequences": m,
    }


def _share(verdicts: list[bool]) -> float:
    return sum(verdicts) / len(verdicts) if verdicts else 0.0


def sequence_key(sequence_id: str) -> int:
    """A non-negative int63 key, the same on every process and run (unlike Python's salted ``hash``)."""
    digest = hashlib.sha256(sequence_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


class SequenceAccuracy(Metric):
    """SEQ over per-question verdicts, exact under DDP: states are gathered by concatenation, not averaged per process,
    and a question seen twice (a sampler's padding) cannot change its sequence's verdict."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("sequence_keys", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, sequence_keys: torch.Tensor, correct: torch.Tensor) -> None:
        """``sequence_keys`` (:func:`sequence_key`) and ``correct``: one entry per question, same shape."""
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
