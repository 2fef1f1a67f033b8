"""SQA ALL/SEQ/Q1-Q3 on a hand-computed case, and the DDP-exact SequenceAccuracy metric."""

import pytest
import torch

from mate_cli.metrics.sqa import SequenceAccuracy, question_correct, sequence_key, sqa_scores

# Three sequences, 7 questions, 6 correct:
#   A: 3 questions, all correct          -> sequence correct
#   B: 3 questions, position 1 wrong     -> sequence wrong
#   C: 1 question, correct               -> sequence correct
# ALL = 6/7, SEQ = 2/3; Q1 = 3/3, Q2 = 1/2, Q3 = 2/2.
RECORDS = [
    ("A/0", 0, True),
    ("A/0", 1, True),
    ("A/0", 2, True),
    ("B/1", 0, True),
    ("B/1", 1, False),
    ("B/1", 2, True),
    ("C/2", 0, True),
]


def test_question_correct_compares_coordinate_sets():
    assert question_correct([(0, 1), (2, 3)], [[2, 3], [0, 1]])  # order, tuple vs list
    assert question_correct([(0, 1), (0, 1)], [(0, 1)])  # repeats
    assert not question_correct([(0, 1)], [(0, 1), (2, 3)])  # missing cell
    assert not question_correct([(0, 1), (2, 3)], [(0, 1)])  # extra cell
    assert not question_correct([(1, 0)], [(0, 1)])  # row/column swapped
    assert question_correct([], [])


def test_sqa_scores_hand_computed():
    out = sqa_scores(RECORDS)
    assert out == {
        "all": pytest.approx(6 / 7),
        "seq": pytest.approx(2 / 3),
        "q1": 1.0,
        "q2": 0.5,
        "q3": 1.0,
        "questions": 7,
        "sequences": 3,
    }


def test_sqa_scores_repeats_and_conflicts():
    assert sqa_scores(RECORDS + [("C/2", 0, True)])["questions"] == 7  # exact repeat counts once
    with pytest.raises(ValueError):
        sqa_scores(RECORDS + [("C/2", 0, False)])
    assert sqa_scores([]) == {"all": 0.0, "seq": 0.0, "q1": 0.0, "q2": 0.0, "q3": 0.0, "questions": 0, "sequences": 0}


def test_sequence_key_is_stable_sha256():
    # SHA-256("abc") = ba7816bf8f01cfea..., top bit cleared -> 0x3a7816bf8f01cfea
    assert sequence_key("abc") == 0x3A7816BF8F01CFEA
    assert 0 <= sequence_key("B/1") < 2**63
    assert sequence_key("A/0") != sequence_key("A/1")


def _tensors(records):
    keys = torch.tensor([sequence_key(s) for s, _, _ in records], dtype=torch.int64)
    correct = torch.tensor([c for _, _, c in records], dtype=torch.bool)
    return keys, correct


def test_sequence_accuracy_matches_sqa_scores():
    metric = SequenceAccuracy()
    metric.update(*_tensors(RECORDS))
    assert metric.compute().item() == pytest.approx(sqa_scores(RECORDS)["seq"])
    assert metric.compute().item() == pytest.approx(2 / 3)


def test_sequence_accuracy_two_chunks_splitting_a_sequence():
    # the cut falls inside B, with B's wrong question in the second chunk
    metric = SequenceAccuracy()
    metric.update(*_tensors(RECORDS[:4]))
    metric.update(*_tensors(RECORDS[4:]))
    assert metric.compute().item() == pytest.approx(2 / 3)


def test_sequence_accuracy_merged_states_like_ddp():
    # two "processes", each with part of B; their cat-reduced states give the global SEQ
    first, second = SequenceAccuracy(), SequenceAccuracy()
    first.update(*_tensors(RECORDS[:5:2]))
    second.update(*_tensors(RECORDS[1::2] + RECORDS[6:]))
    first.merge_state(second)
    assert first.compute().item() == pytest.approx(2 / 3)


def test_sequence_accuracy_repeated_question_and_empty():
    metric = SequenceAccuracy()
    metric.update(*_tensors(RECORDS + RECORDS[:2]))  # a sampler's padding repeats questions
    assert metric.compute().item() == pytest.approx(2 / 3)
    with pytest.warns(UserWarning):  # torchmetrics warns about compute before update
        assert SequenceAccuracy().compute().item() == 0.0
    with pytest.raises(ValueError):
        metric.update(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.bool))
    metric.reset()
    metric.update(*_tensors([("B/1", 1, False)]))
    assert metric.compute().item() == 0.0
