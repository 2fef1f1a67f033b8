"""PointR cell expansion: sentence splitting, TF-IDF choice per table / per cell, baselines."""

from __future__ import annotations

import pytest

from mate_cli.data.expand import expand_table, split_sentences, tfidf_scores
from mate_cli.data.records import Cell, Question, Table
from mate_cli.errors import MateError

QUESTION = Question("q1", "Which river flows through the capital of Zorvania ?", "t1")

PASSAGES = {
    "/wiki/Zorvania": (
        "Zorvania is a small landlocked country . "
        "Its capital , Velmora , lies on the river Quell , which flows through the capital . "
        "Zorvania joined the league in 1990 ."
    ),
    "/wiki/Brask": ("Brask is a mountain town . The town has a famous cheese market . Brask hosts a yearly festival ."),
    "/wiki/Oltan": "Oltan is a river port . Fishing is the main trade .",
}


def _table() -> Table:
    return Table(
        table_id="t1",
        header=[Cell("Place", ["/wiki/Zorvania"]), Cell("Note")],
        rows=[
            [Cell("Zorvania", ["/wiki/Zorvania"]), Cell("country")],
            [Cell("Brask", ["/wiki/Brask"]), Cell("town")],
            [Cell("Oltan", ["/wiki/Oltan"]), Cell("see Zorvania", ["/wiki/Zorvania", "/wiki/Missing"])],
        ],
    )


CAPITAL = "Its capital , Velmora , lies on the river Quell , which flows through the capital ."


# ---------------------------------------------------------------- sentences
def test_split_sentences_tokenized_text():
    assert split_sentences(PASSAGES["/wiki/Zorvania"]) == [
        "Zorvania is a small landlocked country .",
        CAPITAL,
        "Zorvania joined the league in 1990 .",
    ]


def test_split_sentences_keeps_abbreviations_and_initials():
    text = "Dr. Smith met J. R. Tolkien in the U.S. Army. He left! Engine Developments Ltd. , a firm . 1990 was late."
    assert split_sentences(text) == [
        "Dr. Smith met J. R. Tolkien in the U.S. Army.",
        "He left!",
        "Engine Developments Ltd. , a firm .",
        "1990 was late.",
    ]
    assert split_sentences("") == [] and split_sentences("one\n\ntwo") == ["one", "two"]


# ---------------------------------------------------------------- tf-idf
def test_tfidf_scores_prefer_overlap():
    scores = tfidf_scores(QUESTION.question, split_sentences(PASSAGES["/wiki/Zorvania"]))
    assert scores.argmax() == 1 and scores[1] > 0.3
    assert tfidf_scores("the of and", ["the a", "of"]).tolist() == [0.0, 0.0]  # only stop words


def test_table_scope_top1_goes_to_every_linking_cell():
    out = expand_table(QUESTION, _table(), PASSAGES, k=1, scope="table")
    assert len(out) == 3 and all(len(row) == 2 for row in out)
    assert out[0][0] == f"Zorvania ( {CAPITAL} )"
    assert out[2][1] == f"see Zorvania ( {CAPITAL} )"
    assert out[1] == ["Brask", "town"] and out[2][0] == "Oltan" and out[0][1] == "country"


def test_table_scope_keeps_rank_order_within_cell():
    # scores: CAPITAL 0.64 > "Oltan is a river port ." 0.21 > the two other Zorvania
    # sentences, tied at 0.18 (tie -> document order); Brask's share no word: 0
    out = expand_table(QUESTION, _table(), PASSAGES, k=3, scope="table")
    assert out[0][0] == f"Zorvania ( {CAPITAL} Zorvania is a small landlocked country . )"  # rank, not doc order
    assert out[2] == [
        "Oltan ( Oltan is a river port . )",
        f"see Zorvania ( {CAPITAL} Zorvania is a small landlocked country . )",
    ]
    assert out[1] == ["Brask", "town"]
    out = expand_table(QUESTION, _table(), PASSAGES, k=4, scope="table")
    assert out[0][0].endswith("Zorvania is a small landlocked country . Zorvania joined the league in 1990 . )")


def test_cell_scope_top_k_per_cell():
    out = expand_table(QUESTION, _table(), PASSAGES, k=1, scope="cell")
    assert out[0][0] == f"Zorvania ( {CAPITAL} )"
    assert out[2][0] == "Oltan ( Oltan is a river port . )"
    # no overlap with the question: the tie goes to the passage's first sentence
    assert out[1][0] == "Brask ( Brask is a mountain town . )"
    assert out[1][1] == "town"


def test_first_method_takes_leading_sentences():
    out = expand_table(QUESTION, _table(), PASSAGES, k=2, method="first")
    assert out[1][0] == "Brask ( Brask is a mountain town . The town has a famous cheese market . )"
    assert out[0][0] == f"Zorvania ( Zorvania is a small landlocked country . {CAPITAL} )"


def test_expansion_deterministic_and_k0_identity():
    a = expand_table(QUESTION, _table(), PASSAGES, k=2, scope="cell")
    assert a == expand_table(QUESTION, _table(), PASSAGES, k=2, scope="cell")
    assert expand_table(QUESTION, _table(), PASSAGES, k=0) == [[c.text for c in r] for r in _table().rows]
    assert expand_table(QUESTION, _table(), {}, k=5) == [[c.text for c in r] for r in _table().rows]


@pytest.mark.parametrize("kwargs", [{"k": -1}, {"k": 1.5}, {"scope": "row"}, {"method": "bm25"}])
def test_bad_expansion_args(kwargs):
    with pytest.raises(MateError, match="expansion"):
        expand_table(QUESTION, _table(), PASSAGES, **kwargs)


def test_sample_table_scope_adds_at_most_k_sentences(reader, dev_questions):
    for q in dev_questions[:10]:
        table, passages = reader.table(q.table_id), reader.passages(q.table_id)
        out = expand_table(q, table, passages, k=5, scope="table")
        added = set()
        for row, cells in zip(table.rows, out):
            for cell, text in zip(row, cells):
                assert text.startswith(cell.text)
                if text != cell.text:
                    assert cell.links and text.endswith(" )")
                    added.add(text[len(cell.text) :])
        assert 0 < len(added) <= 5 * max(len(c.links) for r in table.rows for c in r)
