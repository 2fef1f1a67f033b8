"""Trivial baselines (``mate baseline``): answers that need no model, scored with the tasks' own metrics. Each rule is
chosen on the training side only, then scored on validation.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

from mate_cli.data.records import Question, Table
from mate_cli.metrics.sqa import QUESTION_NUMBERS, question_correct, sqa_scores
from mate_cli.metrics.wtq import denotation_correct, normalize

FIXED_COLUMNS = 5
FIXED_ROWS = 3


def wtq_most_frequent(train: Sequence[Question], validation: Sequence[Question]) -> dict:
    """The training side's most frequent gold answer list (by normalised text), as the answer to every question."""
    counts = Counter(tuple(sorted(normalize(a) for a in q.answers)) for q in train if q.answers)
    ((key, _),) = counts.most_common(1)
    # the answer as written in its most frequent spelling
    answer = Counter(tuple(q.answers) for q in train if tuple(sorted(normalize(a) for a in q.answers)) == key)
    ((written, _),) = answer.most_common(1)
    correct = [denotation_correct(q.answers, list(written), q.canonical_answers or None) for q in validation]
    return {"rule": f"always answer {list(written)}", "val/accuracy": _mean(correct)}


def sqa_fixed_cells(train: Sequence[Question], validation: Sequence[Question], table: Callable[[str], Table]) -> dict:
    """The fixed rule ("every cell of column c" or "the cell at row r, column c", within ``FIXED_ROWS`` x
    ``FIXED_COLUMNS``) with the best training ALL; its ALL, SEQ and Q1-Q3 on validation."""
    rules = [(f"every cell of column {c}", _column(c)) for c in range(FIXED_COLUMNS)]
    rules += [
        (f"the cell at row {r}, column {c}", _cell(r, c)) for r in range(FIXED_ROWS) for c in range(FIXED_COLUMNS)
    ]

    def scores(questions: Sequence[Question], rule) -> dict:
        correct = [question_correct(rule(table(q.table_id)), q.answer_coordinates) for q in questions]
        return sqa_scores((q.sequence_id or q.question_id, q.position, c) for q, c in zip(questions, correct))

    name, best = max(rules, key=lambda item: scores(train, item[1])["all"])
    val, train_all = scores(validation, best), scores(train, best)["all"]
    by_position = {f"val/accuracy_q{n}": val[f"q{n}"] for n in QUESTION_NUMBERS}
    return {"rule": name, "train/accuracy": train_all, "val/accuracy": val["all"], "val/seq": val["seq"], **by_position}


def tabfact_majority(train: Sequence[Question], validation: Sequence[Question]) -> dict:
    """The training side's majority verdict, for every validation statement."""
    ((label, _),) = Counter(int(q.label) for q in train if q.label is not None).most_common(1)
    correct = [int(q.label) == label for q in validation if q.label is not None]
    return {"rule": f"always {('refuted', 'entailed')[label]}", "val/accuracy": _mean(correct)}


#: the regularisation strengths the statement-only model chooses from (up to 5-fold CV, grouped by table)
STATEMENT_ONLY_C = (0.03, 0.1, 0.3, 1.0)


def tabfact_statement_only(train: Sequence[Question], validation: Sequence[Question]) -> dict:
    """Unigram bag-of-words logistic regression on the statement alone (no table): the statements' own label bias,
    which a model that reads the table should beat. ``{}`` with fewer than two training tables or labels."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, cross_val_score
    from sklearn.pipeline import make_pipeline

    train = [q for q in train if q.label is not None]
    validation = [q for q in validation if q.label is not None]
    texts, labels = [q.question for q in train], [int(q.label) for q in train]

    def model(c: float):
        return make_pipeline(CountVectorizer(binary=True, min_df=2), LogisticRegression(C=c, max_iter=2000))

    folds = min(5, len({q.table_id for q in train}))
    if folds < 2 or len(set(labels)) < 2:
        return {}
    groups = [q.table_id for q in train]
    score = {
        c: cross_val_score(model(c), texts, labels, groups=groups, cv=GroupKFold(folds)).mean()
        for c in STATEMENT_ONLY_C
    }
    best = max(STATEMENT_ONLY_C, key=lambda c: (score[c], -c))
    fitted = model(best).fit(texts, labels)
    predicted = fitted.predict([q.question for q in validation])
    correct = [int(p) == int(q.label) for p, q in zip(predicted, validation)]
    return {
        "statement_only_rule": f"bag-of-words logistic regression on the statement alone (C={best})",
        "val/accuracy_statement_only": _mean(correct),
    }


def wtq_baselines(train: Sequence[Question], validation: Sequence[Question], reader) -> dict:
    return wtq_most_frequent(train, validation)


def sqa_baselines(train: Sequence[Question], validation: Sequence[Question], reader) -> dict:
    return sqa_fixed_cells(train, validation, reader.table)


def tabfact_baselines(train: Sequence[Question], validation: Sequence[Question], reader) -> dict:
    return {**tabfact_majority(train, validation), **tabfact_statement_only(train, validation)}


def _column(c: int):
    return lambda table: [(r, c) for r in range(len(table.rows)) if c < len(table.rows[r])]


def _cell(r: int, c: int):
    return lambda table: [(r, c)] if r < len(table.rows) and c < len(table.rows[r]) else []


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else 0.0
