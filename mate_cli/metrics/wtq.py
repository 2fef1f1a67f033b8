"""WikiTableQuestions denotation accuracy, scored as the official evaluator scores it.

Owns the answer-string normalisation, the typed answer values (string, number, date),
the denotation check and the gold targets of Pasupat & Liang's official
WikiTableQuestions ``evaluator.py`` (version 1.0.2, Python 2), re-implemented here:

- every answer string becomes a value with :func:`to_value`: a :class:`NumberValue`
  when Python's ``int()`` or ``float()`` reads it (finite), else a :class:`DateValue`
  when it reads as ``YYYY-MM-DD`` (``xx`` for an unknown part; a year-only date is the
  number of its year), else a :class:`StringValue`. A gold answer is read through its
  canonical form (below) and keeps its own text for the comparison by text;
- a gold value matches a predicted one when their normalised texts (:func:`normalize`)
  are equal, or both are numbers within ``1e-6``, or both are dates with the same
  (year, month, day);
- a predicted list is correct (:func:`check_denotation`) when, after removing
  duplicates, it has as many values as the gold list and every gold value matches some
  predicted value.

**Predictions** (:func:`predicted_values`) are read exactly as the evaluator reads the
``predictions.tsv`` that :mod:`mate_cli.data.answer_files` writes: each answer as that
file's field (:func:`prediction_field`: tabs and line breaks become spaces), then
:func:`to_value` with no canonical form. ``"1,484,900"`` is therefore a string, which
matches a gold ``1484900`` only if the gold text itself is ``1,484,900``; ``"1920-10-16"``
and ``"xx-10-24"`` are dates.

**Gold targets** (:func:`target_values`): the evaluator reads each gold answer through its
CoreNLP canonical form, the ``targetCanon`` column of the release's
``tagged/data/<split>.tagged`` (``16 Oct 1920`` -> ``1920-10-16``, ``October 24`` ->
``xxxx-10-24``, ``1,484,900`` -> ``1484900.0``, ``10 years`` -> ``10.0``). The reader
(:class:`~mate_cli.data.wtq.WTQReader`) passes those forms on when the tagged file has
the question; they are then used as given, as the evaluator uses them. Without them
(a release folder without the tagged twin of the question file, as
``random-split-1-dev.tsv``, or a question it lacks), :func:`emulated_canon` stands in: a
small, documented subset of CoreNLP's canonical forms, applied to gold answers only:

- numbers: an optional sign, then ``$``/``£``/``€``/``#``, then digits with or without
  thousands separators and a decimal part, then nothing, ``%``, an ordinal suffix
  (``2nd``) or one space and one lower-case word (``10 years``, ``9 km``;
  ``million``/``billion``/``thousand`` multiply);
- dates: ``16 Oct 1920``, ``October 16, 1920``, ``October 16``, ``16 October``,
  ``October 1920``, ``October`` (month names in full or abbreviated, ``Oct``, ``Sept``;
  ``May`` alone stays a word, as CoreNLP leaves it) and ``10/16/1920`` (month first);
- anything else is read as it is (a year such as ``1920`` is already a number).

Measured against the real ``targetCanon`` of ``tagged/data/pristine-seen-tables.tagged``
(3,537 questions, 3,826 gold answers; the rules were written from that file, so this is
an in-sample figure): the emulated targets give the same value list (same types,
numbers, dates and texts) for 3,532 questions (99.86%; the raw strings read as they are:
3,303, 93.38%). Scoring each question's gold strings, and separately their canonical
forms, as predictions (7,074 checks), 4 verdicts differ between emulated and real
targets (0.06%; raw strings: 233, 3.29%). The 5 questions left are numbers or dates
CoreNLP finds beyond these rules: ``Stage 3``, ``Since 1922``, ``2000 F``, ``12.21 (+0.7)``
and ``New Year's Day`` (``xxxx-01-01``). On ``random-split-1-dev.tsv``
the emulation changes a gold value's type or number for 170 of the 2,831 questions.

Checked against ``evaluator.py`` itself (run under Python 2.7) on 24,759 predictions for
those 3,537 questions (their gold strings, canonical forms, the same with thousands
separators, ``xx-`` dates, lower case and a trailing period, a trailing ``" (x)"``, and
random cells of their tables, written by :mod:`mate_cli.data.answer_files`): with the
tagged canonical forms every verdict is the evaluator's; with the emulated ones, 8 are
not (0.03%).

Faithful to the official script, Python 2 behaviours included: an amount within ``1e-6``
of an integer is stored as ``int(amount)`` (truncated, so ``2.9999999`` is 2); a date
built without its text writes an unknown day as ``-1``; ``\\d`` in the citation rule is
ASCII; Python 3's digit separators (``1_000``) are not numbers. Accuracies are
fractions in [0, 1].
"""

