"""The table tasks by name (``dataset.task``, ``model.task``): one :class:`TableTask` each, asked through
:func:`get`, added by :func:`register` (docs/architecture.md, "The table tasks").

Objects are named by ``"module:attribute"`` strings, imported on use, so reading this
registry imports neither torch nor a reader.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from mate_cli.errors import MateError

#: what a gold answer is (:attr:`TableTask.answer`)
ANSWERS = ("cells", "texts", "verdict")


@dataclass(frozen=True)
class TableTask:
    """One table task.

    Attributes:
        name: the value of ``dataset.task`` and ``model.task``.
        reader: ``module:Class`` reading the release under a root: ``questions(file)``, ``table(id)``.
        table_file: ``module:function`` reading one table file of the release (``mate predict``).
        answer: ``cells``: gold cell coordinates, right when the selected set equals them (SQA);
            ``texts``: answer texts, matched to cells for supervision and scored by denotation
            with the official WikiTQ matching; ``verdict``: entailed or refuted (TabFact).
        baselines: ``module:function(train, validation, reader) -> metrics`` (``mate baseline``).
        predictions: ``module:function(rows, directory) -> path``: the release's answer format.
        aggregates: an operator (NONE, SUM, AVERAGE, COUNT) is predicted, and an answer that is
            one number supervises the aggregation's expected result (WikiTQ).
        sequential: questions come in sequences; each is given the previous question's answer,
            evaluation runs in position order, and SEQ is scored (SQA).
    """

    name: str
    reader: str
    table_file: str
    answer: str
    baselines: str
    predictions: str
    aggregates: bool = False
    sequential: bool = False

    def __post_init__(self) -> None:
        if self.answer not in ANSWERS:
            raise ValueError(f"TableTask {self.name!r}: answer={self.answer!r}; use one of {', '.join(ANSWERS)}")

    @property
    def selects_cells(self) -> bool:
        """Whether the model answers by selecting cells (else it gives a verdict)."""
        return self.answer != "verdict"

    @property
    def noun(self) -> str:
        """What one input is called on the screen."""
        return "question" if self.selects_cells else "statement"

    def make_reader(self, root: str | Path):
        return _load(self.reader)(root)

    def read_table_file(self, path: str | Path):
        return _load(self.table_file)(path)

    def trivial_baselines(self, train: Sequence, validation: Sequence, reader) -> dict:
        return _load(self.baselines)(train, validation, reader)

    def write_predictions(self, rows: list[dict], directory: Path) -> Path:
        return _load(self.predictions)(rows, directory)


_TASKS: dict[str, TableTask] = {}


def register(task: TableTask) -> TableTask:
    """Make ``task`` known by its name (a second task of the same name replaces the first)."""
    _TASKS[task.name] = task
    return task


def names() -> tuple[str, ...]:
    return tuple(sorted(_TASKS))


def get(name: Any, key: str = "dataset.task") -> TableTask:
    """The task called ``name``; an unknown one is a one-line error naming ``key`` and the known tasks."""
    task = _TASKS.get(str(name))
    if task is None:
        raise MateError(f"{key}={name!r} is not a table task; use one of {', '.join(names())}")
    return task


def _load(ref: str):
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _bundled(name: str, reader: str, answer: str, **flags: bool) -> TableTask:
    """A task whose reader is ``mate_cli.data.<name>``'s and whose baselines and answer
    writer are named after it."""
    return register(
        TableTask(
            name,
            reader=f"mate_cli.data.{name}:{reader}",
            table_file=f"mate_cli.data.{name}:read_table_file",
            answer=answer,
            baselines=f"mate_cli.metrics.trivial:{name}_baselines",
            predictions=f"mate_cli.data.answer_files:write_{name}",
            **flags,
        )
    )


_bundled("sqa", "SQAReader", "cells", sequential=True)
_bundled("wtq", "WTQReader", "texts", aggregates=True)
_bundled("tabfact", "TabFactReader", "verdict")
