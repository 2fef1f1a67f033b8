"""HybridQA answer metrics with the official evaluation semantics (EM / token F1).

Owns per-answer exact match and token F1 (on :func:`~mate_cli.data.normalize.normalize_answer`), and
:func:`evaluate_predictions`, which scores a predictions list against a
``dev_reference.json`` dict the way the official HybridQA ``evaluate_script.py`` does:

- normalisation (SQuAD's): lower-case, drop every ``string.punctuation`` character,
  replace the articles ``a``/``an``/``the`` (whole words) by a space, collapse
  whitespace;
- EM: normalised strings equal; F1: bag-of-tokens overlap of the normalised strings
  (if either side has no token, F1 is 1 when both are empty, else 0); with several gold
  answers, the maximum over them;
- groups: ``in_table`` = the reference's ``table`` list, ``in_passage`` = its
  ``passage`` list, ``total`` = every question of ``reference["reference"]`` (so the
  HybridQA "missing" questions count in the total only);
- scale: **percent** (``100 * mean``), as the official script prints.

Two cases where the official script would crash are defined here instead: a
reference question with no prediction scores as the empty prediction ``""`` (and is
counted in ``missing``), and a group with no question reports ``em``/``f1`` as
``None`` with ``count`` 0. On complete predictions the numbers are the official ones.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

from mate_cli.data.normalize import normalize_answer

Gold = str | Sequence[str]


def answer_tokens(text: str) -> list[str]:
    """The normalised answer split on whitespace (``[]`` for empty text)."""
    return normalize_answer(text).split() if text else []


def _as_list(gold: Gold) -> list[str]:
    if isinstance(gold, str):
        return [gold]
    answers = [str(a) for a in gold]
    return answers or [""]


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
    """Token F1 of ``pred`` against (the best of) the gold answer(s), in [0, 1]."""
    return max(_f1(a, pred) for a in _as_list(gold))


def _group(ids: Iterable[str], em: Mapping[str, float], f1: Mapping[str, float]) -> dict:
    ids = list(ids)
    if not ids:
        return {"em": None, "f1": None, "count": 0}
    return {
        "em": 100.0 * sum(em[q] for q in ids) / len(ids),
        "f1": 100.0 * sum(f1[q] for q in ids) / len(ids),
        "count": len(ids),
    }


def evaluate_predictions(predictions: Sequence[Mapping[str, str]], reference: Mapping) -> dict:
    """Official HybridQA EM/F1 (percent) of ``predictions`` against ``reference``.

    Args:
        predictions: ``[{"question_id": ..., "pred": ...}, ...]`` (the official format; a
            repeated question id keeps its last prediction, as the official script).
        reference: a ``dev_reference.json`` dict: ``{"reference": {qid: answer or [answers]},
            "table": [qids], "passage": [qids]}``.

    Returns:
        ``{"in_table": {"em", "f1", "count"}, "in_passage": {...}, "total": {...},
        "missing": n}``; ``missing`` counts reference questions without a prediction.
    """
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
    """``reference`` restricted to ``question_ids`` (e.g. the held-out tables of the sample).

    The official script scores every question of the reference file; when only part of
    the split is predicted (the sample's by-table validation side), this restricts the
    reference first so the same semantics apply to exactly that part.
    """
    keep = set(question_ids)
    return {
        "reference": {q: a for q, a in reference["reference"].items() if q in keep},
        "table": [q for q in reference.get("table", []) if q in keep],
        "passage": [q for q in reference.get("passage", []) if q in keep],
    }


def flat_metrics(result: Mapping, prefix: str = "") -> dict[str, float | int | None]:
    """``{"in_table/em": ..., "total/f1": ..., "missing": ...}`` from :func:`evaluate_predictions`."""
    out: dict[str, float | int | None] = {}
    for group in ("in_table", "in_passage", "total"):
        for key in ("em", "f1", "count"):
            out[f"{prefix}{group}/{key}"] = result[group][key]
    out[f"{prefix}missing"] = result.get("missing", 0)
    return out
