"""Numbers and dates in table text as ``transformers.TapasTokenizer`` reads them (TAPAS's ``number_utils`` and
``number_annotation_utils``), so a TAPAS checkpoint sees the ids it was trained on; lenient, and kept so.

**Values of a text** (:func:`parse_values`, on the lowercased, whitespace-collapsed text). Candidate spans:
(1) every match of a number pattern (``1,234.5``, ``.5``, ``7.``; a sign only at the start or after a space), even
inside a word (``abc12`` holds 12); (2) every other word (a run of letters and digits): a float after dropping one
ordinal suffix (``3rd`` -> 3, ``1e3`` -> 1000), ``zero``..``twelve`` or ``zeroth``..``twelfth``; (3) every run of one
to five words that is a whole date of :data:`DATE_FORMATS`. A span inside a longer chosen one is dropped (equal
lengths: leftmost first); a kept span keeps all its values: ``2001`` is the number 2001 and the date (2001, -, -).

**A column's values** (:func:`column_values`): the kind (number or date) held by the most cells wins (dates on a
tie) unless fewer than 70% of the cells hold it, and then the column has none; a cell keeps its first value of it.
**Order** (:func:`sort_key`): numbers as floats; dates on the fields every compared date has; else no order.
**Ranks**: per column, dense from 1 over the distinct values ascending; inverse = distinct values - rank + 1; 0 for
no value. **Relations** (:meth:`TableNumbers.relations`): a cell's id ORs :class:`Relation` bits over every question
value it can be ordered with (``LT``: the question's value is less); ids 0..7 of TAPAS's table of 10.
"""

from __future__ import annotations

import datetime
import enum
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

MIN_CONSOLIDATION_FRACTION = 0.7

#: the largest float32: models compute in it, so a larger number is no number to them
FLOAT32_MAX = 3.4028234663852886e38
MAX_DATE_WORDS = 5
#: Years a date may carry (DynSP's range, as TAPAS).
YEARS = range(1700, 2017)

NUMBER_WORDS = tuple("zero one two three four five six seven eight nine ten eleven twelve".split())
ORDINAL_WORDS = tuple(
    "zeroth first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split()
)
ORDINAL_SUFFIXES = ("st", "nd", "rd", "th")

#: ``strptime`` formats tried in turn, each with the fields it really sets (the others stay None)
DATE_FORMATS = (
    ("%B", "m"),
    ("%Y", "y"),
    ("%Ys", "y"),
    ("%b %Y", "ym"),
    ("%B %Y", "ym"),
    ("%B %d", "md"),
    ("%b %d", "md"),
    ("%d %b", "md"),
    ("%d %B", "md"),
    ("%B %d, %Y", "ymd"),
    ("%d %B %Y", "ymd"),
    ("%m-%d-%Y", "ymd"),
    ("%Y-%m-%d", "ymd"),
    ("%Y-%m", "ym"),
    ("%d %b %Y", "ymd"),
    ("%b %d, %Y", "ymd"),
    ("%d.%m.%Y", "ymd"),
    ("%A, %b %d", "md"),
    ("%A, %B %d", "md"),
)

_NUMBER_RE = re.compile(r"(?:(?:^|\s)[+-])?(?:\.\d+|\d+(?:,\d{3})*(?:\.\d*)?)")
_WORD_RE = re.compile(r"[^\W_]+")  # runs of str.isalnum() characters
_DIRECTIVE_SHAPES = {"%A": r"\w+", "%B": r"\w+", "%b": r"\w{3}", "%Y": r"\d{4}", "%d": r"\d{1,2}", "%m": r"\d{1,2}"}


def _shape(date_format: str) -> re.Pattern:
    """A cheap regex a text must match before ``strptime`` is tried."""
    parts = re.split(r"(%[A-Za-z])", date_format)
    literal = lambda s: re.escape(s).replace(r"\ ", r"\s+")  # noqa: E731
    return re.compile("^" + "".join(_DIRECTIVE_SHAPES.get(p) or literal(p) for p in parts) + "$")


_DATE_SHAPES = tuple((fmt, fields, _shape(fmt)) for fmt, fields in DATE_FORMATS)


class Date(NamedTuple):
    year: int | None = None
    month: int | None = None
    day: int | None = None


Value = float | Date


class ValueSpan(NamedTuple):
    """Characters ``[begin, end)`` of the normalised text."""

    begin: int
    end: int
    values: tuple[Value, ...]


class Relation(enum.IntFlag):
    """Question value vs cell value; TAPAS's ``Relation.EQ/LT/GT`` (7, 8, 9) as bits 2**(v - 7)."""

    EQ = 1
    LT = 2
    GT = 4


def normalize_text(text: str) -> str:
    return " ".join(text.lower().split())


def outside_float32(text: str) -> bool:
    """Whether ``text`` is a finite number too large for float32."""
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return False
    return math.isfinite(value) and abs(value) > FLOAT32_MAX


def parse_number(text: str) -> float | None:
    """A word as TAPAS reads a number (``'3rd'`` -> 3.0); None for NaN, inf, beyond float32."""
    if text.endswith(ORDINAL_SUFFIXES):  # each two letters
        text = text[:-2]
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and abs(value) <= FLOAT32_MAX else None


