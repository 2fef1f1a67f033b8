"""TabFact verification accuracy (verdicts 1 entailed / 0 refuted): over all statements and, as the TabFact paper
reports, over its two channels, ``simple`` statements (single-row lookups) and ``complex`` ones (aggregation,
comparison, ...). Scores are fractions in [0, 1], 0.0 when there is nothing to score.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

CHANNELS = ("simple", "complex")


def accuracy(pred_labels: Sequence[int], gold_labels: Sequence[int]) -> float:
    """Share of positions where the predicted label equals the gold one (compared as ints; equal lengths)."""
    if len(pred_labels) != len(gold_labels):
        raise ValueError(f"{len(pred_labels)} predictions but {len(gold_labels)} gold labels")
    if not gold_labels:
        return 0.0
    return sum(int(p) == int(g) for p, g in zip(pred_labels, gold_labels)) / len(gold_labels)


def tabfact_scores(records: Iterable[tuple[Optional[str], int, int]]) -> dict[str, float]:
    """Accuracy of ``(channel or None, predicted, gold)`` records, overall and per channel.

    Returns:
        ``{"accuracy": ...}`` plus ``"simple"`` / ``"complex"`` for each channel some
        record carries; a channel other than those two raises ``ValueError``.
    """
    records = list(records)
    for channel, _, _ in records:
        if channel is not None and channel not in CHANNELS:
            raise ValueError(f"unknown TabFact channel {channel!r} (expected one of {CHANNELS} or None)")
    out = {"accuracy": accuracy([p for _, p, _ in records], [g for _, _, g in records])}
    for name in CHANNELS:
        part = [(p, g) for channel, p, g in records if channel == name]
        if part:
            out[name] = accuracy([p for p, _ in part], [g for _, g in part])
    return out
