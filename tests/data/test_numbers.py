"""TAPAS-style numbers and dates on hand-made cases: spans, columns, ranks, relations."""

from __future__ import annotations

import pytest

from mate_cli.data.numbers import (
    Date,
    Relation,
    TableNumbers,
    ValueSpan,
    column_values,
    normalize_text,
    parse_date,
    parse_number,
    parse_values,
    sort_key,
    text_values,
)
from tests.data.readouts import column_ranks


def test_parse_number_reads_one_word():
    assert [parse_number(t) for t in ["1,234", "3rd", "21st", "+0.278", "-2", "1e3", "7."]] == [
        1234.0,
        3.0,
        21.0,
        0.278,
        -2.0,
        1000.0,
        7.0,
    ]
    assert [parse_number(t) for t in ["x", "nan", "inf", "th", "1:23"]] == [None] * 5


def test_parse_date_formats_and_year_range():
    assert parse_date("may 3, 2001") == Date(2001, 5, 3)
    assert parse_date("2 march 1999") == Date(1999, 3, 2)
    assert parse_date("june 2001") == Date(2001, 6, None) and parse_date("jun 2001") == Date(2001, 6, None)
    assert parse_date("2015-05-01") == Date(2015, 5, 1) and parse_date("2015-05") == Date(2015, 5, None)
    assert parse_date("05-03-2001") == Date(2001, 5, 3) and parse_date("3.5.2001") == Date(2001, 5, 3)
    assert parse_date("1990s") == Date(1990) and parse_date("may") == Date(None, 5, None)
    assert parse_date("monday, may 3") == Date(None, 5, 3)
    assert parse_date("2017") is None and parse_date("1650") is None  # years 1700..2016 only
    assert parse_date("may 3 , 2001") is None  # a space before the comma is no format
    assert parse_date("february 29") is None  # no year: strptime's 1900 is not a leap year
    assert parse_date("2015-13-01") is None and parse_date("foo 5") is None


@pytest.mark.parametrize(
    "text, spans",
    [
        ("1,234.5 Apples", [ValueSpan(0, 7, (1234.5,))]),
        ("abc12", [ValueSpan(3, 5, (12.0,))]),  # inside a word
        ("2001", [ValueSpan(0, 4, (2001.0, Date(2001)))]),  # a year is a number and a date
        ("1990–1995", [ValueSpan(0, 4, (1990.0, Date(1990))), ValueSpan(5, 9, (1995.0, Date(1995)))]),
        ("May 3, 2001", [ValueSpan(0, 11, (Date(2001, 5, 3),))]),  # the longest span wins
        ("the 3rd of May", [ValueSpan(4, 7, (3.0,)), ValueSpan(11, 14, (Date(None, 5, None),))]),
        ("-5 and  +3", [ValueSpan(0, 2, (-5.0,)), ValueSpan(6, 9, (3.0,))]),  # sign after a space, which joins
        ("one of Twelve", [ValueSpan(0, 3, (1.0,)), ValueSpan(7, 13, (12.0,))]),
        ("february 29", [ValueSpan(0, 8, (Date(None, 2, None),)), ValueSpan(9, 11, (29.0,))]),
        ("1990s", [ValueSpan(0, 5, (Date(1990),))]),
        ("1650", [ValueSpan(0, 4, (1650.0,))]),
        ("n/a", []),
    ],
)
def test_parse_values_longest_spans(text, spans):
    assert list(parse_values(text)) == spans
    assert text_values(text) == [v for span in spans for v in span.values]
    assert normalize_text("  A\tB  ") == "a b"


def test_column_values_consolidate_on_the_majority_kind():
    assert column_values(["1", "2", "3", "x"]) == {0: 1.0, 1: 2.0, 2: 3.0}  # 75% numbers
    assert column_values(["1", "2", "x", "y"]) == {}  # 50% < 70%
    assert column_values(["", "", ""]) == {}
    # years are numbers and dates: on the tie dates win
    assert column_values(["2001", "1999"]) == {0: Date(2001), 1: Date(1999)}
    # 2 dates and 1 number in 3 cells: 67% < 70%, nothing
    assert column_values(["may 3, 2001", "5", "june 2002"]) == {}
    assert column_values(["10 to 20", "5 (est.)", "7"]) == {0: 10.0, 1: 5.0, 2: 7.0}  # the first number


def test_sort_key_uses_common_date_fields():
    assert sort_key([1.0, 2.0])(3.0) == 3.0
    key = sort_key([Date(2001, 5, 3), Date(2007, 8, None)])
    assert key(Date(2001, 5, 3)) == (2001, 5)
    assert sort_key([Date(2001), Date(None, 5, None)]) is None  # nothing in common
    assert sort_key([1.0, Date(2001)]) is None


def test_column_ranks_tapas_semantics():
    # The same expectations as this project's former all-cells-must-parse ranks, for
    # different reasons noted per column.
    rows = [
        ["1,000", "May 3 , 2001", "apple", "10", "-"],
        ["$5", "2 March 1999", "7", "5", "3"],
        ["20 %", "May 3 , 2001", "pear", "10", "1"],
        ["", "June 2001", "9", "7", "2"],
    ]
    ranks, inverse = column_ranks(rows)
    col = lambda m, c: [row[c] for row in m]  # noqa: E731
    assert col(ranks, 0) == [3, 1, 2, 0] and col(inverse, 0) == [1, 3, 2, 0]  # 3 of 4 cells: 75% >= 70%
    # 'may 3' (no year: ' , 2001' is no format), 1999-03-02, 'may 3', 2001-06: only the month is common
    assert col(ranks, 1) == [2, 1, 2, 3] and col(inverse, 1) == [2, 3, 2, 1]
    assert col(ranks, 2) == [0, 0, 0, 0]  # 2 numbers in 4 cells: 50% < 70%
    assert col(ranks, 3) == [3, 1, 3, 2] and col(inverse, 3) == [1, 3, 1, 2]  # dense
    assert col(ranks, 4) == [0, 3, 1, 2]  # '-' holds no number; 3 of 4 cells


def test_ranks_where_tapas_differs_from_all_cells_parse():
    rows = [["1st Battalion", "1990–1995"], ["2nd Battalion", "1980–85"], ["10th Battalion", "n/a"], ["HQ", "2000"]]
    ranks, inverse = column_ranks(rows)
    assert [r[0] for r in ranks] == [1, 2, 3, 0]  # the first number of each cell; 'HQ' none (75%)
    assert [r[1] for r in ranks] == [2, 1, 0, 3] and [r[1] for r in inverse] == [2, 3, 0, 1]  # years as dates


def test_relations_bits_per_cell():
    numbers = TableNumbers.of([["1999", "3"], ["2000", "5"], ["2001", "7"]])
    bits = numbers.relations("How many after 2000 with more than five?")
    # 2000 is a number and a date: the date meets the year column, the number the other;
    # 'five' is 5, compared with the number column only.
    assert bits == {
        (0, 0): Relation.GT,
        (1, 0): Relation.EQ,
        (2, 0): Relation.LT,
        (0, 1): Relation.GT,
        (1, 1): Relation.GT | Relation.EQ,
        (2, 1): Relation.GT | Relation.LT,
    }
    assert [int(b) for b in (Relation.EQ, Relation.LT, Relation.GT)] == [1, 2, 4]
    assert numbers.relations("which one?") == {(r, 1): Relation.LT for r in range(3)}  # 1 < every cell
    assert numbers.relations("which?") == {}
    assert numbers.ranks == ({0: (1, 3), 1: (2, 2), 2: (3, 1)}, {0: (1, 3), 1: (2, 2), 2: (3, 1)})
