"""The table tasks by name (``dataset.task``, ``model.task``; docs/architecture.md, "The table tasks"). Objects are
``"module:attribute"`` strings imported on use, so reading the registry imports neither torch nor a reader."""

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
    """One table task. ``reader``: a class of ``(root)`` with ``questions(file)`` and ``table(id)``; ``table_file``:
    ``(path)``, one table file (``mate predict``); ``baselines``: ``(train, validation, reader) -> metrics``;
    ``predictions``: ``(rows, directory) -> path``, the release's answer format; each a ``"module:attribute"``.
    answer: ``cells`` (gold cell coordinates, right when the selected set equals them: SQA), ``texts`` (matched to
    cells for supervision, scored by WikiTQ's official denotation matching) or ``verdict`` (TabFact).
    aggregates: an operator (NONE, SUM, AVERAGE, COUNT) is predicted; a one-number answer supervises its result.
    sequential: questions come in sequences, each given the previous answer, evaluated in order; SEQ is scored."""

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
        return self.answer != "verdict"

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
    if (task := _TASKS.get(str(name))) is None:
        raise MateError(f"{key}={name!r} is not a table task; use one of {', '.join(names())}")
    return task


def _load(ref: str):
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _bundled(name: str, reader: str, answer: str, **flags: bool) -> TableTask:
    """A task whose reader, baselines and answer writer are named after it."""
    return register(
        TableTask(
            name,
            reader=f"mate_cli.data.{name}:{reader}",
            table_file=f"mate_cli.data.{name}:read_table_file",
            answer=answer,
            baselines=f"mate_cli.pipelines.trivial:{name}_baselines",
            predictions=f"mate_cli.data.answer_files:write_{name}",
            **flags,
        )
    )


_bundled("sqa", "SQAReader", "cells", sequential=True)
_bundled("wtq", "WTQReader", "texts", aggregates=True)
_bundled("tabfact", "TabFactReader", "verdict")
