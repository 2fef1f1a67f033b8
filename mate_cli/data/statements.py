"""Synthetic statements about tables, for intermediate pre-training: the synthetic half of the counterfactual +
synthetic data (CS) of Eisenschlos et al. (2020), which MATE's Table 4 trains on before SQA, WikiTQ and TabFact.

A statement compares an expression over a table with a constant::

    <select> [when <column> <comparator> <value> [and ...]] <comparator> <constant>
    "the total points when team is ferrari is 12"      "driver when laps is greater than 70 is alesi, hill"

``<select>`` is a column's cells (:data:`SELECTS` ``none``: their texts), the first, last, lowest or greatest of
them, their total, average or range, or the count of the rows the conditions keep; a condition keeps the rows whose
cell in a column is a value of that column (``is``), or a number above or below one (``is greater than``, ``is less
than``); the last comparator is ``is`` (the same set of texts) or a strict order between numbers. A statement is
undefined (None) where the conditions keep no row, an aggregate has fewer than two values, or an order or a number
meets a cell that holds none; undefined statements are never written.

Each statement is written twice (:func:`statement_pairs`): on its table, and on a copy of the table with one of the
columns the statement reads shuffled, chosen so that the copy gives the other verdict. So the statement's words alone
never tell its label, and the labels are balanced exactly: a model must read the table, and which row holds what.

A first stage asks less (:func:`absent_value_twins`, not in TAPAS's release): each entailed statement that names cells
of the table comes with a refuted twin on the same table that names instead a value the table lacks, drawn from a
column of the same name in another table. Whether the value is there at all then tells the label.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

from mate_cli.data.numbers import normalize_text, parse_number

#: what a statement's expression selects: the cells, one of them, a number made of them, or how many rows
SELECTS = ("none", "first", "last", "lowest", "greatest", "total", "average", "range", "count")
#: the selects that need every selected cell to hold a number
NUMERIC_SELECTS = ("lowest", "greatest", "total", "average", "range")
#: the selects whose value is cells of the table, which an absent value can refute (:func:`absent_value_twins`)
CELL_SELECTS = ("none", "first", "last", "lowest", "greatest")
#: comparators and their words
COMPARATORS = {"is": "is", "greater": "is greater than", "less": "is less than"}
#: how often each select is drawn: the count in a fifth of the expressions, the others alike (as TAPAS's release)
SELECT_WEIGHTS = {name: (0.2 if name == "count" else 0.1) for name in SELECTS}
#: at most this many conditions in one expression (TAPAS's release)
MAX_CONDITIONS = 2
#: tries of a random choice that can come out undefined, before a table gets fewer statements
ATTEMPTS = 100
#: at most this many texts in a constant, and words in a statement (TabFact's statements are cut at 64 word pieces:
#: a cut statement would say something else)
MAX_CONSTANT = 4
MAX_WORDS = 32


@dataclass(frozen=True)
class Grammar:
    """Which statements are drawn: one of ``selects`` (weighted as in :data:`SELECT_WEIGHTS`, kept in the order of
    :data:`SELECTS` and once each, so a seed draws the same however they are listed) with at most ``max_conditions``
    conditions, and, where ``orders``, conditions and comparisons that are orders between numbers besides ``is``. The
    default is the whole grammar; less of it makes easier statements (``selects=("none", "first", "last")``,
    ``max_conditions=1``, ``orders=False``: which cell is in the row that holds another)."""

    selects: tuple[str, ...] = SELECTS
    max_conditions: int = MAX_CONDITIONS
    orders: bool = True

    def __post_init__(self):
        if not self.selects or set(self.selects) - set(SELECTS) or self.max_conditions < 0:
            raise ValueError(f"a grammar draws some of {SELECTS} with 0 or more conditions, not {self}")
        object.__setattr__(self, "selects", tuple(name for name in SELECTS if name in self.selects))

    @property
    def weights(self) -> list[float]:
        return [SELECT_WEIGHTS[name] for name in self.selects]

    @property
    def comparators(self) -> list[str]:
        return list(COMPARATORS) if self.orders else ["is"]


@dataclass(frozen=True)
class Grid:
    """A table as texts: ``header`` and ``rows`` (data rows, each as wide as the header)."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def column(self, index: int) -> list[str]:
        return [row[index] for row in self.rows]

    def with_column(self, index: int, cells: list[str]) -> "Grid":
        rows = tuple(row[:index] + (cell,) + row[index + 1 :] for row, cell in zip(self.rows, cells))
        return Grid(self.header, rows)


