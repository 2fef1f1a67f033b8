"""``mate report``'s table on screen in at most :data:`WIDTH` columns, nothing cut: key columns every row shares said
once above it, metrics that do not fit in further tables (:func:`split`), a key column too wide wrapped in its cell.
"""

from __future__ import annotations

import shutil
import sys
from typing import Sequence

WIDTH = 100


def screen_width() -> int:
    """:data:`WIDTH`, or a narrower terminal's width."""
    return min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) if sys.stdout.isatty() else WIDTH


def short_value(text: str) -> str:
    """A long float key value in 4 significant digits (``0.00015999999999999999`` -> ``0.00016``), else as it is."""
    try:
        return text if len(text) <= 8 else f"{float(text):.4g}"
    except ValueError:
        return text


def short_names(columns: Sequence[str], keys: int) -> list[str]:
    """The first ``keys`` column names by their last part (``model.optimizer.lr`` -> ``lr``) where it is unique."""
    last = [name.rsplit(".", 1)[-1] for name in columns[:keys]]
    return [last[i] if i < keys and last.count(last[i]) == 1 else name for i, name in enumerate(columns)]


def table_width(widths: Sequence[int]) -> int:
    """The printed width of a rich table (heavy head, one space of padding) of these columns."""
    return sum(widths) + 3 * len(widths) + 1


def split(columns: Sequence[str], rows: Sequence[Sequence[str]], first_metric: int, width: int):
    """``(common, tables)``: the shared key columns as ``key=value``, and ``(columns, rows)`` tables: the first with
    ``#``, the differing keys, ``runs`` and the metrics that fit; the others ``#`` and the metrics left."""
    keys = range(first_metric - 1)  # the key columns; then "runs", then the metrics
    rows = [[short_value(v) if i in keys else v for i, v in enumerate(row)] for row in rows]
    columns = short_names(columns, first_metric - 1)
    same = [i for i in keys if len({row[i] for row in rows}) == 1]
    common = [f"{columns[i]}={rows[0][i]}" for i in same] if rows else []
    varying = [i for i in keys if i not in same]
    numbers = [str(n) for n in range(1, len(rows) + 1)]

    def column_width(i: int) -> int:
        return max([len(columns[i]), *(len(row[i]) for row in rows)])

    tables = []
    fixed = [*varying, first_metric - 1]  # the differing keys and "runs"
    used = [len("#"), *(column_width(i) for i in fixed)]
    chosen: list[int] = []
    for metric in range(first_metric, len(columns)):
        if chosen and table_width([*used, *(column_width(i) for i in chosen), column_width(metric)]) > width:
            tables.append((fixed, chosen))
            fixed, used, chosen = [], [len("#")], []
        chosen.append(metric)
    tables.append((fixed, chosen))
    out = []
    for fixed_columns, metrics in tables:
        picked = [*fixed_columns, *metrics]
        out.append((["#", *(columns[i] for i in picked)],
                    [[n, *(row[i] for i in picked)] for n, row in zip(numbers, rows)]))  # fmt: skip
    return common, out


def print_tables(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], first_metric: int, console,
                 width: int) -> None:  # fmt: skip
    from rich.markup import escape
    from rich.table import Table

    common, tables = split(columns, rows, first_metric, width)
    console.print(title, markup=False, highlight=False)
    if common:
        console.print("every row: " + ", ".join(common), markup=False, highlight=False)
    for number, (names, cells) in enumerate(tables):
        table = Table(title=None if number == 0 else "(continued; # as above)", title_justify="left")
        for name in names:
            table.add_column(escape(name), overflow="fold", justify="right" if name == "#" else "left")
        for row in cells:
            table.add_row(*(escape(value) for value in row))
        console.print(table, width=width)
