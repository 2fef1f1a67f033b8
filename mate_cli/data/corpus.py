"""Pre-training corpora: tables with their context text, as TAPAS pre-trains (the table plus
a text segment: page title, section title, caption or nearby text).

Owns :class:`TableText` (one pre-training example before tokenization) and the generic
format for users' own corpora, JSON lines (:func:`read_jsonl`)::

    {"text": "Ashford, Kent. Population by ward.", "table": {"header": ["ward", "people"],
     "rows": [["Aylesford Green", "2,432"], ["Beaver", "5,512"]]}, "id": "optional"}

one object per line; blank lines are skipped. ``text`` may be empty; ``header`` is a list
of strings and ``rows`` a list of lists of strings (numbers are written as they read);
a ragged row is an error, since a misaligned column would teach the wrong structure.
Every problem is one ``MateError`` line naming the file, the line and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mate_cli.data.schema import Cell, Table
from mate_cli.errors import MateError

FORMAT_HINT = 'each line: {"text": str, "table": {"header": [str, ...], "rows": [[str, ...], ...]}}'


@dataclass
class TableText:
    """One pre-training example: a table and the text segment that goes with it."""

    table: Table
    text: str
    source: str = ""


def read_jsonl(path: str | Path) -> Iterator[TableText]:
    """The examples of a JSON-lines corpus file, in file order (table id ``<file stem>:<line>``
    unless the line names one with ``id``)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MateError(f"corpus file not found: {path}; pass an existing JSON-lines file ({FORMAT_HINT})")
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield parse_line(line, f"{path}:{number}", f"{path.stem}:{number}")


def parse_line(line: str, where: str, default_id: str) -> TableText:
    """One corpus line -> :class:`TableText` (``where`` names it in errors)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise MateError(f"{where}: not JSON ({error.msg}); {FORMAT_HINT}") from None
    if not isinstance(record, dict):
        raise MateError(f"{where}: a JSON {type(record).__name__}, not an object; {FORMAT_HINT}")
    text = record.get("text", "")
    table = record.get("table")
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
            raise MateError(f"{where}: table.rows[{index}] has {len(row)} cells, the header {len(header)}; "
                            "give every row one cell per column (\"\" for an empty one)")
        if not all(isinstance(cell, str) for cell in row):
            raise MateError(f"{where}: table.rows[{index}] holds a non-string cell; write every cell as a string")
    table_id = str(record.get("id") or default_id)
    return TableText(Table(table_id, [Cell(h) for h in header], [[Cell(c) for c in row] for row in rows]),
                     text, source=where)