@dataclass(frozen=True)
class Condition:
    column: int
    comparator: str
    value: str

    def keeps(self, cell: str) -> Optional[bool]:
        if self.comparator == "is":
            return same((cell,), (self.value,))
        left, right = parse_number(cell), parse_number(self.value)
        if left is None or right is None:
            return None
        return left > right if self.comparator == "greater" else left < right


@dataclass(frozen=True)
class Expression:
    select: str
    column: int
    conditions: tuple[Condition, ...] = ()

    def columns(self) -> tuple[int, ...]:
        """The columns whose cells its value depends on."""
        own = () if self.select == "count" else (self.column,)
        return tuple(dict.fromkeys(own + tuple(c.column for c in self.conditions)))


@dataclass(frozen=True)
class Statement:
    expression: Expression
    comparator: str
    constant: tuple[str, ...]  #: as the statement writes it


@dataclass(frozen=True)
class Value:
    """An expression's value: its texts as a statement writes them (sorted), and the exact numbers they stand for
    (before a total, average or range is written to two decimals); ``numbers`` None where a text holds none."""

    texts: tuple[str, ...]
    numbers: Optional[tuple[float, ...]]


def format_number(value: float) -> str:
    """A whole number without decimals, else two (``12``, ``2.50``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


@lru_cache(maxsize=1 << 16)
def same(left: tuple[str, ...], right: tuple[str, ...]) -> bool:
    """Whether two written sets of texts say the same: as numbers where every text is one (``10`` is ``10.0`` and
    ``1,000`` is ``1000``, to the two decimals a statement writes), else as texts (case and spacing aside). Cached:
    drawing a table's statements compares its cells with the same few values many times."""
    numbers = [parse_number(text) for text in (*left, *right)]
    if None not in numbers:
        written = [format_number(n) for n in numbers]
        return set(written[: len(left)]) == set(written[len(left) :])
    return {normalize_text(t) for t in left} == {normalize_text(t) for t in right}


def usable_columns(grid: Grid) -> list[int]:
    """The columns a statement can name: those whose name is neither empty nor another column's too."""
    names = [normalize_text(name) for name in grid.header]
    return [c for c, name in enumerate(names) if name and names.count(name) == 1]


def kept_rows(expression: Expression, grid: Grid) -> Optional[list[int]]:
    """The rows every condition keeps; None where a condition cannot be decided on some row."""
    kept = []
    for r, row in enumerate(grid.rows):
        verdicts = [condition.keeps(row[condition.column]) for condition in expression.conditions]
        if None in verdicts:
            return None
        if all(verdicts):
            kept.append(r)
    return kept


def _cells(texts: list[str]) -> Value:
    written = tuple(sorted({normalize_text(text) for text in texts}))
    numbers = tuple(parse_number(text) for text in written)
    return Value(written, None if None in numbers else numbers)


def _number(value: float) -> Value:
    return Value((format_number(value),), (value,))


def evaluate(expression: Expression, grid: Grid) -> Optional[Value]:
    """The expression's value on ``grid`` (one text for every select but ``none``); None: undefined."""
    rows = kept_rows(expression, grid)
    if not rows:
        return None
    if expression.select == "count":
        return _number(len(rows))
    cells = [grid.rows[r][expression.column] for r in rows]
    if expression.select == "none":
        return _cells(cells)
    if len(cells) < 2:
        return None
    if expression.select in ("first", "last"):
        return _cells([cells[0] if expression.select == "first" else cells[-1]])
    numbers = [parse_number(cell) for cell in cells]
    if None in numbers:
        return None
    if expression.select == "lowest":
        return _number(min(numbers))
    if expression.select == "greatest":
        return _number(max(numbers))
    if expression.select == "total":
        return _number(math.fsum(numbers))
    if expression.select == "average":
        return _number(math.fsum(numbers) / len(numbers))
    return _number(max(numbers) - min(numbers))


def holds(statement: Statement, grid: Grid) -> Optional[bool]:
    """The statement's verdict on ``grid``; None: undefined there. ``is``: :func:`same`; an order compares the
    expression's exact numbers with the constant's as written, every one of them ("greater than 3, 4": than both)."""
    value = evaluate(statement.expression, grid)
    if value is None:
        return None
    if statement.comparator == "is":
        return same(value.texts, statement.constant)
    right = [parse_number(text) for text in statement.constant]
    if value.numbers is None or not right or None in right:
        return None
    left = value.numbers
    return min(left) > max(right) if statement.comparator == "greater" else max(left) < min(right)


