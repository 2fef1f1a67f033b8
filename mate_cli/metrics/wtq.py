"""WikiTableQuestions denotation accuracy with the official evaluator's value matching.

Owns the answer-string normalisation, the typed answer values (string, number,
date) and the denotation check of Pasupat & Liang's official WikiTableQuestions
``evaluator.py``, re-implemented here:

- every answer string becomes a value with :func:`to_value`: a
  :class:`NumberValue` when it parses as a number, else a :class:`DateValue` when
  it parses as ``YYYY-MM-DD`` (``xx`` for an unknown part; a year-only date is the
  number of its year), else a :class:`StringValue`;
- a value matches another when their normalised texts (:func:`normalize`) are
  equal, or when both are numbers within ``1e-6``, or both are dates with the same
  (year, month, day);
- a predicted list is correct (:func:`check_denotation`) when, after removing
  duplicates, it has as many values as the gold list and every gold value matches
  some predicted value: a set comparison, order does not matter.

Three departures from the official script, each to score raw gold strings the way
the official evaluation scores the dataset's CoreNLP-canonicalised targets:

- a number may use commas as thousands separators (``"1,484,900"`` is 1484900); the
  official script only reads such a target as a number through its CoreNLP
  canonical value, which the raw ``targetValue`` strings used here do not carry;
- a number also matches a string value whose normalised text parses as the same
  number (e.g. gold ``"3 (approx.)"`` normalises to ``"3"`` and matches a predicted
  ``3.0``), and this string/number match is symmetric, so :func:`check_denotation`
  does not depend on which side holds the number;
- a date built without its original string normalises an unknown day to ``xx``
  (the official script compares the day with the string ``'-1'`` and so writes
  ``-1``); this only affects a date compared with a string by text.

Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import math
import re
import unicodedata
from abc import ABC, abstractmethod
from typing import Iterable, Optional, Sequence

# Trailing citation marks, repeated: "[...]" (not at the very start), "[digits]"
# (anywhere, so a lone "[1]" vanishes) and the footnote symbols • ♦ † ‡ * # +.
_CITATIONS = re.compile(r"((?<!^)\[[^\]]*\]|\[\d+\]|[•♦†‡*#+])*$")
# Trailing " (...)" details, repeated; the space before "(" is required and a string
# that is only "(...)" is kept.
_PARENTHESES = re.compile(r"(?<!^)( \([^)]*\))*$")
# One outermost pair of double quotes around a text with no other double quote.
_OUTER_QUOTES = re.compile(r'^"([^"]*)"$')
# A number written with commas as thousands separators: 1,484,900 or -12,000.5.
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
NUMBER_TOLERANCE = 1e-6


def normalize(text: str) -> str:
    """The official evaluator's normalised form of an answer string."""
    # Accents: NFKD decomposition, then drop the combining marks (category Mn).
    # NFKD also folds compatibility characters ("ﬁ" -> "fi", full-width digits).
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c) != "Mn")
    # Quotes: typographic single quotes, acute accent and backtick become "'".
    text = re.sub(r"[‘’´`]", "'", text)
    # Quotes: typographic double quotes become '"'.
    text = re.sub(r"[“”]", '"', text)
    # Dashes: hyphen, non-breaking hyphen, figure/en/em dash and minus become "-".
    text = re.sub(r"[‐‑‒–—−]", "-", text)
    # Until nothing changes: strip, drop trailing citations, strip, drop trailing
    # " (...)" details, strip, drop one pair of outer double quotes.
    while True:
        before = text
        text = _CITATIONS.sub("", text.strip())
        text = _PARENTHESES.sub("", text.strip())
        text = _OUTER_QUOTES.sub(r"\1", text.strip())
        if text == before:
            break
    # One trailing period.
    if text.endswith("."):
        text = text[:-1]
    # Whitespace runs become one space; lower-case; strip.
    return re.sub(r"\s+", " ", text).lower().strip()


def _int(text: str) -> int:
    """``int(text)`` without Python 3's digit separators (the official script ran on Python 2)."""
    if "_" in text:
        raise ValueError(text)
    return int(text)


class Value(ABC):
    """An answer value; :attr:`normalized` is the text it is compared by."""

    _normalized: str

    @property
    def normalized(self) -> str:
        return self._normalized

    @abstractmethod
    def match(self, other: "Value") -> bool:
        """Whether this value counts as the same answer as ``other``."""


class StringValue(Value):
    """A plain string answer, compared by its normalised text."""

    def __init__(self, content: str) -> None:
        if not isinstance(content, str):
            raise TypeError(f"StringValue needs a str, got {type(content).__name__}")
        self._normalized = normalize(content)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StringValue) and self.normalized == other.normalized

    def __hash__(self) -> int:
        return hash(("S", self.normalized))

    def __repr__(self) -> str:
        return f"StringValue({self.normalized!r})"

    def match(self, other: Value) -> bool:
        if isinstance(other, NumberValue):
            return other.match(self)
        return self.normalized == other.normalized


