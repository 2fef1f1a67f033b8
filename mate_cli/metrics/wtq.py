"""WikiTableQuestions denotation accuracy, scored as the official evaluator scores it.

Re-implements Pasupat & Liang's ``evaluator.py`` (version 1.0.2, Python 2): answer strings become
typed values (:func:`to_value`) that match by normalised text (:func:`normalize`), as numbers
within ``1e-6`` or as equal dates; a predicted list is correct when, without duplicates, it has as
many values as the gold list and every gold value matches one (:func:`check_denotation`). Python 2
behaviours are kept: an amount within ``1e-6`` of an integer is stored truncated (``2.9999999`` is
2); a date built without its text writes an unknown day as ``-1``; ``\\d`` in the citation rule is
ASCII; ``1_000`` is not a number.

Predictions are read as the evaluator reads the ``predictions.tsv`` of
:mod:`mate_cli.data.answer_files`, with no canonical form: ``"1,484,900"`` is a string, matching a
gold ``1484900`` only if the gold text is ``1,484,900``; ``"1920-10-16"`` and ``"xx-10-24"`` are dates.

Gold answers are read through their CoreNLP canonical forms, the ``targetCanon`` of the release's
``tagged/data/<split>.tagged`` (``16 Oct 1920`` -> ``1920-10-16``, ``1,484,900`` -> ``1484900.0``),
which :class:`~mate_cli.data.wtq.WTQReader` passes on when the tagged file has the question.
Otherwise (a question file without a tagged twin, as ``random-split-1-dev.tsv``)
:func:`emulated_canon` stands in: a small subset of CoreNLP's forms for numbers (sign, currency,
thousands separators, ``%``, ordinals, one unit word; ``thousand``/``million``/``billion``
multiply) and dates (``_DATES``; ``May`` alone stays a word, as in CoreNLP).

The emulation was written from, and measured on, ``pristine-seen-tables.tagged`` (3,537 questions,
so in-sample): the same value list as the real ``targetCanon`` for 99.86% of questions (raw
strings: 93.38%), 4 of 7,074 verdicts different (raw: 233). CoreNLP finds numbers or dates beyond
these rules in ``Stage 3``, ``Since 1922``, ``2000 F``, ``12.21 (+0.7)`` and ``New Year's Day``.
Against ``evaluator.py`` itself (Python 2.7, 24,759 predictions on those questions) every verdict
agrees with the tagged forms and all but 8 (0.03%) with the emulated ones. On
``random-split-1-dev.tsv`` the emulation changes a gold value's type or number for 170 of 2,831
questions.
"""

from __future__ import annotations

import math
import re
import unicodedata
from decimal import Decimal
from typing import Iterable, Optional, Sequence

# Trailing citation marks, repeated: "[...]" (not at the very start), "[digits]"
# (anywhere, so a lone "[1]" vanishes; ASCII digits, as Python 2's non-Unicode \d)
# and the footnote symbols • ♦ † ‡ * # +.
_CITATIONS = re.compile(r"((?<!^)\[[^\]]*\]|\[[0-9]+\]|[•♦†‡*#+])*$")
# Trailing " (...)" details, repeated; the space before "(" is required and a string
# that is only "(...)" is kept.
_PARENTHESES = re.compile(r"(?<!^)( \([^)]*\))*$")
# One outermost pair of double quotes around a text with no other double quote.
_OUTER_QUOTES = re.compile(r'^"([^"]*)"$')
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
    """``int(text)`` without Python 3's digit separators (the official script ran on Python 2)."""
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
    """An answer value: :attr:`normalized` is the text it matches by; equal values (same type,
    same :attr:`key`: its text, amount or date) count once in a list."""

    normalized: str
    KEY = "normalized"  # the attribute a value is equal by

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
    """A plain string answer, compared by its normalised text."""

    def __init__(self, content: str) -> None:
        if not isinstance(content, str):
            raise TypeError(f"StringValue needs a str, got {type(content).__name__}")
        self.normalized = normalize(content)

    def __repr__(self) -> str:
        return f"StringValue({self.normalized!r})"


class NumberValue(Value):
    """A number; an amount within ``1e-6`` of an integer is stored as ``int(amount)`` (truncated)."""

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
        """``text`` as ``int()``, else ``float()``, reads it (finite; no ``_`` separators), else None."""
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
        if not (month == -1 or 1 <= month <= 12) or not (day == -1 or 1 <= day <= 31):
            raise ValueError(f"invalid date {year}-{month}-{day}")
        if year == month == day == -1:
            raise ValueError("a date needs at least one known part")
        self.ymd = (year, month, day)
        if original_string:
            self.normalized = normalize(original_string)
        else:  # as the official script writes it: an unknown year or month is "xx", a day stays -1
            self.normalized = f"{'xx' if year == -1 else year}-{'xx' if month == -1 else month}-{day}"

    def __repr__(self) -> str:
        return f"DateValue{self.ymd!r}"

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
    """The value of an answer string: a number, else a date (a year alone is a number), else a
    string. ``corenlp_value`` (a gold answer's canonical form; empty: none) is what is parsed, ``text``
    what is normalised. A :class:`Value` is returned unchanged."""
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
    """The distinct values of ``texts`` (the first of equal values kept, in order)."""
    texts = list(texts)
    if corenlp_values is None:
        corenlp_values = [None] * len(texts)
    elif len(corenlp_values) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(corenlp_values)} CoreNLP values")
    return list(dict.fromkeys(to_value(t, c) for t, c in zip(texts, corenlp_values)))


def check_denotation(target_values: Sequence[Value], predicted_values: Sequence[Value]) -> bool:
    """True iff both lists have the same size and every target matches some prediction."""
    if len(target_values) != len(predicted_values):
        return False
    return all(any(t.match(p) for p in predicted_values) for t in target_values)


# ---------------------------------------------------------------- gold: canonical forms
#: version of :func:`emulated_canon`'s rules: raise it when they change (WikiTQ's cached
#: answer cells depend on them, and the preprocessing cache key includes it)
CANON_EMULATION = 1
_MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
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
    """The canonical form CoreNLP would give the gold answer ``text`` (module docstring), in the tagged
    files' ``targetCanon`` forms (``"1484900"``, ``"1920-10-16"``, ``"xxxx-10-24"``, ``"1920-10-xx"``),
    or None when no rule applies (the text is then read as it is). For gold answers only."""
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
    """The gold values of ``answers``: read through ``canon`` (the tagged ``targetCanon``, one
    per answer) when given, else through :func:`emulated_canon`."""
    answers = list(answers)
    if not canon:
        canon = [emulated_canon(a) for a in answers]
    return to_value_list(answers, list(canon))


# ---------------------------------------------------------------- predictions
def prediction_field(text: str) -> str:
    """An answer as one field of ``predictions.tsv``: tabs and line breaks become spaces (the
    evaluator splits the file into lines, and a line on tabs)."""
    return " ".join(text.replace("\t", " ").splitlines()) if text else text


def predicted_values(answers: Iterable[str]) -> list[Value]:
    """The predicted values, as the evaluator reads them from ``predictions.tsv``."""
    return to_value_list([prediction_field(a) for a in answers])


def _texts(answers: str | Iterable[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else [str(a) for a in answers]


def denotation_correct(
    targets: str | Sequence[str], predicted: str | Sequence[str], canon: Optional[Sequence[str]] = None
) -> bool:
    """Whether the predicted answers denote the gold answers ``targets`` (a single str is a
    one-item list); ``canon``: the gold answers' tagged canonical forms, when known."""
    return check_denotation(target_values(_texts(targets), canon), predicted_values(_texts(predicted)))