def parse_date(text: str) -> Date | None:
    """A whole (normalised) text as a date of :data:`DATE_FORMATS` with a year in :data:`YEARS`, or None."""
    for date_format, fields, shape in _DATE_SHAPES:
        if not shape.match(text):
            continue
        try:
            parsed = datetime.datetime.strptime(text, date_format)
        except ValueError:
            continue
        if parsed.year not in YEARS:  # also the default year 1900 of formats without one
            continue
        year, month, day = parsed.year, parsed.month, parsed.day
        return Date(year if "y" in fields else None, month if "m" in fields else None, day if "d" in fields else None)
    return None


@lru_cache(maxsize=1 << 16)
def parse_values(text: str) -> tuple[ValueSpan, ...]:
    """The value spans of ``text``, in text order (module docstring)."""
    text = normalize_text(text)
    found: dict[tuple[int, int], list[Value]] = {}
    for match in _NUMBER_RE.finditer(text):
        number = parse_number(match.group())
        if number is not None:
            found.setdefault(match.span(), []).append(number)
    words = [m.span() for m in _WORD_RE.finditer(text)]
    for begin, end in words:
        if (begin, end) in found:
            continue
        word = text[begin:end]
        for number in (parse_number(word), _index(NUMBER_WORDS, word), _index(ORDINAL_WORDS, word)):
            if number is not None:
                found.setdefault((begin, end), []).append(number)
    for last in range(len(words)):
        for first in range(max(0, last - MAX_DATE_WORDS + 1), last + 1):
            span = (words[first][0], words[last][1])
            date = parse_date(text[span[0] : span[1]])
            if date is not None:
                found.setdefault(span, []).append(date)
    chosen: list[tuple[int, int]] = []
    for begin, end in sorted(found, key=lambda s: (s[0] - s[1], s[0])):  # longest first, then leftmost
        if not any(b <= begin and end <= e for b, e in chosen):
            chosen.append((begin, end))
    return tuple(ValueSpan(b, e, tuple(found[b, e])) for b, e in sorted(chosen))


def _index(words: tuple[str, ...], word: str) -> float | None:
    return float(words.index(word)) if word in words else None


def text_values(text: str) -> list[Value]:
    return [value for span in parse_values(text) for value in span.values]


def _is_date(value: Value) -> bool:
    return isinstance(value, Date)


def column_values(texts: Sequence[str], min_fraction: float = MIN_CONSOLIDATION_FRACTION) -> dict[int, Value]:
    """``{row: value}`` for the cells of one column that hold a value of the column's kind."""
    per_row = [text_values(text) for text in texts]
    counts = Counter(kind for values in per_row for kind in {_is_date(v) for v in values})
    if not counts:
        return {}
    top = max(counts.values())
    if top < len(texts) * min_fraction:
        return {}
    dates = counts.get(True) == top
    return {
        row: next(v for v in values if _is_date(v) == dates)
        for row, values in enumerate(per_row)
        if any(_is_date(v) == dates for v in values)
    }


def sort_key(values: Sequence[Value]) -> Callable[[Value], float | tuple] | None:
    """A key that orders ``values``, or None when they cannot be ordered."""
    kinds = {_is_date(v) for v in values}
    if len(kinds) != 1:
        return None
    if kinds == {False}:
        return float
    common = [i for i in range(3) if all(v[i] is not None for v in values)]
    return (lambda date: tuple(date[i] for i in common)) if common else None


def _dense_ranks(keys: dict[int, object]) -> dict[int, tuple[int, int]]:
    order = {key: r + 1 for r, key in enumerate(sorted(set(keys.values())))}
    return {row: (order[key], len(order) - order[key] + 1) for row, key in keys.items()}


@dataclass(frozen=True)
class TableNumbers:
    """A table's data cells read as numbers: per column, ``{data row: value}`` and ``{data row: (rank, inverse)}``."""

    columns: tuple[dict[int, Value], ...]
    ranks: tuple[dict[int, tuple[int, int]], ...]

    @staticmethod
    def of(rows: Sequence[Sequence[str]]) -> "TableNumbers":
        """``rows[r][c]`` data-cell texts; cached, so every question of a table shares one reading."""
        return _read_table(tuple(tuple(row) for row in rows))

    def relations(self, question: str) -> dict[tuple[int, int], int]:
        """``{(data row, column): Relation bits}``."""
        bits: dict[tuple[int, int], int] = {}
        for value in text_values(question):
            for c, cells in enumerate(self.columns):
                key = sort_key([*cells.values(), value]) if cells else None
                if key is None:
                    continue
                mine = key(value)
                for r, cell in cells.items():
                    other = key(cell)
                    relation = Relation.EQ if mine == other else Relation.LT if mine < other else Relation.GT
                    bits[r, c] = bits.get((r, c), 0) | relation
        return bits


@lru_cache(maxsize=256)
def _read_table(rows: tuple[tuple[str, ...], ...]) -> TableNumbers:
    num_cols = len(rows[0]) if rows else 0
    columns = tuple(column_values([row[c] for row in rows]) for c in range(num_cols))
    keys = [sort_key(list(cells.values())) if cells else None for cells in columns]
    ranks = (_dense_ranks({r: key(v) for r, v in cells.items()}) if key else {} for cells, key in zip(columns, keys))
    return TableNumbers(columns, tuple(ranks))
