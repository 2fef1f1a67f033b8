"""WikiTableQuestions value matching and denotation accuracy on hand-made cases."""

import pytest

from mate_cli.metrics.wtq import (
    DateValue,
    NumberValue,
    StringValue,
    accuracy,
    check_denotation,
    denotation_correct,
    normalize,
    to_value,
    to_value_list,
)


# --- normalize: one test per rule ---------------------------------------------------


def test_normalize_strips_accents_and_folds_compatibility_characters():
    assert normalize("Café Müller") == "cafe muller"
    assert normalize("São Tomé") == "sao tome"
    assert normalize("ﬁnal") == "final"  # NFKD ligature
    assert normalize("１２") == "12"  # full-width digits


def test_normalize_lower_cases():
    assert normalize("New YORK") == "new york"


def test_normalize_unifies_quotes_and_dashes():
    assert normalize("it’s") == "it's"
    assert normalize("it‘s") == "it's"
    assert normalize("it`s") == "it's"
    assert normalize("“a” b") == '"a" b'
    for dash in "‐‑‒–—−":
        assert normalize(f"1990{dash}91") == "1990-91"


def test_normalize_removes_one_outer_pair_of_double_quotes():
    assert normalize('"Thriller"') == "thriller"
    assert normalize("“Thriller”") == "thriller"
    assert normalize('"a" and "b"') == '"a" and "b"'  # inner quote: kept
    assert normalize("'single'") == "'single'"  # single quotes are not removed


def test_normalize_outer_quotes_exact_cases():
    # '""x""': the inner text contains '"', so the outer pair is not removed
    assert normalize('""x""') == '""x""'
    # quotes removed, then the freshly exposed trailing details go too (the loop)
    assert normalize('"Paris (France)"') == "paris"


def test_normalize_removes_one_trailing_period():
    assert normalize("Jr.") == "jr"
    assert normalize("etc..") == "etc."
    assert normalize("a . ") == "a"
    assert normalize("3.5") == "3.5"


def test_normalize_collapses_and_strips_whitespace():
    assert normalize("  New \t York\n City ") == "new york city"


def test_normalize_removes_trailing_parenthesised_details():
    assert normalize("Paris (France)") == "paris"
    assert normalize("Paris (France) (capital)") == "paris"
    assert normalize("Paris(France)") == "paris(france)"  # needs the space before "("
    assert normalize("(France)") == "(france)"  # only details: kept
    assert normalize("Paris (France) city") == "paris (france) city"  # not at the end


def test_normalize_removes_trailing_citations_and_footnote_marks():
    assert normalize("Smith[1]") == "smith"
    assert normalize("Smith [note 2][a]") == "smith"
    assert normalize("Smith*") == "smith"
    assert normalize("Smith†‡") == "smith"
    assert normalize("C++") == "c"  # faithful: "+" is a footnote mark at the end
    assert normalize("[1]") == ""  # a bare numeric citation goes entirely
    assert normalize("[a]") == "[a]"  # a non-numeric bracket at the start stays
    assert normalize("Smith (footballer)[3]") == "smith"  # citations then details


# --- values ------------------------------------------------------------------------


def test_to_value_types():
    assert isinstance(to_value("12"), NumberValue) and to_value("12").amount == 12
    assert isinstance(to_value("2.5"), NumberValue) and to_value("2.5").amount == 2.5
    assert isinstance(to_value("2004-05-12"), DateValue) and to_value("2004-05-12").ymd == (2004, 5, 12)
    assert isinstance(to_value("Paris"), StringValue)
    assert isinstance(to_value("45%"), StringValue)
    assert isinstance(to_value("nan"), StringValue) and isinstance(to_value("inf"), StringValue)
    assert isinstance(to_value("1_000"), StringValue)  # no Python-3 digit separators
    value = NumberValue(7)
    assert to_value(value) is value


def test_thousands_separators():
    assert to_value("1,484,900").amount == 1484900
    assert to_value("-12,000.5").amount == -12000.5
    assert isinstance(to_value("1,48"), StringValue)  # not a thousands grouping
    assert isinstance(to_value("12,3456"), StringValue)
    assert denotation_correct(["1,484,900"], ["1484900"])
    assert denotation_correct(["1484900"], ["1,484,900"])
    assert not denotation_correct(["1,484,900"], ["1484901"])


def test_number_amount_is_integer_when_within_tolerance():
    assert NumberValue(3.0).amount == 3 and isinstance(NumberValue(3.0).amount, int)
    assert isinstance(NumberValue(3.0000001).amount, int)
    assert isinstance(NumberValue(3.01).amount, float)
    assert NumberValue(3.0).normalized == "3"  # no original string: str(amount)