class NumberValue(Value):
    """A number; an amount within ``1e-6`` of an integer is stored as that integer."""

    def __init__(self, amount: int | float, original_string: Optional[str] = None) -> None:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError(f"NumberValue needs an int or float, got {type(amount).__name__}")
        if isinstance(amount, float) and (math.isnan(amount) or math.isinf(amount)):
            raise ValueError(f"NumberValue needs a finite amount, got {amount}")
        self._amount: int | float = int(round(amount)) if abs(amount - round(amount)) < NUMBER_TOLERANCE else float(amount)
        self._normalized = normalize(original_string) if original_string else str(self._amount)

    @property
    def amount(self) -> int | float:
        return self._amount

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NumberValue) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __repr__(self) -> str:
        return f"NumberValue({self.amount!r}, {self.normalized!r})"

    def match(self, other: Value) -> bool:
        if self.normalized == other.normalized:
            return True
        if isinstance(other, NumberValue):
            return abs(self.amount - other.amount) < NUMBER_TOLERANCE
        if isinstance(other, StringValue):
            amount = NumberValue.parse(other.normalized)
            return amount is not None and abs(self.amount - amount) < NUMBER_TOLERANCE
        return False

    @staticmethod
    def parse(text: str) -> Optional[int | float]:
        """``text`` as an int or a finite float (commas allowed as thousands separators), else None."""
        text = text.strip()
        if _THOUSANDS.fullmatch(text):
            text = text.replace(",", "")
        try:
            return _int(text)
        except ValueError:
            pass
        if "_" in text:
            return None
        try:
            amount = float(text)
        except ValueError:
            return None
        return None if math.isnan(amount) or math.isinf(amount) else amount


class DateValue(Value):
    """A date; ``-1`` marks an unknown year, month or day (not all three)."""

    def __init__(self, year: int, month: int, day: int, original_string: Optional[str] = None) -> None:
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (year, month, day)):
            raise TypeError("DateValue needs int year, month and day")
        if not (month == -1 or 1 <= month <= 12) or not (day == -1 or 1 <= day <= 31):
            raise ValueError(f"invalid date {year}-{month}-{day}")
        if year == month == day == -1:
            raise ValueError("a date needs at least one known part")
        self._ymd = (year, month, day)
        if original_string:
            self._normalized = normalize(original_string)
        else:
            self._normalized = "-".join("xx" if x == -1 else str(x) for x in self._ymd)

    @property
    def ymd(self) -> tuple[int, int, int]:
        return self._ymd

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DateValue) and self.ymd == other.ymd

    def __hash__(self) -> int:
        return hash(self.ymd)

    def __repr__(self) -> str:
        return f"DateValue{self.ymd!r}"

    def match(self, other: Value) -> bool:
        if self.normalized == other.normalized:
            return True
        return isinstance(other, DateValue) and self.ymd == other.ymd

    @staticmethod
    def parse(text: str) -> Optional[tuple[int, int, int]]:
        """``(year, month, day)`` of a ``YYYY-MM-DD`` text (``xx``/``xxxx`` = unknown, -1), else None."""
        parts = text.lower().split("-")
        if len(parts) != 3:
            return None
        try:
            year = -1 if parts[0] in ("xx", "xxxx") else _int(parts[0])
            month = -1 if parts[1] == "xx" else _int(parts[1])
            day = -1 if parts[2] == "xx" else _int(parts[2])
        except ValueError:
            return None
        if year == month == day == -1:
            return None
        if not (month == -1 or 1 <= month <= 12) or not (day == -1 or 1 <= day <= 31):
            return None
        return year, month, day


def to_value(text: str | Value, corenlp_value: Optional[str] = None) -> Value:
    """The value of an answer string: a number, else a date, else a string.

    ``corenlp_value`` (the dataset's canonical form, when known) is what is parsed;
    ``text`` is what the value is normalised from. A date with only a year is the
    number of that year. A :class:`Value` is returned unchanged.
    """
    if isinstance(text, Value):
        return text
    parsed = corenlp_value or text
    amount = NumberValue.parse(parsed)
    if amount is not None:
        return NumberValue(amount, text)
    ymd = DateValue.parse(parsed)
    if ymd is not None:
        if ymd[1] == ymd[2] == -1:
            return NumberValue(ymd[0], text)
        return DateValue(*ymd, original_string=text)
    return StringValue(text)


def to_value_list(texts: Iterable[str | Value], corenlp_values: Optional[Sequence[str]] = None) -> list[Value]:
    """The distinct values of ``texts`` (first occurrence kept, in order)."""
    texts = list(texts)
    if corenlp_values is None:
        values = [to_value(t) for t in texts]
    else:
        if len(corenlp_values) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(corenlp_values)} CoreNLP values")
        values = [to_value(t, c) for t, c in zip(texts, corenlp_values)]
    return list(dict.fromkeys(values))


def check_denotation(target_values: Sequence[Value], predicted_values: Sequence[Value]) -> bool:
    """True iff both lists have the same size and every target matches some prediction."""
    if len(target_values) != len(predicted_values):
        return False
    return all(any(t.match(p) for p in predicted_values) for t in target_values)


def _texts(answers: str | Iterable[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else [str(a) for a in answers]


def denotation_correct(targets: str | Sequence[str], predicted: str | Sequence[str]) -> bool:
    """Whether the predicted answer strings denote the gold answer strings (a single str is a one-item list)."""
    return check_denotation(to_value_list(_texts(targets)), to_value_list(_texts(predicted)))


def accuracy(pairs: Iterable[tuple[str | Sequence[str], str | Sequence[str]]]) -> float:
    """Share of ``(targets, predicted)`` pairs that are :func:`denotation_correct` (0.0 when empty)."""
    results = [denotation_correct(t, p) for t, p in pairs]
    return sum(results) / len(results) if results else 0.0
