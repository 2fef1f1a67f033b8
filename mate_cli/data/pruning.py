"""Input-length heuristics CC and HEM (``dataset.pruning``): which word pieces of a table fit a token budget.

Both are from Eisenschlos et al. 2020 ("Understanding tables with intermediate pre-training", §3.3) and Krichene et
al. 2021 (DoT). With full rounds only, CC is :func:`~mate_cli.data.tokenize.fit_budget`'s per-cell cap; CC also spends
the remainder and never drops a row.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence


@dataclass(frozen=True)
class Selection:
    """Word pieces kept per cell (a prefix), by the input's indices: ``header`` ``[num_columns]``, ``rows``
    ``[num_rows][num_columns]``; ``columns`` the kept ones, ascending (one may keep 0 pieces: CC, tiny budget)."""

    header: list[int]
    rows: list[list[int]]
    columns: list[int]

    @property
    def tokens(self) -> int:
        return sum(self.header) + sum(sum(row) for row in self.rows)


def largest_cap(lengths: Sequence[int], budget: int) -> int:
    """Largest ``c >= 0`` with ``sum(min(l, c)) <= budget`` (``max(lengths)`` if all fit)."""
    caps = range(max(lengths, default=0) + 1)  # the sum grows with the cap: a binary search
    return max(0, bisect.bisect_right(caps, budget, key=lambda cap: sum(min(n, cap) for n in lengths)) - 1)


def _round_robin(lengths: Sequence[int], budget: int) -> list[int]:
    """CC on one flat, ordered list of cell lengths."""
    budget = max(int(budget), 0)
    if sum(lengths) <= budget:
        return list(lengths)
    low = largest_cap(lengths, budget)  # full rounds (< max(lengths) here)
    kept = [min(n, low) for n in lengths]
    left = budget - sum(kept)
    for i, n in enumerate(lengths):  # the partial round: earlier cells first
        if left == 0:
            break
        if n > low:
            kept[i] += 1
            left -= 1
    return kept


def cell_concatenation(header_lengths: Sequence[int], row_lengths: Sequence[Sequence[int]], budget: int) -> Selection:
    """CC: one word piece per cell a round, header row first, then row-major; a last, partial round favours the earlier
    cells. Every column is returned; when ``budget`` >= the non-empty cells, each keeps a piece."""
    num_cols = len(header_lengths)
    flat = _round_robin(list(header_lengths) + [n for row in row_lengths for n in row], budget)
    header, rest = flat[:num_cols], flat[num_cols:]
    rows = [rest[r * num_cols : (r + 1) * num_cols] for r in range(len(row_lengths))]
    return Selection(header=header, rows=rows, columns=list(range(num_cols)))


def column_scores(
    question_tokens: Iterable[Hashable],
    header_tokens: Sequence[Sequence[Hashable]],
    row_tokens: Sequence[Sequence[Sequence[Hashable]]],
) -> list[int]:
    """Per column: how many distinct question tokens occur anywhere in it, header included."""
    wanted = set(question_tokens)
    return [len(wanted & set(head).union(*(row[c] for row in row_tokens))) for c, head in enumerate(header_tokens)]


def heuristic_exact_match(
    question_tokens: Iterable[Hashable],
    header_tokens: Sequence[Sequence[Hashable]],
    row_tokens: Sequence[Sequence[Sequence[Hashable]]],
    budget: int,
) -> Selection:
    """HEM: whole columns, best :func:`column_scores` first (ties: original order), until the first that does not fit,
    so every kept column ranks above every removed one. When not even the best fits, only it is kept, cut by CC inside
    it, so no row is ever removed."""
    budget = max(int(budget), 0)
    num_cols = len(header_tokens)
    header_lengths = [len(t) for t in header_tokens]
    row_lengths = [[len(t) for t in row] for row in row_tokens]
    size = [header_lengths[c] + sum(row[c] for row in row_lengths) for c in range(num_cols)]
    if sum(size) <= budget:
        return Selection(header=header_lengths, rows=row_lengths, columns=list(range(num_cols)))
    scores = column_scores(question_tokens, header_tokens, row_tokens)
    ranked = sorted(range(num_cols), key=lambda c: (-scores[c], c))
    kept, used = [], 0
    for c in ranked:
        if used + size[c] > budget:
            break
        kept.append(c)
        used += size[c]
    if not kept:  # fallback: CC inside the best column
        best = ranked[0]
        inside = _round_robin([header_lengths[best]] + [row[best] for row in row_lengths], budget)
        header = [inside[0] if c == best else 0 for c in range(num_cols)]
        rows = [[n if c == best else 0 for c in range(num_cols)] for n in inside[1:]]
        return Selection(header=header, rows=rows, columns=[best])
    header = [n if c in kept else 0 for c, n in enumerate(header_lengths)]
    rows = [[n if c in kept else 0 for c, n in enumerate(row)] for row in row_lengths]
    return Selection(header=header, rows=rows, columns=sorted(kept))
