"""Pre-training corpora: tables with a text segment, as TAPAS pre-trains (:class:`TableText`).

Users' corpora are JSON lines, one object per line, blank lines skipped::

    {"text": "Ashford, Kent. Population by ward.", "table": {"header": ["ward", "people"],
     "rows": [["Aylesford Green", "2,432"], ["Beaver", "5,512"]]}, "id": "optional"}

``text`` may be empty; every cell is a string; a ragged row is an error, since a misaligned column would teach the
wrong structure. The bundled datasets give each table with the text TAPAS would pair it with; questions and statements
are never used as text.

``tables="train"`` keeps, of ``wtq``, ``sqa`` and ``tabfact``, only the tables of each source's training questions
(split as its task splits them, ``splits``), and never a table whose content (:func:`table_key`) is on a validation or
test side of any source: SQA's tables are WikiTQ's under other names. The tables of a held-back (absent) test file
cannot be excluded; the log says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from mate_cli.data.hybridqa import TABLES_DIR, HybridQAReader
from mate_cli.data.records import Cell, Table
from mate_cli.data.split import SplitSettings
from mate_cli.data.sqa import SQAReader
from mate_cli.data.tabfact import TabFactReader
from mate_cli.data.wtq import WTQReader
from mate_cli.errors import MateError, check_choice

log = logging.getLogger(__name__)

FORMAT_HINT = 'each line: {"text": str, "table": {"header": [str, ...], "rows": [[str, ...], ...]}}'


@dataclass
class TableText:
    table: Table
    text: str
    source: str = ""


def read_jsonl(path: str | Path) -> Iterator[TableText]:
    """The examples of a JSON-lines file; table id ``<file stem>:<line>`` unless the line gives an ``id``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MateError(f"corpus file not found: {path}; pass an existing JSON-lines file ({FORMAT_HINT})")
    found = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise MateError(
                    f"{path}:{number}: byte {raw[err.start]:#04x} at column {err.start + 1} is not UTF-8; "
                    "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if line.strip():
                found += 1
                yield parse_line(line, f"{path}:{number}", f"{path.stem}:{number}")
    if not found:
        raise MateError(f"{path} holds no examples (empty, or blank lines only); {FORMAT_HINT}")


def parse_line(line: str, where: str, default_id: str) -> TableText:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise MateError(f"{where}: not JSON ({error.msg}); {FORMAT_HINT}") from None
    if not isinstance(record, dict):
        raise MateError(f"{where}: a JSON {type(record).__name__}, not an object; {FORMAT_HINT}")
    text, table = record.get("text", ""), record.get("table")
    if not isinstance(text, str):
        raise MateError(f"{where}: key 'text' must be a string; {FORMAT_HINT}")
    if not isinstance(table, dict):
        raise MateError(f"{where}: key 'table' is missing or not an object; {FORMAT_HINT}")
    header, rows = table.get("header"), table.get("rows")
    if not isinstance(header, list) or not header or not all(isinstance(h, str) for h in header):
        raise MateError(f"{where}: key 'table.header' must be a non-empty list of strings; {FORMAT_HINT}")
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise MateError(f"{where}: key 'table.rows' must be a list of lists; {FORMAT_HINT}")
    for index, row in enumerate(rows):
        if len(row) != len(header):
            raise MateError(
                f"{where}: table.rows[{index}] has {len(row)} cells, the header {len(header)}; "
                'give every row one cell per column ("" for an empty one)'
            )
        if not all(isinstance(cell, str) for cell in row):
            raise MateError(f"{where}: table.rows[{index}] holds a non-string cell; write every cell as a string")
    table_id = str(record.get("id") or default_id)
    return TableText(
        Table(table_id, [Cell(h) for h in header], [[Cell(c) for c in row] for row in rows]), text, source=where
    )


def _text(*parts: str) -> str:
    return " ".join(part.strip() for part in parts if part and part.strip())


def hybridqa_tables(reader, passages: int = 1) -> Iterator[TableText]:
    """HybridQA's tables with their page text, then with up to ``passages`` linked passages each."""
    for path in sorted((reader.root / TABLES_DIR).glob("*.json")):
        table = reader.table(path.stem)
        yield TableText(table, _text(table.title, table.section_title, table.intro), f"hybridqa:{path.stem}")
        linked = list(reader.passages(path.stem).values())[: max(0, int(passages))]
        for number, passage in enumerate(linked, 1):
            yield TableText(table, _text(table.title, passage), f"hybridqa:{path.stem}#passage{number}")


def csv_tables(reader, kind: str) -> Iterator[TableText]:
    """Every table of a WikiTableQuestions or SQA root, with empty text: neither release keeps the page text."""
    found = {
        path.relative_to(reader.root).with_suffix(".csv").as_posix()
        for pattern in reader.TABLE_GLOBS
        for path in reader.root.glob(pattern)
        if path.is_file()
    }
    for table_id in sorted(found):
        yield TableText(reader.table(table_id), "", f"{kind}:{table_id}")


def tabfact_tables(reader) -> Iterator[TableText]:
    """TabFact's tables with their captions (which only the statement files hold)."""
    for name in reader.available_files():
        for _ in reader.questions(name):  # fills the reader's captions
            pass
    for path in sorted((reader.root / reader.TABLES_DIR).glob("*.csv")):
        table = reader.table(path.name)
        yield TableText(table, table.title, f"tabfact:{path.name}")


#: per dataset kind, its reader class and ``tables(reader, kind, hybridqa_passages)``
READERS = {
    "hybridqa": (HybridQAReader, lambda reader, kind, passages: hybridqa_tables(reader, passages)),
    "wtq": (WTQReader, lambda reader, kind, passages: csv_tables(reader, kind)),
    "sqa": (SQAReader, lambda reader, kind, passages: csv_tables(reader, kind)),
    "tabfact": (TabFactReader, lambda reader, kind, passages: tabfact_tables(reader)),
}


#: ``dataset.sources`` keys: a dataset root each, or ``jsonl``: one JSON-lines file or a list
SOURCES = ("hybridqa", "wtq", "sqa", "tabfact", "jsonl")
#: ``dataset.tables``: every table file, or only the fine-tuning training tables
TABLE_CHOICES = ("all", "train")
#: the sources ``dataset.tables=train`` can cut (their questions have a split)
SPLIT_SOURCES = ("wtq", "sqa", "tabfact")


def table_key(table: Table) -> str:
    """A digest of the header and cell texts: the same table under two names is one table."""
    cells = [[c.text for c in table.header], *[[c.text for c in row] for row in table.rows]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


class Corpus:
    """``dataset.sources``, checked when built: ``{kind: root}`` and ``{"jsonl": file or [files]}``, read in the order
    given (null: left out); ``hybridqa_passages``: extra HybridQA examples per table, one per linked passage."""

    def __init__(
        self,
        sources: Mapping[str, object],
        hybridqa_passages: int = 1,
        tables: str = "all",
        splits: Mapping[str, Mapping] | None = None,
    ) -> None:
        unknown = [kind for kind in sources if kind not in SOURCES]
        if unknown:
            raise MateError(f"dataset.sources.{unknown[0]} is not a corpus kind; use {', '.join(SOURCES)}")
        self.hybridqa_passages = int(hybridqa_passages)
        self.readers, self.files = {}, []
        for kind, where in sources.items():
            if where in (None, "", []):
                continue
            if kind == "jsonl":
                self.files = [Path(str(p)).expanduser() for p in ([where] if isinstance(where, (str, Path)) else where)]
                for path in self.files:
                    if not path.is_file():
                        raise MateError(
                            f"corpus file not found: {path}; pass an existing JSON-lines file ({FORMAT_HINT})"
                        )
                continue
            reader_class = READERS[kind][0]
            if not isinstance(where, (str, Path)) or not Path(str(where)).expanduser().is_dir():
                raise MateError(
                    f"dataset.sources.{kind}={where} is not a folder; set it to a {kind} dataset root "
                    "in its upstream layout (or null to leave it out)"
                )
            try:
                self.readers[kind] = reader_class(where)
            except MateError as err:
                raise MateError(f"dataset.sources.{kind}={where}: {err}") from None
        if not self.readers and not self.files:
            raise MateError(
                "the pre-training corpus is empty; set dataset.sources.<hybridqa|wtq|sqa|tabfact> to a "
                "dataset root or dataset.sources.jsonl to JSON-lines files"
            )
        self.tables = str(tables)
        check_choice("dataset.tables", tables, TABLE_CHOICES)
        self.splits: dict[str, SplitSettings] = {}
        if self.tables == "train":
            for kind in [*self.readers, *(["jsonl"] if self.files else [])]:
                if kind not in SPLIT_SOURCES:
                    raise MateError(
                        f"dataset.tables=train keeps the training tables of {', '.join(SPLIT_SOURCES)}; "
                        f"dataset.sources.{kind} has no split: set it to null or use dataset.tables=all"
                    )
                if not (splits or {}).get(kind):
                    raise MateError(
                        f"dataset.tables=train needs dataset.splits.{kind}: how the {kind} task splits "
                        "its questions (its dataset yaml's split node)"
                    )
                self.splits[kind] = SplitSettings(**dict(splits[kind]))
        self._kept: tuple[dict[str, set[str]], set[str]] | None = None

    def input_files(self) -> list[Path]:
        return [*(path for reader in self.readers.values() for path in reader.input_files()), *self.files]

    def examples(self) -> Iterator[TableText]:
        for kind, reader in self.readers.items():
            found = READERS[kind][1](reader, kind, self.hybridqa_passages)
            yield from (found if self.tables == "all" else self._training_tables(kind, found))
        for path in self.files:
            yield from read_jsonl(path)

    def _training_tables(self, kind: str, examples: Iterator[TableText]) -> Iterator[TableText]:
        train, held_out = self.kept_tables()
        for example in examples:
            if example.table.table_id in train[kind] and table_key(example.table) not in held_out:
                yield example

    def kept_tables(self) -> tuple[dict[str, set[str]], set[str]]:
        """``tables="train"``: per source its training tables' ids, and the held-out content keys (computed once)."""
        if self._kept is None:
            train: dict[str, set[str]] = {}
            held_out: set[str] = set()
            for kind, split in self.splits.items():
                reader = self.readers[kind]
                train[kind] = {q.table_id for q in split.questions("train", reader.questions)}
                sides = {}
                for side in ("validation", "test"):
                    try:
                        ids = {q.table_id for q in split.questions(side, reader.questions)}
                    except MateError:
                        if side == "validation":
                            raise
                        ids = None  # a held-back test file
                    sides[side] = ids
                    held_out |= {table_key(reader.table(t)) for t in ids or ()}
                log.info(
                    "pre-training on %s's training tables: %d tables of its training questions; held out: %d "
                    "validation tables, %s",
                    kind,
                    len(train[kind]),
                    len(sides["validation"]),
                    "no test file (held back: its tables cannot be excluded)"
                    if sides["test"] is None
                    else f"{len(sides['test'])} test tables",
                )
            self._kept = train, held_out
        return self._kept