def verbalize(statement: Statement, header: tuple[str, ...]) -> str:
    expression = statement.expression
    name = normalize_text(header[expression.column])
    select = {"none": name, "count": "the count", "total": f"the total {name}", "range": f"the range of {name}"}.get(
        expression.select, f"the {expression.select} {name}"
    )
    where = " and ".join(
        f"{normalize_text(header[c.column])} {COMPARATORS[c.comparator]} {normalize_text(c.value)}"
        for c in expression.conditions
    )
    condition = f" when {where}" if where else ""
    return f"{select}{condition} {COMPARATORS[statement.comparator]} {', '.join(statement.constant)}"


def _conditioned(rng: random.Random, expression: Expression, grid: Grid, grammar: Grammar) -> Expression:
    """``expression`` with conditions on the usable columns, in a random order, while it stays defined: after each
    column tried, the next one with probability 1/2."""
    columns = usable_columns(grid)
    rng.shuffle(columns)
    for column in columns:
        if len(expression.conditions) == grammar.max_conditions:
            break
        values = [value for value in dict.fromkeys(grid.column(column)) if value]  # "is <nothing>" says nothing
        choices = [(value, comparator) for value in values for comparator in grammar.comparators]
        rng.shuffle(choices)
        for value, comparator in choices[:ATTEMPTS]:
            longer = Expression(
                expression.select, expression.column, (*expression.conditions, Condition(column, comparator, value))
            )
            if evaluate(longer, grid) is not None:
                expression = longer
                break
        if rng.random() < 0.5:
            break
    return expression


def sample_expression(
    rng: random.Random, grid: Grid, like: Optional[Expression] = None, grammar: Grammar = Grammar()
) -> Optional[tuple[Expression, Value]]:
    """A random defined expression of ``grammar`` and its value, or None after :data:`ATTEMPTS` undefined ones;
    ``like``: one of the same select and column (its conditions drawn afresh)."""
    if not (columns := usable_columns(grid)):
        return None
    for _ in range(ATTEMPTS):
        select = like.select if like else rng.choices(grammar.selects, grammar.weights)[0]
        column = like.column if like else rng.choice(columns)
        expression = _conditioned(rng, Expression(select, column), grid, grammar)
        if (value := evaluate(expression, grid)) is not None:
            return expression, value
    return None


def sample_statement(rng: random.Random, grid: Grid, grammar: Grammar = Grammar()) -> Optional[Statement]:
    """A random statement defined on ``grid``: its constant is the expression's own value (half the time) or the value
    of another expression of the same select and column; ``is``, or (where ``grammar.orders``) an order where both sides
    are numbers."""
    for _ in range(ATTEMPTS):
        if (drawn := sample_expression(rng, grid, grammar=grammar)) is None:
            return None
        expression, value = drawn
        constant = value.texts
        if rng.random() < 0.5 and (other := sample_expression(rng, grid, expression, grammar)) is not None:
            constant = other[1].texts
        numeric = value.numbers is not None and all(parse_number(text) is not None for text in constant)
        comparator = rng.choice(grammar.comparators) if numeric else "is"
        statement = Statement(expression, comparator, constant)
        if 0 < len(constant) <= MAX_CONSTANT and "" not in constant and holds(statement, grid) is not None:
            return statement
    return None


def opposite(rng: random.Random, statement: Statement, grid: Grid) -> Optional[Grid]:
    """A copy of ``grid`` with one of the statement's columns shuffled on which it is defined and its verdict is the
    other one; None if :data:`ATTEMPTS` shuffles find none."""
    verdict = holds(statement, grid)
    if not (columns := statement.expression.columns()):  # "the count is 12": no shuffle changes it
        return None
    for _ in range(ATTEMPTS):
        column = rng.choice(columns)
        cells = grid.column(column)
        rng.shuffle(cells)
        shuffled = grid.with_column(column, cells)
        if (other := holds(statement, shuffled)) is not None and other != verdict:
            return shuffled
    return None


@dataclass(frozen=True)
class Pair:
    """One statement, in words (``text``), with its verdict on the table it was drawn on and the copy of that table
    (``flipped``) where it has the other one."""

    statement: Statement
    text: str
    verdict: bool
    flipped: Grid


def statement_pairs(grid: Grid, count: int, rng: random.Random, grammar: Grammar = Grammar()) -> list[Pair]:
    """Up to ``count`` pairs of distinct statements of ``grammar`` about ``grid``, each with the copy of ``grid`` that
    flips it."""
    pairs: list[Pair] = []
    seen: set[str] = set()
    for _ in range(count * 4):
        if len(pairs) == count:
            break
        if (statement := sample_statement(rng, grid, grammar)) is None:
            break
        text = verbalize(statement, grid.header)
        if text in seen or len(text.split()) > MAX_WORDS or (flipped := opposite(rng, statement, grid)) is None:
            continue
        seen.add(text)
        pairs.append(Pair(statement, text, bool(holds(statement, grid)), flipped))
    return pairs


