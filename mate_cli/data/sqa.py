"""Reading SQA (Iyyer et al. 2017, Microsoft's release 1.0). Under ``root``, the release folder::

    {train,test,random-split-<k>-{train,dev}}.tsv
        columns id, annotator, position, question, table_file, answer_coordinates, answer_text
    table_csv/<20x>_<n>.csv   the table, ordinary CSV (double-quote quoting), header first

The question files are tab-separated *with* CSV quoting (a quoted field may hold tabs or newlines).
``answer_coordinates`` and ``answer_text`` are Python literals: a list of ``'(row, column)'`` strings (0-based, row 0 =
the first row after the header) and a list of cell texts.
"""

from __future__ import annotations

import ast
import csv
import io
from pathlib import Path
from typing import Any, Iterator

from mate_cli.data.readers import Record, TableQAReader, columns, fields, given_file, read_text, rows_to_table
from mate_cli.data.records import Question, Table
from mate_cli.errors import MateError

_REQUIRED = ("id", "annotator", "position", "question", "table_file")
_ANSWERS = ("answer_coordinates", "answer_text")


def parse_table_file(path: Path, table_id: str) -> Table:
    try:
        cells = list(csv.reader(io.StringIO(read_text(path, "table file"), newline="")))
    except csv.Error as err:
        raise MateError(f"{path}: not a readable CSV table ({err}); re-download or repair the file") from None
    return rows_to_table(cells, table_id, path)


class SQAReader(TableQAReader):
    # random-split-1-{train,dev} partition train.tsv, so validation never sees a trained question
    FILES = {"train": "random-split-1-train.tsv", "dev": "random-split-1-dev.tsv", "test": "test.tsv"}
    QUESTION_GLOB = "*.tsv"
    REQUIRED_DIRS = ("table_csv",)
    TABLE_GLOBS = ("table_csv/*.csv",)
    TABLES_DIR = "table_csv"
    LAYOUT = "train.tsv, test.tsv and table_csv/ (SQA release layout)"
    _parse_table = staticmethod(parse_table_file)

    def _read_questions(self, path: Path) -> Iterator[Record]:
        reader = csv.reader(io.StringIO(read_text(path, "question file"), newline=""), delimiter="\t")
        try:
            header = next(reader, [])
            col = columns(header, path, _REQUIRED, _ANSWERS)
            start = reader.line_num + 1
            for row in reader:
                where = f"line {start}"
                start = reader.line_num + 1
                values = fields(row, len(header), path, where)
                question = _question(values, col, path, where)
                self._check_coordinates(question, path, where)
                yield where, row, question
        except csv.Error as err:
            raise MateError(
                f"{path}: line {reader.line_num + 1}: not readable as tab-separated CSV ({err}); "
                "fix or remove that line"
            ) from None

    def _check_coordinates(self, question: Question, path: Path, where: str) -> None:
        """An answer cell outside its table is an error (it would otherwise supervise nothing, silently)."""
        if not question.answer_coordinates:
            return
        table = self.table(question.table_id)
        for row, column in question.answer_coordinates:
            if row >= table.num_rows or column >= table.num_columns:
                raise MateError(
                    f"{path}: {where} (id {question.sequence_id}): answer coordinate ({row}, {column}) is "
                    f"outside table {question.table_id} ({table.num_rows} rows x {table.num_columns} "
                    "columns, counted from 0); fix the coordinate or remove that line"
                )


def _question(values, col: dict[str, int], path: Path, where: str) -> Question:
    sqa_id, annotator = values[col["id"]], values[col["annotator"]]
    where = f"{where} (id {sqa_id!r}, annotator {annotator!r})"
    position = values[col["position"]].strip()
    if not (position.isascii() and position.isdigit()):
        raise MateError(
            f"{path}: {where}: position {position!r} is not a non-negative integer; fix or remove that line"
        )
    coords = _literal_list(values[col["answer_coordinates"]], path, where) if "answer_coordinates" in col else []
    texts = _literal_list(values[col["answer_text"]], path, where) if "answer_text" in col else []
    if not all(isinstance(text, str) for text in texts):
        raise MateError(
            f"{path}: {where}: answer_text {values[col['answer_text']][:60]!r} is not a list of strings; "
            "fix or remove that line"
        )
    return Question(
        question_id=f"{sqa_id}/{annotator}/{int(position)}",
        question=values[col["question"]],
        table_id=values[col["table_file"]],
        answers=texts,
        answer_coordinates=[_coordinate(c, path, where) for c in coords],
        sequence_id=f"{sqa_id}/{annotator}",
        position=int(position),
    )


def _literal(text: str) -> Any:
    """A Python literal, else None."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _literal_list(text: str, path: Path, where: str) -> list:
    if not text.strip():
        return []
    value = _literal(text)
    if not isinstance(value, (list, tuple)):
        raise MateError(f"{path}: {where}: {text[:60]!r} is not a Python-literal list; fix or remove that line")
    return list(value)


def _coordinate(raw: Any, path: Path, where: str) -> list[int]:
    value = _literal(raw) if isinstance(raw, str) else raw
    ok = isinstance(value, (list, tuple)) and len(value) == 2
    ok = ok and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    if not ok:
        raise MateError(
            f"{path}: {where}: answer coordinate {raw!r} is not '(row, column)' with two "
            "non-negative integers; fix or remove that line"
        )
    return [value[0], value[1]]


def read_table_file(path: str | Path) -> Table:
    """A table file given on the command line; table id = file name."""
    path = given_file(path, "an SQA table_csv/<20x>_<n>.csv (comma-separated) file")
    return parse_table_file(path, path.name)