def test_number_tolerance():
    assert NumberValue(0.5).match(NumberValue(0.5000005))
    assert not NumberValue(0.5).match(NumberValue(0.500002))
    assert denotation_correct(["0.3333333"], ["0.33333333"])
    assert not denotation_correct(["0.333"], ["0.334"])


def test_aggregation_predictions_match_integer_targets():
    assert denotation_correct(["3"], ["3.0"])  # SUM
    assert denotation_correct(["3"], [str(1.0 + 2.0)])
    assert denotation_correct(["2"], ["2"])  # COUNT
    assert denotation_correct(["2.5"], ["2.50"])  # AVERAGE
    assert not denotation_correct(["3"], ["4.0"])


def test_string_versus_number():
    # a number matches a string whose normalised text parses as that number, both ways
    assert to_value("3 (approx.)").normalized == "3"
    assert isinstance(to_value("3 (approx.)"), StringValue)
    assert denotation_correct(["3 (approx.)"], ["3.0"])
    assert denotation_correct(["3.0"], ["3 (approx.)"])
    assert NumberValue(3).match(StringValue("3 (approx.)"))
    assert StringValue("3 (approx.)").match(NumberValue(3))
    # a number never matches a word, and a string never matches a different number
    assert not denotation_correct(["three"], ["3"])
    assert not denotation_correct(["3 (approx.)"], ["4"])
    # same normalised text matches whatever the types
    assert to_value("1990-91").match(to_value("1990–91"))


def test_dates_full_and_partial():
    assert DateValue.parse("2004-05-12") == (2004, 5, 12)
    assert DateValue.parse("xx-05-12") == (-1, 5, 12)
    assert DateValue.parse("XXXX-05-xx") == (-1, 5, -1)
    assert DateValue.parse("2004-xx-xx") == (2004, -1, -1)
    assert DateValue.parse("xx-xx-xx") is None
    assert DateValue.parse("2004-13-01") is None
    assert DateValue.parse("2004-05") is None
    # a year-only date is a number
    year = to_value("2004-xx-xx")
    assert isinstance(year, NumberValue) and year.amount == 2004
    assert denotation_correct(["2004"], ["2004-xx-xx"])
    # partial dates match by (year, month, day)
    assert to_value("xx-05-12").match(to_value("xx-5-12"))
    assert not to_value("xx-05-12").match(to_value("2004-05-12"))
    assert to_value("2004-05-xx").match(to_value("2004-5-xx"))
    assert not to_value("2004-05-xx").match(to_value("2004-06-xx"))
    assert DateValue(2004, 5, -1).normalized == "2004-5-xx"
    with pytest.raises(ValueError):
        DateValue(-1, -1, -1)


def test_to_value_list_removes_duplicates_in_order():
    values = to_value_list(["3", "3.0", "Paris", "paris.", "2004-05-12"])
    assert values == [NumberValue(3), StringValue("Paris"), DateValue(2004, 5, 12)]
    corenlp = to_value_list(["one million"], ["1000000"])
    assert corenlp == [NumberValue(1000000)] and corenlp[0].normalized == "one million"
    with pytest.raises(ValueError):
        to_value_list(["a", "b"], ["1"])


# --- denotations -------------------------------------------------------------------


def test_list_answers_are_sets():
    assert denotation_correct(["Paris", "London"], ["london", "Paris"])
    assert denotation_correct(["Paris", "London"], ["London", "Paris", "paris"])  # repeat removed
    assert not denotation_correct(["Paris", "London"], ["Paris"])  # fewer
    assert not denotation_correct(["Paris"], ["Paris", "London"])  # more
    assert not denotation_correct(["Paris", "London"], ["Paris", "Berlin"])
    assert denotation_correct(["Paris"], "paris")  # a single str is a one-item list
    assert denotation_correct([], [])
    assert not denotation_correct(["Paris"], [])


def test_check_denotation_counts_sizes_before_matching():
    # sizes equal, every target matches some prediction (not necessarily one-to-one)
    assert check_denotation([NumberValue(1), NumberValue(1.0000001)], [NumberValue(1), StringValue("x")])
    assert not check_denotation([NumberValue(1)], [NumberValue(1), NumberValue(2)])


def test_accuracy():
    pairs = [
        (["Café"], ["cafe"]),  # correct
        (["1,000"], ["1000.0"]),  # correct
        (["a", "b"], ["a"]),  # wrong: size
        (["2004-05-12"], ["2004-05-13"]),  # wrong: day
    ]
    assert accuracy(pairs) == 0.5
    assert accuracy([]) == 0.0
