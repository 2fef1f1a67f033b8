"""The data layer's results as the tests read them, each in one call."""

from __future__ import annotations

from typing import Mapping, Sequence

from mate_cli.data.corpus import Corpus, TableText
from mate_cli.data.numbers import TableNumbers
from mate_cli.data.records import Question, Table
from mate_cli.data.table_tasks import Coord, answer_matches
from mate_cli.tasks import TableTask


def column_ranks(rows: Sequence[Sequence[str]]) -> tuple[list[list[int]], list[list[int]]]:
    """``(ranks, inverse ranks)``, each ``[num_rows][num_columns]``, 0 = unranked."""
    numbers = TableNumbers.of(rows)
    ranks = [[0] * len(row) for row in rows]
    inverse = [[0] * len(row) for row in rows]
    for c, column in enumerate(numbers.ranks):
        for r, (rank, inv) in column.items():
            ranks[r][c], inverse[r][c] = rank, inv
    return ranks, inverse


def read_corpus(
    sources: Mapping[str, object],
    hybridqa_passages: int = 1,
    tables: str = "all",
    splits: Mapping[str, Mapping] | None = None,
) -> list[TableText]:
    return list(Corpus(sources, hybridqa_passages, tables, splits).examples())


def answer_cells(task: TableTask, question: Question, table: Table) -> list[Coord]:
    return sorted({cell for hits in answer_matches(task, question, table) for cell in hits})
