"""Reading WikiTableQuestions (Pasupat & Liang 2015). Under ``root``, the upstream repository::

    data/{training,random-split-1-train,random-split-1-dev,pristine-unseen-tables}.tsv
        columns id, utterance, context (the table's csv path), targetValue (answers joined by ``|``)
    csv/<20x>-csv/<n>.tsv       the table, tab-separated, header first
    csv/<20x>-csv/<n>.csv       the same table as CSV (read only when the .tsv is missing)
    tagged/data/*.tagged        optional: CoreNLP-tagged questions (id, targetValue, targetCanon, ...); the random
                                splits' are in training.tagged

A question's :attr:`Question.canonical_answers` are its tagged ``targetCanon``, matched by id over every tagged file
as the official ``evaluator.py`` does. A tagged row whose ``targetValue`` differs from the question file's, whose
``targetCanon`` has another number of answers, or whose id another tagged file answers otherwise, is an error: the
files come from different releases.

Both kinds of TSV are read without quote handling (a ``"`` is text), their fields unescaped; the ``.tsv`` tables keep
the non-breaking spaces (U+00A0) that the ``.csv`` twins turn into spaces.
"""

from __future__ import annotations

import csv
import functools
import io
import logging
import re
from pathlib import Path
from typing import Iterator

from mate_cli.data.numbers import outside_float32
from mate_cli.data.readers import (
    Record,
    TableQAReader,
    columns,
    fields,
    given_file,
    read_text,
    rows_to_table,
    split_lines,
)
from mate_cli.data.records import Question, Table
from mate_cli.errors import MateError

log = logging.getLogger(__name__)
#: the files whose questions without canonical answers were counted in the log (one file can give two splits)
_COUNTED: set[Path] = set()

_ESCAPES = {"n": "\n", "p": "|", "\\": "\\"}
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def unescape(text: str) -> str:
    """Undo the WikiTableQuestions TSV escapes: ``\\n`` newline, ``\\p`` pipe, ``\\\\`` backslash."""
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def split_answers(target_value: str) -> list[str]:
    """A raw ``targetValue`` -> its answers (split on ``|``, then unescaped)."""
    return [unescape(part) for part in target_value.split("|")] if target_value else []


def parse_table_file(path: Path, table_id: str) -> Table:
    """A WikiTableQuestions ``.tsv`` table (escapes undone), or a ``.csv`` one (``\\``-escaped CSV)."""
    text = read_text(path, "table file")
    if path.suffix == ".csv":
        cells = list(csv.reader(io.StringIO(text), escapechar="\\", doublequote=False))
    else:
        cells = [[unescape(field) for field in line.split("\t")] for line in split_lines(text)]
    return rows_to_table(cells, table_id, path)


class WTQReader(TableQAReader):
    FILES = {"train": "random-split-1-train.tsv", "dev": "random-split-1-dev.tsv", "test": "pristine-unseen-tables.tsv"}
    QUESTIONS_DIR = "data"
    QUESTION_GLOB = "*.tsv"
    REQUIRED_DIRS = ("data", "csv")
    TABLE_GLOBS = ("csv/*/*.tsv", "csv/*/*.csv")
    TABLES_DIR = "csv"
    TAGGED_DIR = "tagged/data"
    LAYOUT = "data/*.tsv and csv/<20x>-csv/<n>.tsv (WikiTableQuestions layout)"
    _parse_table = staticmethod(parse_table_file)

    def tagged_files(self) -> list[Path]:
        return sorted(p for p in (self.root / self.TAGGED_DIR).glob("*.tagged") if p.is_file())

    def input_files(self) -> list[Path]:
        """Tagged files too: their canonical answers are encoded."""
        return sorted({*super().input_files(), *self.tagged_files()})

    @functools.cached_property
    def canonical_targets(self) -> dict[str, tuple[str, list[str], Path]]:
        """Question id -> (raw ``targetValue``, ``targetCanon`` answers, file) over every ``tagged/data/*.tagged``, by
        id as the official ``evaluator.py -t tagged/data`` reads them (the random splits' questions are in
        ``training.tagged``, not in a twin of their own file)."""
        out: dict[str, tuple[str, list[str], Path]] = {}
        for tagged in self.tagged_files():
            lines = split_lines(read_text(tagged, "tagged question file"))
            header = lines[0].split("\t") if lines else []
            col = columns(header, tagged, ("id", "targetValue", "targetCanon"))
            for number, line in enumerate(lines[1:], start=2):
                values = fields(line.split("\t"), len(header), tagged, f"line {number}")
                qid, target = values[col["id"]], values[col["targetValue"]]
                canon = split_answers(values[col["targetCanon"]])
                if len(canon) != len(split_answers(target)):
                    raise MateError(
                        f"{tagged}: line {number} has {len(split_answers(target))} answers in targetValue "
                        f"but {len(canon)} in targetCanon; re-download the tagged file"
                    )
                if qid in out and out[qid][:2] != (target, canon):
                    raise MateError(
                        f"{tagged}: line {number}: question {qid!r} is also in {out[qid][2]} with other answers; "
                        "keep one release's tagged files in tagged/data"
                    )
                out[qid] = (target, canon, tagged)
        return out

    def _read_questions(self, path: Path) -> Iterator[Record]:
        lines = split_lines(read_text(path, "question file"))
        header = lines[0].split("\t") if lines else []
        col = columns(header, path, ("id", "utterance", "context"), ("targetValue",))
        canon = self.canonical_targets if "targetValue" in col else {}
        missing = 0
        for number, line in enumerate(lines[1:], start=2):
            where = f"line {number}"
            values = fields(line.split("\t"), len(header), path, where)
            qid, target = values[col["id"]], values[col["targetValue"]] if "targetValue" in col else ""
            tagged_target, canonical, tagged = canon.get(qid, (target, [], None))
            if tagged_target != target:
                raise MateError(
                    f"{tagged}: question {qid!r} has targetValue {tagged_target!r}, "
                    f"{path} {target!r}; use the tagged file of the same release"
                )
            missing += "targetValue" in col and not canonical
            answers = split_answers(target)
            too_large = [answer for answer in answers if outside_float32(answer)]
            if too_large:
                raise MateError(
                    f"{path}: {where}: question {qid!r} has the answer {too_large[0]}, a number beyond "
                    "float32's range (3.4e38) that training cannot compute with; correct it or remove "
                    "that line"
                )
            text, table_id = unescape(values[col["utterance"]]), values[col["context"]]
            yield where, line, Question(qid, text, table_id, answers=answers, canonical_answers=canonical)
        if missing and path.resolve() not in _COUNTED:
            _COUNTED.add(path.resolve())
            log.info(
                "%s: %d question(s) without canonical answers in %s/*.tagged; the metric emulates them "
                "(mate_cli.metrics.wtq)",
                path.name,
                missing,
                self.TAGGED_DIR,
            )

    def table_file(self, table_id: str) -> Path:
        """The ``.tsv`` twin of a ``csv/<20x>-csv/<n>.csv`` context, else the context itself."""
        path = self.root / table_id
        twin = path.with_suffix(".tsv")
        return twin if twin.is_file() else path


def read_table_file(path: str | Path) -> Table:
    """A table file given on the command line; table id = file name."""
    path = given_file(path, "a WikiTableQuestions csv/<20x>-csv/<n>.tsv (or .csv) table file")
    return parse_table_file(path, path.name)
