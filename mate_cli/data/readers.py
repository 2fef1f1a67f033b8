"""What the table-task readers (WikiTQ, TabFact, SQA) share: :class:`TableQAReader` and the parsing helpers."""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Sequence

from mate_cli.data.records import Cell, Question, Table
from mate_cli.errors import MateError

log = logging.getLogger(__name__)

# csv refuses a field over 128 kB, and a cell may hold a whole article; 256 MB still stops one unterminated quote.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 28))

#: ``(where, raw record, question)`` from ``_read_questions``: ``where`` names the record in messages (``line 12``);
#: the raw record tells an identical copy of a repeated id (skipped) from a conflict (error)
Record = tuple[str, Any, Question]


def read_text(path: Path, what: str) -> str:
    """The file's UTF-8 text, line ends untouched; a leading byte-order mark (spreadsheets write one) is dropped."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            return handle.read()
    except UnicodeDecodeError:
        raise MateError(f"{path}: {what} is not UTF-8 text; re-download or repair the file") from None


def split_lines(text: str) -> list[str]:
    """Lines split on ``\\n`` only (``str.splitlines`` also splits on form feeds and U+2028 inside cell texts)."""
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def load_json(path: Path, what: str, object_pairs_hook=None) -> Any:
    """The parsed file; TabFact's ``object_pairs_hook`` sees a repeated table id, which :func:`json.load` merges."""
    text = read_text(path, what)
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as err:
        problem = f"line {err.lineno}, column {err.colno}: {err.msg}"
    raise MateError(f"{path}: {what} is not valid JSON ({problem}); re-download or repair the file")


def given_file(path: str | Path, what: str, key: str = "table") -> Path:
    """A file passed on the command line as ``key=`` (``mate predict table=...``)."""
    path = Path(str(path)).expanduser()
    if path.is_dir():
        raise MateError(f"{key}={path} is a folder, not a file; pass {what}")
    if not path.is_file():
        raise MateError(f"{key}={path} not found; pass {what}")
    return path


def no_questions(path: Path, skipped: Counter) -> str:
    """The error line for a question file that gives no question."""
    why = (
        f"every record was skipped ({', '.join(f'{k}: {v}' for k, v in skipped.items())})" if skipped else "it is empty"
    )
    return f"{path} holds no questions: {why}; restore it from the release, or choose another split"


def columns(header: Sequence[str], path: Path, required: Sequence[str], optional: Sequence[str] = ()) -> dict[str, int]:
    index = {name: i for i, name in enumerate(header)}
    for name in required:
        if name not in index:
            raise MateError(
                f"{path}: the header line has no {name!r} column (found {list(header)}); "
                "use the upstream file or add the column"
            )
    return {name: index[name] for name in (*required, *optional) if name in index}


def fields(values: Sequence[str], width: int, path: Path, where: str) -> Sequence[str]:
    if len(values) != width:
        raise MateError(
            f"{path}: {where} has {len(values)} tab-separated fields, the header has {width}; fix or remove that line"
        )
    return values


def rows_to_table(cells: list[list[str]], table_id: str, path: Path | str) -> Table:
    """First row = header; ragged rows are padded with empty cells (or cut) with a warning."""
    if not cells or not cells[0]:
        raise MateError(f"{path}: table {table_id!r} has no header row; re-download or repair the file")
    width = len(cells[0])
    rows = []
    for r, raw in enumerate(cells[1:]):
        if len(raw) != width:
            dropped = [t for t in raw[width:] if t.strip()]
            fix = "padded with empty cells" if len(raw) < width else f"extra cells dropped {dropped[:3]}"
            log.warning("%s: data row %d has %d cells, the header %d; %s", path, r, len(raw), width, fix)
            raw = (list(raw) + [""] * width)[:width]
        rows.append([Cell(text) for text in raw])
    return Table(table_id=table_id, header=[Cell(text) for text in cells[0]], rows=rows)


def _safe_relative(table_id: str) -> bool:
    parts = PurePosixPath(table_id).parts
    return bool(parts) and not PurePosixPath(table_id).is_absolute() and ".." not in parts and "\\" not in table_id


