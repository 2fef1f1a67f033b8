"""WikiTableQuestions denotation accuracy as Pasupat & Liang's official ``evaluator.py`` (1.0.2, Python 2) scores it.

Answers become typed values (:func:`to_value`); a predicted list is correct when, deduplicated, it has as many values
as the gold list and every gold value matches one (:func:`check_denotation`). Python 2 behaviours are kept: an amount
within ``1e-6`` of an integer is truncated (``2.9999999`` is 2), ``\\d`` is ASCII, ``1_000`` is not a number.

Predictions are read as the evaluator reads ``predictions.tsv``, with no canonical form: ``"1,484,900"`` is a string,
matching a gold ``1484900`` only if the gold text is ``1,484,900``. Gold answers are read through CoreNLP's
``targetCanon`` from the release's ``tagged/data/<split>.tagged`` (passed on by :class:`~mate_cli.data.wtq.WTQReader`),
else (no tagged twin, as for ``random-split-1-dev.tsv``) through :func:`emulated_canon`, a small subset of CoreNLP's
number and date forms; there it changes a gold value's type or number for 170 of 2,831 questions.

The emulation, measured in-sample on ``pristine-seen-tables.tagged`` (3,537 questions), gives the tagged value list for
99.86% of questions (raw strings: 93.38%); against ``evaluator.py`` itself all but 8 of 24,759 verdicts agree (0.03%).
CoreNLP finds numbers or dates beyond its rules in ``Stage 3``, ``Since 1922``, ``2000 F``, ``12.21 (+0.7)``,
``New Year's Day``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from decimal import Decimal
from typing import Iterable, Optional, Sequence

# Trailing citation marks, repeated: "[...]" (not at the start), "[digits]" (anywhere: a lone "[1]" vanishes) and
# footnote symbols.
_CITATIONS = re.compile(r"((?<!^)\[[^\]]*\]|\[[0-9]+\]|[•♦†‡*#+])*$")
# Trailing " (...)" details, repeated; the space is required and a string that is only "(...)" is kept.
_PARENTHESES = re.compile(r"(?<!^)( \([^)]*\))*$")
_OUTER_QUOTES = re.compile(r'^"([^"]*)"$')
NUMBER_TOLERANCE = 1e-6


def normalize(text: str) -> str:
    """The official evaluator's normalised form of an answer string."""
    # NFKD drops accents (category Mn) and also folds compatibility characters ("ﬁ" -> "fi", full-width digits).
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c) != "Mn")
    text = re.sub(r"[‘’´`]", "'", text)
    text = re.sub(r"[“”]", '"', text)
    text = re.sub(r"[‐‑‒–—−]", "-", text)
    while True:
        before = text
        text = _CITATIONS.sub("", text.strip())
        text = _PARENTHESES.sub("", text.strip())
        text = _OUTER_QUOTES.sub(r"\1", text.strip())
        if text == before:
            break
    if text.endswith("."):
        text = text[:-1]
    return re.sub(r"\s+", " ", text).lower().strip()


def _int(text: str) -> int:
    """``int(text)`` without Python 3's ``_`` digit separators."""
    if "_" in text:
        raise ValueError(text)
    return int(text)


def _py2_str(amount: int | float) -> str:
    """Python 2's ``unicode(amount)``: a float with 12 significant digits (``1.0`` style when whole)."""
    if isinstance(amount, int):
        return str(amount)
    text = format(amount, ".12g")
    return text if any(c in text for c in ".e") else text + ".0"


class Value:
    """An answer value, matched by :attr:`normalized`; equal values (same type and :attr:`key`) count once in a list."""

    normalized: str
    KEY = "normalized"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self):
        return getattr(self, self.KEY)

    def match(self, other: "Value") -> bool:
        """Whether this (gold) value counts as the same answer as ``other`` (a predicted one)."""
        return self.normalized == other.normalized or self == other


class StringValue(Value):
    def __init__(self, content: str) -> None:
        if not isinstance(content, str):
            raise TypeError(f"StringValue needs a str, got {type(content).__name__}")
        self.normalized = normalize(content)

    def __repr__(self) -> str:
        return f"StringValue({self.normalized!r})"


