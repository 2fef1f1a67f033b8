"""Reading TabFact (Chen et al. 2020). Under ``root``, the upstream repository::

tokenized_data/{train,val,test,...}_examples.json
    {"<table_id>": [[statement, ...], [label, ...], "caption"], ...}   label 1 entailed, 0 refuted; caption optional
data/all_csv/<table_id>          the table, '#'-separated, first line = header (CRLF line ends)
data/simple_ids.json, data/complex_ids.json   optional: JSON lists of table ids (the channels)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

from mate_cli.data.readers import Record, TableQAReader, given_file, load_json, read_text, rows_to_table, split_lines
from mate_cli.data.records import Question, Table
from mate_cli.errors import MateError

CHANNEL_FILES = {"simple": "data/simple_ids.json", "complex": "data/complex_ids.json"}
_ENTRY = "[[statement, ...], [label 0/1, ...], caption]"


class _Pairs:
    """A JSON object kept as its (key, value) pairs, so a repeated table id is seen."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        self.pairs = pairs


def parse_table_file(path: Path, table_id: str) -> Table:
    lines = split_lines(read_text(path, "table file"))
    table = rows_to_table([line.split("#") for line in lines], table_id, path)
    if table.num_columns == 1 and ("," in table.header[0].text or "\t" in table.header[0].text):
        raise MateError(
            f"{path}: line 1: one column whose header {table.header[0].text[:60]!r} holds ',' or tabs: "
            "not a '#'-separated TabFact table; convert it (columns joined by '#', first line the "
            "header) or use a run of its own dataset"
        )
    return table


class TabFactReader(TableQAReader):
    FILES = {"train": "train_examples.json", "dev": "val_examples.json", "test": "test_examples.json"}
    QUESTIONS_DIR = "tokenized_data"
    QUESTION_GLOB = "*.json"
    REQUIRED_DIRS = ("tokenized_data", "data/all_csv")
    TABLE_GLOBS = ("data/all_csv/*.csv", *CHANNEL_FILES.values())
    TABLES_DIR = "data/all_csv"
    LAYOUT = "tokenized_data/*_examples.json and data/all_csv/ (TabFact layout)"
    _parse_table = staticmethod(parse_table_file)

    def __init__(self, root: str | Path, cache_size: int = 64):
        super().__init__(root, cache_size)
        self._captions: dict[str, str] = {}
        self._channels: Optional[dict[str, str]] = None

    def channel(self, table_id: str) -> Optional[str]:
        """``simple`` / ``complex``; None without the id lists."""
        if self._channels is None:
            self._channels = {}
            for name, rel in CHANNEL_FILES.items():
                path = self.root / rel
                if path.is_file():
                    for table_id_ in _id_list(load_json(path, "table id list"), path):
                        self._channels.setdefault(table_id_, name)
        return self._channels.get(table_id)

    def _read_questions(self, path: Path) -> Iterator[Record]:
        data = load_json(path, "examples file", object_pairs_hook=_Pairs)
        if not isinstance(data, _Pairs):
            raise MateError(
                f"{path}: expected a JSON object {{table_id: {_ENTRY}}}, got {type(data).__name__}; "
                "use the upstream tokenized_data/*_examples.json"
            )
        for entry, (table_id, value) in enumerate(data.pairs):
            statements, labels, caption = _entry(value, path, table_id)
            self._captions[table_id] = caption
            channel = self.channel(table_id)
            for i, (statement, label) in enumerate(zip(statements, labels)):
                where = f"table {table_id!r} (entry #{entry}) statement #{i}"
                if not isinstance(statement, str) or label not in (0, 1) or isinstance(label, (bool, float)):
                    raise MateError(
                        f"{path}: {where}: statement {str(statement)[:60]!r} with label {label!r} is not "
                        "(text, 0 refuted / 1 entailed); fix or remove that statement"
                    )
                question = Question(f"{table_id}#{i}", statement, table_id, label=int(label), channel=channel)
                yield where, (statement, label, caption), question

    def table_file(self, table_id: str) -> Path:
        return self.root / self.TABLES_DIR / table_id

    def table(self, table_id: str) -> Table:
        """``title`` = its caption once known."""
        table = super().table(table_id)
        if not table.title:
            table.title = self._captions.get(table_id, "")
        return table


def _entry(value: Any, path: Path, table_id: str) -> tuple[list, list, str]:
    ok = isinstance(value, list) and len(value) in (2, 3)
    ok = ok and isinstance(value[0], list) and isinstance(value[1], list) and len(value[0]) == len(value[1])
    ok = ok and (len(value) == 2 or isinstance(value[2], str))
    if not ok:
        raise MateError(
            f"{path}: table {table_id!r}: value {str(value)[:80]!r} is not {_ENTRY} with one label "
            "per statement; fix or remove that table's entry"
        )
    return value[0], value[1], value[2] if len(value) == 3 else ""


def _id_list(data: Any, path: Path) -> list[str]:
    """A JSON list of ids (upstream), or an object keyed by id."""
    ids = list(data) if isinstance(data, dict) else data
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise MateError(
            f'{path}: expected a JSON list of table ids like ["2-1859269-1.html.csv", ...]; '
            "re-download the file or delete it"
        )
    return ids


def read_table_file(path: str | Path) -> Table:
    """A table file given on the command line; table id = file name."""
    path = given_file(path, "a TabFact data/all_csv/<table_id>.html.csv ('#'-separated) file")
    return parse_table_file(path, path.name)
