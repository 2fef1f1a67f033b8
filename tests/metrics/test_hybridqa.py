"""Official HybridQA EM/F1 semantics on hand-computed cases and the bundled reference file."""

import json
import math

import pytest

from mate_cli.metrics.hybridqa import (
    evaluate_predictions,
    exact_match,
    f1_score,
    flat_metrics,
    normalize_answer,
    subset_reference,
)


def test_normalisation_lowercases_strips_punctuation_and_articles():
    assert normalize_answer("The  Eiffel-Tower, (Paris)!") == "eiffeltower paris"
    assert normalize_answer("An apple a day") == "apple day"
    # articles only as whole words; punctuation is removed before articles are
    assert normalize_answer("Theatre of Anatolia") == "theatre of anatolia"
    assert normalize_answer("the.") == ""
    assert normalize_answer("A.") == ""


def test_exact_match_and_f1_hand_computed():
    assert exact_match("The Beatles", "beatles!") == 1.0
    assert exact_match("4th Defense Battalion", "the 4th defense battalion.") == 1.0
    assert exact_match("26th", "26") == 0.0
    # gold [eiffel, tower] vs pred [eiffel, tower, in, paris]: P = 2/4, R = 2/2 -> F1 = 2/3
    assert f1_score("The Eiffel Tower", "eiffel tower, in Paris") == pytest.approx(2 / 3)
    # repeated tokens count once per occurrence: gold [new, york, new] pred [new, new, new, york]
    # common = {new: 2, york: 1} = 3 -> P = 3/4, R = 3/3 -> F1 = 6/7
    assert f1_score("New York new", "new new new York") == pytest.approx(6 / 7)
    assert f1_score("Paris", "London") == 0.0
    # an answer that normalises to nothing: F1 is 1 only against an empty prediction
    assert f1_score("The", "") == 1.0 and f1_score("The", "a") == 1.0 and f1_score("The", "x") == 0.0
    # several gold answers: the best one counts
    assert exact_match(["second round", "second"], "Second") == 1.0
    assert f1_score(["arctic", "arctic climate"], "Arctic climate") == 1.0


def test_evaluate_predictions_hand_computed_groups_in_percent():
    reference = {
        "reference": {"t1": "Ferrari", "t2": "1991", "p1": "a British driver", "p2": "Tokyo, Japan", "m1": "12"},
        "table": ["t1", "t2"],
        "passage": ["p1", "p2"],
    }
    predictions = [
        {"question_id": "t1", "pred": "ferrari."},  # EM 1, F1 1
        {"question_id": "t2", "pred": "1990"},  # EM 0, F1 0
        {
            "question_id": "p1",
            "pred": "British racing driver",
        },  # gold [british, driver] pred [british, racing, driver]: F1 0.8
        {"question_id": "p2", "pred": "Tokyo"},  # gold [tokyo, japan] pred [tokyo]: P 1, R 1/2 -> F1 2/3
        # m1 has no prediction: scored as "" (EM 0, F1 0) and counted as missing
    ]
    out = evaluate_predictions(predictions, reference)
    assert out["in_table"] == {"em": 50.0, "f1": 50.0, "count": 2}
    assert out["in_passage"]["em"] == 0.0 and out["in_passage"]["count"] == 2
    assert out["in_passage"]["f1"] == pytest.approx(100 * (0.8 + 2 / 3) / 2)
    assert out["total"]["count"] == 5 and out["missing"] == 1
    assert out["total"]["em"] == pytest.approx(100 * 1 / 5)
    assert out["total"]["f1"] == pytest.approx(100 * (1 + 0 + 0.8 + 2 / 3 + 0) / 5)
    flat = flat_metrics(out)
    assert flat["in_table/em"] == 50.0 and flat["total/count"] == 5 and flat["missing"] == 1


def test_last_prediction_of_a_repeated_id_wins_and_unknown_ids_are_ignored():
    reference = {"reference": {"q": "Kyoto"}, "table": ["q"], "passage": []}
    preds = [
        {"question_id": "q", "pred": "Osaka"},
        {"question_id": "q", "pred": "Kyoto"},
        {"question_id": "zz", "pred": "x"},
    ]
    out = evaluate_predictions(preds, reference)
    assert out["total"]["em"] == 100.0
    assert out["in_passage"] == {"em": None, "f1": None, "count": 0}


@pytest.fixture(scope="module")
def sample_reference(sample_root):
    return json.loads((sample_root / "released_data" / "dev_reference.json").read_text())


def test_split_matches_the_bundled_reference_file(sample_root, sample_reference):
    answers = sample_reference["reference"]
    gold = [{"question_id": q, "pred": a} for q, a in answers.items()]
    out = evaluate_predictions(gold, sample_reference)
    assert out["in_table"]["count"] == 25 and out["in_passage"]["count"] == 28 and out["total"]["count"] == 53
    assert all(out[g]["em"] == 100.0 and out[g]["f1"] == 100.0 for g in ("in_table", "in_passage", "total"))

    # answering every question with its in-table answers only: in-table 100, in-passage 0
    table_only = [{"question_id": q, "pred": answers[q]} for q in sample_reference["table"]]
    out = evaluate_predictions(table_only, sample_reference)
    assert out["in_table"]["em"] == 100.0 and out["in_passage"]["em"] == 0.0
    assert out["total"]["em"] == pytest.approx(100 * 25 / 53) and out["missing"] == 28

    # the split agrees with the traced answer sources of the question file
    traced = json.loads((sample_root / "released_data" / "dev.traced.json").read_text())
    sources = {r["question_id"]: {n[3] for n in r["answer-node"]} for r in traced}
    assert all("table" in sources[q] for q in sample_reference["table"])
    assert all("passage" in sources[q] for q in sample_reference["passage"])


def test_subset_reference_scores_only_the_kept_questions(sample_reference):
    keep = sample_reference["table"][:3] + sample_reference["passage"][:2]
    sub = subset_reference(sample_reference, keep)
    assert set(sub["reference"]) == set(keep) and sub["table"] == keep[:3] and sub["passage"] == keep[3:]
    out = evaluate_predictions([{"question_id": q, "pred": sample_reference["reference"][q]} for q in keep], sub)
    assert out["total"] == {"em": 100.0, "f1": 100.0, "count": 5} and out["missing"] == 0
    assert all(math.isfinite(out[g]["f1"]) for g in ("in_table", "in_passage"))
