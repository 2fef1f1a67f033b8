"""Synthetic `TableLayout`s for benchmarks and tests, laid out as :mod:`mate_cli.data.tokenize` does: ``[CLS] query
[SEP]``, the header row, data rows (every cell at least one token), padding; other TAPAS token types zeros.
Deterministic for a given ``seed``; :func:`layout_from_cells` gives an exact shape (the tests' random ones:
``tests/modeling/random_layouts.py``).
"""

from __future__ import annotations

import random
from typing import Sequence

from mate_cli.layout import TableLayout

Range = tuple[int, int]


def _example_ids(query_len: int, cells: Sequence[Sequence[int]]) -> dict[str, list[int]]:
    n_query = query_len + 2  # [CLS] ... [SEP]
    ids = {name: [0] * n_query for name in ("segment_ids", "row_ids", "column_ids", "cell_ids")}
    cell_id = 0
    for r, row in enumerate(cells):
        for c, length in enumerate(row):
            cell_id += r > 0
            values = (("segment_ids", 1), ("row_ids", r), ("column_ids", c + 1), ("cell_ids", cell_id if r > 0 else 0))
            for name, value in values:
                ids[name] += [value] * length
    return ids


def layout_from_cells(
    query_lens: Sequence[int],
    cells: Sequence[Sequence[Sequence[int]]],
    seq_len: int | None = None,
    pad: int | Sequence[int] = 0,
) -> TableLayout:
    """``query_lens`` without [CLS]/[SEP]; ``cells[b][r][c]`` the tokens of row r (0 = header), column c (rows may be
    ragged). Padded to ``seq_len``, else to the longest example plus its ``pad`` (an int or one per example)."""
    examples = [_example_ids(q, c) for q, c in zip(query_lens, cells)]
    pads = [pad] * len(examples) if isinstance(pad, int) else list(pad)
    if seq_len is None:
        seq_len = max(len(e["segment_ids"]) + p for e, p in zip(examples, pads))
    return TableLayout.from_lists(examples, seq_len)


def _fill_cells(budget: int, columns: int, cell_tokens: int, rng: random.Random) -> list[list[int]]:
    """``cells[r][c]`` token counts (row 0 = header) that exactly fill ``budget``."""
    low, high = max(1, round(0.25 * cell_tokens)), max(1, round(1.75 * cell_tokens))
    rows: list[list[int]] = []
    used = 0
    while used < budget:
        row = []
        for _ in range(columns):
            if used >= budget:
                break
            length = min(rng.randint(low, high), budget - used)
            row.append(length)
            used += length
        rows.append(row)
    return rows


def filled_layout(
    seq_len: int, batch: int = 1, *, query_tokens: int = 60, columns: int = 8, cell_tokens: int = 30, seed: int = 0
) -> TableLayout:
    """``batch`` realistic tables that each fill ``seq_len`` tokens exactly (no padding). ``query_tokens`` include
    [CLS] and [SEP]; cells are uniform in ``[0.25, 1.75] x cell_tokens`` tokens (like HybridQA cells expanded with
    passage sentences), the last one trimmed; example b uses seed ``seed + b``. The defaults give ~2 rows at 512
    tokens, ~34 at 8192, ~136 at 32768."""
    if query_tokens < 2 or seq_len <= query_tokens or columns < 1 or cell_tokens < 1:
        raise ValueError(
            f"no table fits: seq_len={seq_len}, query_tokens={query_tokens}, "
            f"columns={columns}, cell_tokens={cell_tokens}"
        )
    cells = [_fill_cells(seq_len - query_tokens, columns, cell_tokens, random.Random(seed + b)) for b in range(batch)]
    return layout_from_cells([query_tokens - 2] * batch, cells, seq_len=seq_len)