@dataclass(frozen=True)
class Twin:
    """An entailed statement about a table (``text``) and its twin ``refuted``, which names a value the table lacks."""

    statement: Statement
    text: str
    refuted: str


def absent_value_twins(
    grid: Grid, count: int, rng: random.Random, grammar: Grammar, values: dict[str, list[str]]
) -> list[Twin]:
    """Up to ``count`` distinct entailed statements of ``grammar`` about ``grid`` that say a cell-valued select (of
    :data:`CELL_SELECTS`) ``is`` its constant, each with its :func:`absent_refutation`; a statement without one is not
    written. ``values``: column name -> the texts of columns of that name in other tables. The statements drawn depend
    on ``rng`` and ``grid`` alone; the refuted values, and so which of them are written, on ``values`` too."""
    twins: list[Twin] = []
    seen: set[str] = set()
    if not (selects := tuple(name for name in grammar.selects if name in CELL_SELECTS)):
        return twins
    grammar = Grammar(selects, grammar.max_conditions, grammar.orders)  # the others' draws would all be dropped
    for _ in range(count * 8):
        if len(twins) == count:
            break
        if (statement := sample_statement(rng, grid, grammar)) is None:
            break
        picker = random.Random(rng.random())  # one draw each: the next statements do not depend on ``values``
        text = verbalize(statement, grid.header)
        if statement.comparator != "is" or not holds(statement, grid) or text in seen or len(text.split()) > MAX_WORDS:
            continue
        seen.add(text)
        if (refuted := absent_refutation(picker, statement, grid, values)) is not None:
            twins.append(Twin(statement, text, refuted))
    return twins


def absent_refutation(
    rng: random.Random, statement: Statement, grid: Grid, values: dict[str, list[str]]
) -> Optional[str]:
    """``statement`` in words with its constant replaced by a text of ``values`` under its column's name that no cell
    of ``grid`` equals, and which refutes it read as one text or as the list its commas make (a number where the select
    is the lowest or greatest); None if none of :data:`ATTEMPTS` drawn texts does."""
    expression = statement.expression
    pool = values.get(normalize_text(grid.header[expression.column]), [])
    drawn = rng.sample(pool, min(ATTEMPTS, len(pool)))
    if (true := evaluate(expression, grid)) is None:  # then no reading is refuted
        return None
    in_a_cell = cell_matcher(grid)
    for value in drawn:
        if expression.select in ("lowest", "greatest") and parse_number(value) is None:
            continue
        readings = [(value,), tuple(part.strip() for part in value.split(","))]
        # holds() of the "is" statement with this reading, on the expression's value computed once above
        if any(same(true.texts, reading) for reading in readings) or in_a_cell(value):
            continue
        words = verbalize(Statement(expression, "is", (value,)), grid.header)
        if len(words.split()) <= MAX_WORDS:
            return words
    return None


def cell_matcher(grid: Grid) -> Callable[[str], bool]:
    """Whether a text is :func:`same` as one of ``grid``'s non-empty cells, from sets built once (a table's cells are
    compared with up to :data:`ATTEMPTS` texts a statement)."""
    numbers, numeric_texts, texts = set(), set(), set()
    for cell in (cell for row in grid.rows for cell in row if cell):
        if (number := parse_number(cell)) is None:
            texts.add(normalize_text(cell))
        else:
            numbers.add(format_number(number))
            numeric_texts.add(normalize_text(cell))

    def matches(text: str) -> bool:
        if (number := parse_number(text)) is None:  # as texts, against every cell
            return normalize_text(text) in texts or normalize_text(text) in numeric_texts
        return format_number(number) in numbers or normalize_text(text) in texts

    return matches


def column_values(grids: list[Grid]) -> dict[str, list[str]]:
    """Column name -> the distinct non-empty texts of every column of that name in ``grids`` (sorted: a corpus gives
    the same lists however its tables are ordered); names a statement can use only (:func:`usable_columns`)."""
    values: dict[str, set[str]] = {}
    for grid in grids:
        for column in usable_columns(grid):
            texts = {normalize_text(cell) for cell in grid.column(column)} - {""}
            values.setdefault(normalize_text(grid.header[column]), set()).update(texts)
    return {name: sorted(texts) for name, texts in values.items() if texts}
