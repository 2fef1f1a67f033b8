"""The trivial baselines: rules chosen on the training side, scored with the tasks' metrics;
and `mate baseline` on a bundled sample through the real CLI."""

from __future__ import annotations

import json

from mate_cli.data.records import Cell, Question, Table
from mate_cli.pipelines import trivial
from tests.inprocess import run_captured


def q(qid: str, answers=(), **kw) -> Question:
    return Question(question_id=qid, question="?", table_id="t", answers=list(answers), **kw)


def test_wtq_most_frequent_answer_is_chosen_on_train_and_scored_with_the_gold_targets():
    train = [q("a", ["3"]), q("b", ["3.0"]), q("c", ["Paris"])]
    validation = [q("d", ["3"]), q("e", ["three"]), q("f", ["1,484,900"])]
    out = trivial.wtq_most_frequent(train, validation)
    assert out["rule"] == "always answer ['3']"
    assert out["val/accuracy"] == 1 / 3


def table(rows: list[list[str]]) -> Table:
    return Table(table_id="t", header=[Cell("a"), Cell("b")], rows=[[Cell(text=t) for t in row] for row in rows])


def test_sqa_fixed_rule_is_the_best_on_train_and_gives_all_seq_and_q1_to_q3():
    t = table([["x", "1"], ["y", "2"]])
    train = [
        q("s/0/0", answer_coordinates=[[0, 1], [1, 1]], sequence_id="s/0", position=0),
        q("s/0/1", answer_coordinates=[[0, 1], [1, 1]], sequence_id="s/0", position=1),
        q("u/0/0", answer_coordinates=[[0, 0]], sequence_id="u/0", position=0),
    ]
    validation = [
        q("v/0/0", answer_coordinates=[[0, 1], [1, 1]], sequence_id="v/0", position=0),
        q("v/0/1", answer_coordinates=[[1, 0]], sequence_id="v/0", position=1),
    ]
    out = trivial.sqa_fixed_cells(train, validation, lambda _: t)
    assert out["rule"] == "every cell of column 1" and out["train/accuracy"] == 2 / 3
    assert out["val/accuracy"] == 0.5 and out["val/seq"] == 0.0
    assert (out["val/accuracy_q1"], out["val/accuracy_q2"], out["val/accuracy_q3"]) == (1.0, 0.0, 0.0)


def test_tabfact_majority():
    train = [q(str(i), label=int(i < 3)) for i in range(5)]
    out = trivial.tabfact_majority(train, [q("x", label=1), q("y", label=0)])
    assert out == {"rule": "always entailed", "val/accuracy": 0.5}


def test_tabfact_statement_only_learns_the_statements_bias_and_never_sees_the_table():
    """A word that decides the label on the training side decides it on validation; the tables
    (one per statement here) play no part."""

    def statement(i: int, word: str, label: int) -> Question:
        return Question(
            question_id=str(i), question=f"the team {word} game {i % 7}", table_id=f"t{i % 10}", label=label
        )

    train = [statement(i, ("won", "lost")[i % 2], 1 - i % 2) for i in range(60)]
    validation = [statement(100 + i, ("won", "lost")[i % 2], 1 - i % 2) for i in range(20)]
    out = trivial.tabfact_statement_only(train, validation)
    assert out["val/accuracy_statement_only"] == 1.0
    assert out["statement_only_rule"].startswith("bag-of-words logistic regression on the statement alone (C=")
    flipped = [
        Question(question_id=v.question_id, question=v.question, table_id=v.table_id, label=1 - v.label)
        for v in validation
    ]
    assert trivial.tabfact_statement_only(train, flipped)["val/accuracy_statement_only"] == 0.0
    assert trivial.tabfact_statement_only(train[:1], validation) == {}  # one table, one label: nothing to fit


def test_mate_baseline_on_the_bundled_tabfact_sample(tmp_path, monkeypatch):
    """`mate baseline`'s own function on a config Hydra composes, in this process."""
    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))
    done = run_captured("baseline", ["dataset=tabfact_sample"], tmp_path / "run")
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["rule"] in ("always entailed", "always refuted")
    assert metrics["data/validation/questions"] > 0 and 0.3 < metrics["val/accuracy"] < 0.7
    assert 0.0 <= metrics["val/accuracy_statement_only"] <= 1.0 and "val/accuracy_statement_only" in done.stdout
    wrong = run_captured("baseline", ["experiment=hybridqa_mate"], tmp_path / "wrong")  # a HybridQA experiment
    assert wrong.returncode == 2 and wrong.stderr.startswith("mate: error: "), wrong.stderr
