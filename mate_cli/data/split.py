"""Train, validation and test questions (``dataset.split``). ``by_table`` (the bundled samples, one released file) cuts
the ``source`` file's questions into train and validation by table, and ``test`` reads the test file; ``files`` (a full
download) reads each split's own released file.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

from mate_cli.data.records import Question
from mate_cli.errors import MateError, check_choice

log = logging.getLogger(__name__)

MODES = ("by_table", "files")
#: split name -> released file name, in ``files`` mode (and for ``test``)
FILE_OF_SPLIT = {"train": "train", "validation": "dev", "test": "test"}


@dataclass(frozen=True)
class SplitSettings:
    """``dataset.split``; ``source``, ``val_fraction`` and ``seed`` apply to ``by_table`` (:func:`split_by_table`)."""

    mode: str = "by_table"
    source: str = "dev"
    val_fraction: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("dataset.split.mode", self.mode, MODES)

    def questions(self, split: str, read: Callable[[str], Iterable[Question]]) -> list[Question]:
        """``read(file_name)`` yields a released file's questions."""
        if self.mode == "by_table" and split in ("train", "validation"):
            train, val = split_by_table(read(self.source), self.val_fraction, self.seed)
            return train if split == "train" else val
        return list(read(FILE_OF_SPLIT.get(split, split)))

    def reference_file(self) -> str:
        return self.source if self.mode == "by_table" else FILE_OF_SPLIT["validation"]


def _table_hash(table_id: str, seed: int) -> float:
    """A stable number in [0, 1) (sha256, not Python's salted hash())."""
    digest = hashlib.sha256(f"{seed}\x00{table_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


Item = TypeVar("Item")


def split_by_table(
    questions: Iterable[Item],
    val_fraction: float,
    seed: int = 0,
    key: Callable[[Item], str] | None = None,
    setting: str = "dataset.split.val_fraction",
) -> tuple[list[Item], list[Item]]:
    """``(train, val)`` by table, question order kept. A table's side depends only on its key and the seed, so it is
    stable as the dataset grows. With two tables or more an empty side gets the table nearest the threshold; with one,
    everything goes to train. ``key`` defaults to ``item.table_id``; ``setting`` is the config key errors name."""
    if not 0.0 < float(val_fraction) < 1.0:
        raise MateError(f"val_fraction must be in (0, 1), got {val_fraction}; set e.g. {setting}=0.1")
    questions = list(questions)
    key = key or (lambda q: q.table_id)
    scores = {key(q): _table_hash(key(q), seed) for q in questions}
    val_tables = {t for t, s in scores.items() if s < val_fraction}
    if len(scores) < 2:
        log.warning("split_by_table: only %d table(s); everything goes to train", len(scores))
        val_tables = set()
    elif not val_tables:
        val_tables = {min(scores, key=lambda t: (scores[t], t))}
    elif len(val_tables) == len(scores):
        val_tables.discard(max(scores, key=lambda t: (scores[t], t)))
    return [q for q in questions if key(q) not in val_tables], [q for q in questions if key(q) in val_tables]
