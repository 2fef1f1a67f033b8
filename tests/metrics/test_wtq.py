"""WikiTableQuestions value matching and denotation accuracy on hand-made cases.

The ``OFFICIAL`` verdicts are the official ``evaluator.py``'s (release 1.0.2, run under
Python 2.7 with a tagged file of these gold answers and canonical forms).
"""

import pytest

from mate_cli.metrics.wtq import (
    DateValue,
    NumberValue,
    StringValue,
    check_denotation,
    denotation_correct,
    emulated_canon,
    normalize,
    predicted_values,
    target_values,
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


def test_thousands_separators_make_a_string_unless_canonical():
    # read as the evaluator reads a prediction: float() cannot, so it is a string
    assert isinstance(to_value("1,484,900"), StringValue)
    assert isinstance(predicted_values(["1,484,900"])[0], StringValue)
    # a gold answer is read through its canonical form: a number, compared by its own text too
    (gold,) = target_values(["1,484,900"])
    assert isinstance(gold, NumberValue) and gold.amount == 1484900 and gold.normalized == "1,484,900"
    assert not denotation_correct(["1484900"], ["1,484,900"])  # official: wrong
    assert denotation_correct(["1,484,900"], ["1484900"])
    assert denotation_correct(["1,484,900"], ["1,484,900"])  # same text
    assert not denotation_correct(["1,484,900"], ["1484901"])


def test_number_amount_is_truncated_to_an_integer_when_within_tolerance():
    assert NumberValue(3.0).amount == 3 and isinstance(NumberValue(3.0).amount, int)
    assert NumberValue(3.0000001).amount == 3
    assert NumberValue(2.9999999).amount == 2  # Python 2's int(): truncation, as the evaluator
    assert NumberValue(-2.9999999).amount == -2
    assert isinstance(NumberValue(3.01).amount, float)
    assert NumberValue(3.0).normalized == "3"  # no original string: unicode(amount)
    assert NumberValue(1 / 3).normalized == "0.333333333333"  # Python 2's 12 significant digits
    assert not denotation_correct(["3"], ["2.9999999"])
    assert denotation_correct(["3"], ["3.0000001"])


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


def test_string_versus_number_match_by_text_only():
    assert to_value("3 (approx.)").normalized == "3"
    assert isinstance(to_value("3 (approx.)"), StringValue)
    # the texts "3" and "3" are equal; "3" and "3.0" are not, and a string is no number
    assert denotation_correct(["3 (approx.)"], ["3"])
    assert not denotation_correct(["3 (approx.)"], ["3.0"])
    assert NumberValue(3).match(StringValue("3 (approx.)"))  # no text given: "3", as the string's
    assert not NumberValue(3, "three").match(StringValue("3 (approx.)"))
    assert not StringValue("3 (approx.)").match(NumberValue(3, "3.0"))
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
    assert DateValue(2004, 5, -1).normalized == "2004-5--1"  # the evaluator's text: an unknown day stays -1
    assert DateValue(-1, 5, 12).normalized == "xx-5-12"
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


def test_denotations_of_mixed_answers():
    pairs = [
        (["Café"], ["cafe"]),  # correct
        (["1,000"], ["1000.0"]),  # correct
        (["a", "b"], ["a"]),  # wrong: size
        (["2004-05-12"], ["2004-05-13"]),  # wrong: day
    ]
    assert [denotation_correct(t, p) for t, p in pairs] == [True, True, False, False]


# --- the official evaluator's verdicts ---------------------------------------------

# (gold targetValue, its targetCanon, predicted answers, the official verdict)
OFFICIAL = [
    ("16 Oct 1920", "1920-10-16", ["1920-10-16"], True),
    ("October 24", "xxxx-10-24", ["xx-10-24"], True),
    ("October 24", "xxxx-10-24", ["2015-10-24"], False),  # a known year is not an unknown one
    ("1484900", "1484900.0", ["1,484,900"], False),
    ("1,484,900", "1484900.0", ["1484900"], True),
    ("1,484,900", "1484900.0", ["1,484,900"], True),
    ("3", "3.0", ["2.9999999"], False),
    ("3", "3.0", ["3.0000001"], True),
    ("3", "3.0", ["3[1]"], True),
    ("three", "3.0", ["3 (approx.)"], False),
    ("3 (approx.)", "3 (approx.)", ["3.0"], False),
    ("3 (approx.)", "3 (approx.)", ["3"], True),
    ("1000", "1000.0", ["1_000"], False),
    ("12", "12.0", ["\u0661\u0662"], True),  # Arabic-Indic digits: int() reads them
    ("7", "7.0", ["  7 "], True),
    ("1000", "1000.0", ["1e3"], True),
    ("2004", "2004.0", ["2004-xx-xx"], True),
    ("10 years", "10.0", ["10"], True),
    ("10 years", "10.0", ["10 years"], True),
    ("2nd", "2.0", ["2"], True),
    ("Foo", "Foo", ["Foo (bar)"], True),
    ("Paris", "Paris", ["Paris", "paris."], True),
    ("a|b", "a|b", ["b", "a"], True),
    ("May", "May", ["xx-05-xx"], False),
    ("December 1985", "1985-12-xx", ["1985-12-xx"], True),
    ("December 1985", "1985-12-xx", ["December 1985"], True),
    ("4.0 million", "4000000.0", ["4000000"], True),
    ("0.1%", "0.1", ["0.1"], True),
]


@pytest.mark.parametrize("gold, canon, predicted, verdict", OFFICIAL, ids=[f"{c[0]}:{c[2]}" for c in OFFICIAL])
def test_the_official_verdict_with_the_tagged_canonical_forms(gold, canon, predicted, verdict):
    assert denotation_correct(gold.split("|"), predicted, canon.split("|")) is verdict


@pytest.mark.parametrize(
    "gold, canon, predicted, verdict",
    [c for c in OFFICIAL if c[0] not in ("three",)],
    ids=[f"{c[0]}:{c[2]}" for c in OFFICIAL if c[0] not in ("three",)],
)
def test_the_emulated_canonical_forms_give_the_official_verdict(gold, canon, predicted, verdict):
    """Without a tagged file (every case but "three" -> 3.0, which only CoreNLP knows)."""
    assert denotation_correct(gold.split("|"), predicted) is verdict


def test_the_emulation_is_for_gold_answers_only():
    # "16 Oct 1920" as a prediction is a string: it matches the gold only by text
    assert isinstance(predicted_values(["16 Oct 1920"])[0], StringValue)
    assert not denotation_correct(["1920-10-16"], ["16 Oct 1920"])
    assert denotation_correct(["16 Oct 1920"], ["16 Oct 1920"])
    assert not denotation_correct(["10"], ["10 years"])  # the gold is 10, the prediction a string


def test_emulated_canonical_forms():
    cases = {
        "16 Oct 1920": "1920-10-16",
        "October 16, 1920": "1920-10-16",
        "Sept. 3 1920": "1920-09-03",
        "October 24": "xxxx-10-24",
        "24 October": "xxxx-10-24",
        "December 1985": "1985-12-xx",
        "October": "xxxx-10-xx",
        "Jan": "xxxx-01-xx",
        "11/21/2012": "2012-11-21",
        "1,484,900": "1484900",
        "-12,000.5": "-12000.5",
        "+480,000": "480000",
        "$26,000": "26000",
        "#4": "4",
        "4%": "4",
        "18th": "18",
        "10 years": "10",
        "3.75 miles": "3.75",
        "4.0 million": "4000000.0",
        "1920": "1920",  # already a number as it is
    }
    for text, canon in cases.items():
        assert emulated_canon(text) == canon, text
    for text in (
        "May",
        "Stage 3",
        "2012 Olympics",
        "1st match",
        "1990s",
        "2:47",
        "1959-60",
        "12,3456",
        "Mark 3",
        "13/21/2012",
        "Paris",
        "",
        "3 (approx.)",
        "10 Years",
    ):
        assert emulated_canon(text) is None, text


def test_predictions_are_read_as_the_answer_file_writes_them():
    # a line break in a cell text becomes a space in predictions.tsv, and " (...)" is then dropped
    assert denotation_correct(["South Kynouria"], ["South Kynouria\n(Notia Kynouria)"])
    assert denotation_correct(["a b"], ["a\tb"])
    assert len(predicted_values(["x\ty"])) == 1


def test_tagged_canonical_forms_win_over_the_emulation():
    assert denotation_correct(["Stage 3"], ["3"], ["3.0"])
    assert not denotation_correct(["Stage 3"], ["3"])  # emulated: a string
    assert denotation_correct(["May"], ["may"], ["May"])
    with pytest.raises(ValueError):
        target_values(["a", "b"], ["a"])
