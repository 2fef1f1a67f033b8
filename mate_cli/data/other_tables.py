"""Each evaluated statement paired with another table of its split (``mate eval tables=shuffled``): a model that reads
its table loses accuracy there, one that judges the statement alone keeps it.

The pairing is a fixed derangement of the split's tables: their ids, in order of first appearance, shuffled with a
fixed seed and each sent to the next one round the cycle, so no table keeps its own statements and every statement of
one table moves to the same other table. Statements, labels and question ids stay as they were (the predictions file
is keyed by the statement's own table); only the table read changes."""

from __future__ import annotations

import random
from dataclasses import replace

from mate_cli.data.records import Question
from mate_cli.errors import MateError

#: dataset.eval_tables / mate eval's ``tables``
EVAL_TABLES = ("own", "shuffled")
SEED = 0
#: what names this pairing in the cache key (a new pairing rule, a new name)
PAIRING = f"derangement, seed {SEED}"


def other_table_of(table_ids: list[str]) -> dict[str, str]:
    """table id -> the table its statements are paired with; none maps to itself."""
    order = list(dict.fromkeys(table_ids))
    random.Random(SEED).shuffle(order)
    return {table: order[(i + 1) % len(order)] for i, table in enumerate(order)}


def with_other_tables(questions: list[Question], where: str) -> list[Question]:
    """``questions``, each about the table :func:`other_table_of` pairs its own with."""
    tables = {q.table_id for q in questions}
    if len(tables) < 2:
        raise MateError(
            f"tables=shuffled: {where} has {len(tables)} table(s); pairing each statement with another table needs "
            "two or more (evaluate a larger split, or tables=own)"
        )
    other = other_table_of([q.table_id for q in questions])
    return [replace(q, table_id=other[q.table_id]) for q in questions]