from __future__ import annotations

import math
import re
import unicodedata
from abc import ABC, abstractmethod
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


def _py2_str(amount: int | float) -> str:
    """Python 2's ``unicode(amount)``: a float with 12 significant digits (``1.0`` style when whole)."""
    if isinstance(amount, int):
        return str(amount)
    text = format(amount, ".12g")
    return text if any(c in text for c in ".e") else text + ".0"


class Value(ABC):
    """An answer value; :attr:`normalized` is the text it is compared by."""

    _normalized: str

    @property
    def normalized(self) -> str:
        return self._normalized

    @abstractmethod
    def match(self, other: "Value") -> bool:
        """Whether this (gold) value counts as the same answer as ``other`` (a predicted one)."""


class StringValue(Value):
    """A plain string answer, compared by its normalised text."""

    def __init__(self, content: str) -> None:
        if not isinstance(content, str):
            raise TypeError(f"StringValue needs a str, got {type(content).__name__}")
        self._normalized = normalize(content)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StringValue) and self.normalized == other.normalized

    def __hash__(self) -> int:
        return hash(self.normalized)

    def __repr__(self) -> str:
        return f"StringValue({self.normalized!r})"

    def match(self, other: Value) -> bool:
        return self.normalized == other.normalized


class NumberValue(Value):
    """A number; an amount within ``1e-6`` of an integer is stored as ``int(amount)`` (truncated)."""

    def __init__(self, amount: int | float, original_string: Optional[str] = None) -> None:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError(f"NumberValue needs an int or float, got {type(amount).__name__}")
        if isinstance(amount, float) and (math.isnan(amount) or math.isinf(amount)):
            raise ValueError(f"NumberValue needs a finite amount, got {amount}")
        self._amount: int | float = int(amount) if abs(amount - round(amount)) < NUMBER_TOLERANCE else float(amount)
        self._normalized = normalize(original_string) if original_string else _py2_str(self._amount)

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
        return isinstance(other, NumberValue) and abs(self.amount - other.amount) < NUMBER_TOLERANCE

    @staticmethod
    def parse(text: str) -> Optional[int | float]:
        """``text`` as ``int()``, else ``float()``, reads it (finite), else None."""
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
        else:  # as the official script writes it: an unknown year or month is "xx", a day stays -1
            self._normalized = f"{'xx' if year == -1 else year}-{'xx' if month == -1 else month}-{day}"

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

    ``corenlp_value`` (a gold answer's canonical form, when known; empty = none) is what
    is parsed; ``text`` is what the value is normalised from. A date with only a year is
    the number of that year. A :class:`Value` is returned unchanged.
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


def to_value_list(
    texts: Iterable[str | Value], corenlp_values: Optional[Sequence[Optional[str]]] = None
) -> list[Value]:
    """The distinct values of ``texts`` (the first of equal values kept, in order)."""
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
    """The canonical form CoreNLP would give the gold answer ``text`` (module docstring), or
    None when the rules do not apply (the text is then read as it is).

    Numbers become ``"1484900"``, dates ``"1920-10-16"`` / ``"xxxx-10-24"`` / ``"1920-10-xx"``,
    the forms of the tagged files' ``targetCanon``. For gold answers only: predictions
    are read as the evaluator reads them.
    """
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


def accuracy(pairs: Iterable[tuple[str | Sequence[str], str | Sequence[str]]]) -> float:
    """Share of ``(targets, predicted)`` pairs that are :func:`denotation_correct` (0.0 when empty)."""
    results = [denotation_correct(t, p) for t, p in pairs]
    return sum(results) / len(results) if results else 0.0