class NumberValue(Value):
    """A number; matches another within ``1e-6``."""

    KEY = "amount"

    def __init__(self, amount: int | float, original_string: Optional[str] = None) -> None:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError(f"NumberValue needs an int or float, got {type(amount).__name__}")
        if isinstance(amount, float) and not math.isfinite(amount):
            raise ValueError(f"NumberValue needs a finite amount, got {amount}")
        self.amount = int(amount) if abs(amount - round(amount)) < NUMBER_TOLERANCE else float(amount)
        self.normalized = normalize(original_string) if original_string else _py2_str(self.amount)

    def __repr__(self) -> str:
        return f"NumberValue({self.amount!r}, {self.normalized!r})"

    def match(self, other: Value) -> bool:
        if self.normalized == other.normalized:
            return True
        return isinstance(other, NumberValue) and abs(self.amount - other.amount) < NUMBER_TOLERANCE

    @staticmethod
    def parse(text: str) -> Optional[int | float]:
        """``int(text)``, else a finite ``float(text)``, else None (no ``_`` separators)."""
        if "_" in text:
            return None
        try:
            return int(text)
        except ValueError:
            pass
        try:
            amount = float(text)
        except ValueError:
            return None
        return amount if math.isfinite(amount) else None


class DateValue(Value):
    """A date; ``-1`` marks an unknown year, month or day (not all three)."""

    KEY = "ymd"

    def __init__(self, year: int, month: int, day: int, original_string: Optional[str] = None) -> None:
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (year, month, day)):
            raise TypeError("DateValue needs int year, month and day")
        if not DateValue.valid(year, month, day):
            raise ValueError(f"invalid date {year}-{month}-{day}: a month 1-12, a day 1-31, at least one part known")
        self.ymd = (year, month, day)
        if original_string:
            self.normalized = normalize(original_string)
        else:  # as the official script writes it: an unknown year or month is "xx", a day stays -1
            self.normalized = f"{'xx' if year == -1 else year}-{'xx' if month == -1 else month}-{day}"

    def __repr__(self) -> str:
        return f"DateValue{self.ymd!r}"

    @staticmethod
    def parse(text: str) -> Optional[tuple[int, int, int]]:
        """``(year, month, day)`` of ``YYYY-MM-DD`` (``xx``, or ``xxxx`` for the year: unknown, -1), else None."""
        parts = text.lower().split("-")
        if len(parts) != 3:
            return None
        try:
            year = -1 if parts[0] in ("xx", "xxxx") else _int(parts[0])
            month = -1 if parts[1] == "xx" else _int(parts[1])
            day = -1 if parts[2] == "xx" else _int(parts[2])
        except ValueError:
            return None
        return (year, month, day) if DateValue.valid(year, month, day) else None

    @staticmethod
    def valid(year: int, month: int, day: int) -> bool:
        """A month 1-12 and a day 1-31, each -1 where unknown, and not all three unknown."""
        known = not year == month == day == -1
        return known and (month == -1 or 1 <= month <= 12) and (day == -1 or 1 <= day <= 31)


def to_value(text: str | Value, corenlp_value: Optional[str] = None) -> Value:
    """A number, else a date (a year alone is a number), else a string. ``corenlp_value`` (a gold answer's canonical
    form) is what is parsed when given, ``text`` what is normalised."""
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


def to_value_list(
    texts: Iterable[str | Value], corenlp_values: Optional[Sequence[Optional[str]]] = None
) -> list[Value]:
    """The distinct values of ``texts``, in order."""
    texts = list(texts)
    if corenlp_values is None:
        corenlp_values = [None] * len(texts)
    elif len(corenlp_values) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(corenlp_values)} CoreNLP values")
    return list(dict.fromkeys(to_value(t, c) for t, c in zip(texts, corenlp_values)))


