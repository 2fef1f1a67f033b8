"""HybridQA's EM and token F1 as the official ``evaluate_script.py`` computes them (SQuAD's normalisation), in percent.

Two cases that crash the official script are defined here: a question with no prediction scores as ``""`` (counted in
``missing``), and a group with no question has ``em``/``f1`` None and ``count`` 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

from mate_cli.metrics.normalize import normalize_answer

Gold = str | Sequence[str]


def answer_tokens(text: str) -> list[str]:
    """The normalised answer split on whitespace (``[]`` for empty text)."""
    return normalize_answer(text).split() if text else []


def _as_list(gold: Gold) -> list[str]:
    if isinstance(gold, str):
        return [gold]
    return [str(a) for a in gold] or [""]


def exact_match(gold: Gold, pred: str) -> float:
    """1.0 when ``pred`` equals (one of) the gold answer(s) after normalisation, else 0.0."""
    norm = normalize_answer(pred)
    return float(max(normalize_answer(a) == norm for a in _as_list(gold)))


def _f1(gold: str, pred: str) -> float:
    gold_toks, pred_toks = answer_tokens(gold), answer_tokens(pred)
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    same = sum((Counter(gold_toks) & Counter(pred_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def f1_score(gold: Gold, pred: str) -> float:
    """Bag-of-tokens F1 against the best gold answer, in [0, 1]; 1 when neither side has a token, 0 when one only."""
    return max(_f1(a, pred) for a in _as_list(gold))


def _group(ids: Iterable[str], em: Mapping[str, float], f1: Mapping[str, float]) -> dict:
    ids = list(ids)
    if not ids:
        return {"em": None, "f1": None, "count": 0}
    n = len(ids)
    return {"em": 100.0 * sum(em[q] for q in ids) / n, "f1": 100.0 * sum(f1[q] for q in ids) / n, "count": n}


def evaluate_predictions(predictions: Sequence[Mapping[str, str]], reference: Mapping) -> dict:
    """``[{"question_id", "pred"}]`` (a repeated id keeps its last, as officially) against a ``dev_reference.json``
    dict -> ``{"in_table"|"in_passage"|"total": {"em", "f1", "count"}, "missing": n}``. ``in_table``/``in_passage`` are
    the reference's ``table``/``passage`` lists; ``total`` is every question of ``reference["reference"]``."""
    answers = dict(reference["reference"])
    preds = {str(p["question_id"]): str(p.get("pred") or "") for p in predictions}
    missing = [q for q in answers if q not in preds]
    em = {q: exact_match(gold, preds.get(q, "")) for q, gold in answers.items()}
    f1 = {q: f1_score(gold, preds.get(q, "")) for q, gold in answers.items()}
    table = [q for q in reference.get("table", []) if q in answers]
    passage = [q for q in reference.get("passage", []) if q in answers]
    return {
        "in_table": _group(table, em, f1),
        "in_passage": _group(passage, em, f1),
        "total": _group(answers, em, f1),
        "missing": len(missing),
    }


def subset_reference(reference: Mapping, question_ids: Iterable[str]) -> dict:
    """``reference`` restricted to ``question_ids`` (the official script scores every question of its reference)."""
    keep = set(question_ids)
    return {
        "reference": {q: a for q, a in reference["reference"].items() if q in keep},
        "table": [q for q in reference.get("table", []) if q in keep],
        "passage": [q for q in reference.get("passage", []) if q in keep],
    }


def flat_metrics(result: Mapping) -> dict[str, float | int | None]:
    """``{"in_table/em": ..., "total/f1": ..., "missing": ...}`` from :func:`evaluate_predictions`."""
    out = {f"{g}/{k}": result[g][k] for g in ("in_table", "in_passage", "total") for k in ("em", "f1", "count")}
    return {**out, "missing": result.get("missing", 0)}
