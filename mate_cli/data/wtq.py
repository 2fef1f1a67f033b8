"""Reading WikiTableQuestions (Pasupat & Liang 2015) into :mod:`mate_cli.data.schema` records.

Owns: ``WTQReader`` (questions and tables of one dataset root) and ``read_table_file``
(one table, as ``mate predict`` reads it).

Expected layout under ``root`` (the upstream repository)::

    data/{training,random-split-1-train,random-split-1-dev,pristine-unseen-tables}.tsv
        columns id, utterance, context (the table's csv path), targetValue
    csv/<20x>-csv/<n>.tsv   the table, tab-separated, first line = header (read)
    csv/<20x>-csv/<n>.csv   the same table as CSV (read only when the .tsv is missing)

Both kinds of TSV are read without quote handling (a ``"`` is text); their fields escape
``\\n`` (newline), ``\\p`` (``|``) and ``\\\\`` (backslash), undone here. ``targetValue``
joins several answers with ``|`` (a literal pipe inside an answer is ``\\p``). The ``.tsv``
tables keep the non-breaking spaces (U+00A0) that the ``.csv`` twins turn into spaces.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Iterator

from mate_cli.data.readers import Record, TableQAReader, columns, fields, given_file, read_text, rows_to_table, split_lines
from mate_cli.data.schema import Question, Table

_ESCAPES = {"n": "\n", "p": "|", "\\": "\\"}
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def unescape(text: str) -> str:
    """Undo the WikiTableQuestions TSV escapes: ``\\n`` newline, ``\\p`` pipe, ``\\\\`` backslash."""
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def split_answers(target_value: str) -> list[str]:
    """A raw ``targetValue`` -> its answers (split on ``|``, then unescaped); ``[]`` when empty."""
    return [unescape(part) for part in target_value.split("|")] if target_value else []


class WTQReader(TableQAReader):
    """Questions and tables of one WikiTableQuestions root (module docstring)."""

    FILES = {"train": "random-split-1-train.tsv", "dev": "random-split-1-dev.tsv", "test": "pristine-unseen-tables.tsv"}
    QUESTIONS_DIR = "data"
    QUESTION_GLOB = "*.tsv"
    REQUIRED_DIRS = ("data", "csv")
    TABLE_GLOBS = ("csv/*/*.tsv", "csv/*/*.csv")
    TABLES_DIR = "csv"
    LAYOUT = "data/*.tsv and csv/<20x>-csv/<n>.tsv (WikiTableQuestions layout)"

    def _read_questions(self, path: Path) -> Iterator[Record]:
        lines = split_lines(read_text(path, "question file"))
        header = lines[0].split("\t") if lines else []
        col = columns(header, path, ("id", "utterance", "context"), ("targetValue",))
        for number, line in enumerate(lines[1:], start=2):
            where = f"line {number}"
            values = fields(line.split("\t"), len(header), path, where)
            question = Question(
                question_id=values[col["id"]],
                question=unescape(values[col["utterance"]]),
                table_id=values[col["context"]],
                answers=split_answers(values[col["targetValue"]]) if "targetValue" in col else [],
            )
            yield where, line, question

    def table_file(self, table_id: str) -> Path:
        """The ``.tsv`` twin of a ``csv/<20x>-csv/<n>.csv`` context, else the context itself."""
        path = self.root / table_id
        twin = path.with_suffix(".tsv")
        return twin if twin.is_file() else path

    def _parse_table(self, path: Path, table_id: str) -> Table:
        return parse_table_file(path, table_id)


def parse_table_file(path: Path, table_id: str) -> Table:
    """A WikiTableQuestions ``.tsv`` table (escapes undone), or a ``.csv`` one (``\\``-escaped CSV)."""
    text = read_text(path, "table file")
    if path.suffix == ".csv":
        cells = list(csv.reader(io.StringIO(text), escapechar="\\", doublequote=False))
    else:
        cells = [[unescape(field) for field in line.split("\t")] for line in split_lines(text)]
    return rows_to_table(cells, table_id, path)


def read_table_file(path: str | Path) -> Table:
    """A WikiTableQuestions table file (``.tsv``, or ``.csv``) -> :class:`Table` (table id = file name)."""
    path = given_file(path, "a WikiTableQuestions csv/<20x>-csv/<n>.tsv (or .csv) table file")
    return parse_table_file(path, path.name)
