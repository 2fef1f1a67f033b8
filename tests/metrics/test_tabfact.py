"""TabFact accuracy, overall and per channel, on hand-computed cases."""

import pytest

from mate_cli.metrics.tabfact import accuracy, tabfact_scores


def test_accuracy_hand_computed():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy([True, False], [1, 0]) == 1.0
    assert accuracy([], []) == 0.0
    with pytest.raises(ValueError):
        accuracy([1], [1, 0])


def test_tabfact_scores_per_channel():
    records = [
        ("simple", 1, 1),  # right
        ("simple", 0, 0),  # right
        ("simple", 1, 0),  # wrong
        ("complex", 0, 0),  # right
        ("complex", 1, 0),  # wrong
        ("complex", 0, 1),  # wrong
        ("complex", 1, 1),  # right
        (None, 1, 1),  # right, overall only
    ]
    out = tabfact_scores(records)
    assert out == {"accuracy": pytest.approx(5 / 8), "simple": pytest.approx(2 / 3), "complex": pytest.approx(2 / 4)}


def test_tabfact_scores_channel_keys_only_when_present():
    assert tabfact_scores([(None, 1, 1), (None, 0, 1)]) == {"accuracy": 0.5}
    assert tabfact_scores([("complex", 1, 1), (None, 0, 1)]) == {"accuracy": 0.5, "complex": 1.0}
    assert tabfact_scores([]) == {"accuracy": 0.0}
    with pytest.raises(ValueError):
        tabfact_scores([("hard", 1, 1)])