def check_denotation(target_values: Sequence[Value], predicted_values: Sequence[Value]) -> bool:
    same_length = len(target_values) == len(predicted_values)
    return same_length and all(any(t.match(p) for p in predicted_values) for t in target_values)


#: version of :func:`emulated_canon`'s rules, in the preprocessing cache key: raise it when they change
CANON_EMULATION = 1
_MONTH_NAMES = "january february march april may june july august september october november december".split()
_MONTHS = {name: n for n, full in enumerate(_MONTH_NAMES, 1) for name in (full, full[:3])} | {"sept": 9}
_MONTH = r"(?P<month>[A-Za-z]+)\.?"
_DAY = r"(?P<day>\d{1,2})"
_YEAR = r"(?P<year>\d{3,4})"
_DATES = [
    re.compile(p)
    for p in (
        rf"{_MONTH} {_DAY},? {_YEAR}",  # October 16, 1920
        rf"{_DAY} {_MONTH},? {_YEAR}",  # 16 Oct 1920
        rf"{_MONTH} {_DAY}",  # October 16
        rf"{_DAY} {_MONTH}",  # 16 October
        rf"{_MONTH},? {_YEAR}",  # October 1920
        _MONTH,  # October
        r"(?P<nmonth>\d{1,2})/(?P<day>\d{1,2})/(?P<year>\d{4})",  # 10/16/1920
    )
]
_NUMBER = re.compile(
    r"[+-]?[$£€#]?(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:%|st|nd|rd|th| (?P<word>[a-z]+))?"
)
_MULTIPLIERS = {"thousand": 10**3, "million": 10**6, "billion": 10**9}


def emulated_canon(text: str) -> Optional[str]:
    """The ``targetCanon`` CoreNLP would give the gold answer ``text`` (``"1484900"``, ``"1920-10-16"``,
    ``"xxxx-10-24"``, ``"1920-10-xx"``), or None when no rule applies. For gold answers only."""
    text = " ".join(text.split())
    for pattern in _DATES:
        date = pattern.fullmatch(text)
        if date is None:
            continue
        parts = date.groupdict()
        if parts.get("nmonth"):
            month = int(parts["nmonth"])
        else:
            month = _MONTHS.get(parts["month"].lower(), 0)
            if parts["month"].lower() == "may" and text.lower() == "may":
                return None  # "May" alone: CoreNLP keeps it a word
        day = int(parts["day"]) if parts.get("day") else -1
        if not 1 <= month <= 12 or not (day == -1 or 1 <= day <= 31):
            continue
        return "-".join([parts.get("year") or "xxxx", f"{month:02d}", "xx" if day == -1 else f"{day:02d}"])
    number = _NUMBER.fullmatch(text)
    if number:
        amount = Decimal(number["number"].replace(",", "")) * _MULTIPLIERS.get(number["word"] or "", 1)
        return str(-amount if text.startswith("-") else amount)
    return None


def target_values(answers: Sequence[str], canon: Optional[Sequence[str]] = None) -> list[Value]:
    """Gold values, through ``canon`` (``targetCanon``, one per answer), else :func:`emulated_canon`."""
    answers = list(answers)
    return to_value_list(answers, list(canon) if canon else [emulated_canon(a) for a in answers])


def prediction_field(text: str) -> str:
    """An answer as one ``predictions.tsv`` field: tabs and line breaks become spaces."""
    return " ".join(text.replace("\t", " ").splitlines()) if text else text


def predicted_values(answers: Iterable[str]) -> list[Value]:
    """The predicted values, as the evaluator reads them from ``predictions.tsv``."""
    return to_value_list([prediction_field(a) for a in answers])


def _texts(answers: str | Iterable[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else [str(a) for a in answers]


def denotation_correct(
    targets: str | Sequence[str], predicted: str | Sequence[str], canon: Optional[Sequence[str]] = None
) -> bool:
    """Whether ``predicted`` denotes the gold ``targets`` (a str is a one-item list); ``canon`` as in
    :func:`target_values`."""
    return check_denotation(target_values(_texts(targets), canon), predicted_values(_texts(predicted)))