class CachedReads:
    """A dataset root's reader: the root checked on opening, per-reader LRU caches of the methods in :attr:`CACHED`
    (an unpickled reader starts with empty ones: a cache of a bound method does not pickle), and ``skipped``: per
    split or question file, counts of the question records skipped, by reason."""

    #: cache attribute -> the method it caches
    CACHED: dict[str, str] = {}
    #: folders the root must have
    REQUIRED_DIRS: tuple[str, ...] = ()
    #: e.g. "data/*.tsv and csv/<20x>-csv/ (WikiTableQuestions)", for messages
    LAYOUT = ""

    def __init__(self, root: str | Path, cache_size: int = 64):
        self._open_root(root)
        self._make_caches(cache_size)
        self.skipped: dict[str, Counter] = {}

    def _open_root(self, root: str | Path) -> None:
        """``self.root``: ``root`` if it and :attr:`REQUIRED_DIRS` exist, else one line naming ``dataset.root``."""
        self.root = Path(str(root)).expanduser()
        hint = f"set dataset.root=<folder holding {self.LAYOUT}>"
        if not self.root.is_dir():
            raise MateError(f"dataset.root not found: {self.root}; {hint}")
        for sub in self.REQUIRED_DIRS:
            if not (self.root / sub).is_dir():
                raise MateError(f"dataset.root {self.root} has no {sub}/; {hint}")

    def _make_caches(self, size: int) -> None:
        self._cache_size = max(0, int(size))
        for attr, method in self.CACHED.items():
            setattr(self, attr, lru_cache(self._cache_size)(getattr(self, method)))

    def __getstate__(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in self.CACHED}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._make_caches(self._cache_size)


class TableQAReader(CachedReads):
    """Questions and tables of one dataset root (the subclasses give the layouts)."""

    CACHED = {"_tables": "_read_table"}
    #: logical split (train/dev/test) -> upstream question file name
    FILES: dict[str, str] = {}
    #: folder of the question files, relative to the root ("" = the root itself)
    QUESTIONS_DIR = ""
    QUESTION_GLOB = "*"
    #: the globs of its table files (relative to the root)
    TABLE_GLOBS: tuple[str, ...] = ()
    TABLES_DIR = ""
    #: ``(path, table_id) -> Table``, the dataset's table-file parser (a staticmethod)
    _parse_table: Callable[[Path, str], Table]

    def available_files(self) -> list[str]:
        return sorted(p.name for p in (self.root / self.QUESTIONS_DIR).glob(self.QUESTION_GLOB) if p.is_file())

    def question_file(self, name: str) -> Path:
        """``name``: a logical split (:attr:`FILES`) or an upstream file name."""
        file_name = self.FILES.get(name, name)
        folder = self.root / self.QUESTIONS_DIR
        path = folder / file_name
        if "/" in file_name or "\\" in file_name or not path.is_file():
            known = {split: f for split, f in self.FILES.items() if (folder / f).is_file()}
            raise MateError(
                f"no question file {file_name!r} (for {name!r}) in {folder} (available files: "
                f"{self.available_files()}; splits: {known or 'none'}); name one of those files with "
                "dataset.eval_file=<file> (mate eval: \"overrides=['dataset.eval_file=<file>']\"), or add the file"
            )
        return path

    def input_files(self) -> list[Path]:
        """Every file the encoded examples depend on (question files and tables)."""
        files = set((self.root / self.QUESTIONS_DIR).glob(self.QUESTION_GLOB))
        for pattern in self.TABLE_GLOBS:
            files.update(self.root.glob(pattern))
        return sorted(path for path in files if path.is_file())

    def questions(self, name: str) -> Iterator[Question]:
        """The file's questions in order. An id repeated by a different record is an error naming both; an identical
        copy and a blank question are skipped with a warning, counted in ``self.skipped[name]``."""
        path = self.question_file(name)
        skipped = self.skipped.setdefault(name, Counter())
        seen: dict[str, tuple[str, Any]] = {}
        yielded = 0
        for where, record, question in self._read_questions(path):
            qid = question.question_id
            if qid in seen:
                first_where, first_record = seen[qid]
                if record != first_record:
                    raise MateError(
                        f"{path}: question {qid!r} appears twice ({first_where} and {where}) with different "
                        "content; give one of them another id or remove it"
                    )
                log.warning("%s: %s repeats question %r; skipped", path, where, qid)
                skipped["duplicate_records"] += 1
                continue
            seen[qid] = (where, record)
            if not question.question.strip():
                log.warning("%s: %s (question %r) has an empty question text; skipped", path, where, qid)
                skipped["empty_question"] += 1
                continue
            yielded += 1
            yield question
        if not yielded:
            raise MateError(no_questions(path, skipped))

    def _read_questions(self, path: Path) -> Iterator[Record]:
        raise NotImplementedError

    def table(self, table_id: str) -> Table:
        return self._tables(table_id)

    def table_file(self, table_id: str) -> Path:
        return self.root / table_id

    def _read_table(self, table_id: str) -> Table:
        path = self.table_file(table_id)
        if not _safe_relative(table_id) or not path.is_file():
            raise MateError(
                f"table file not found: {path} (table_id {table_id!r}); "
                f"check dataset.root or that {self.TABLES_DIR}/ is complete"
            )
        return self._parse_table(path, table_id)
