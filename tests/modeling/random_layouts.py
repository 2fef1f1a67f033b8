"""Random `TableLayout`s of the tests: shapes drawn from ranges, built by :func:`layout_from_cells`."""

from __future__ import annotations

import random
from typing import Sequence

from mate_cli.layout import TableLayout
from mate_cli.modeling.synthetic import Range, layout_from_cells


def _draw_cells(rng: random.Random, rows: int, columns: int, cell_tokens: Range) -> list[list[int]]:
    return [[rng.randint(*cell_tokens) for _ in range(columns)] for _ in range(rows + 1)]


def shaped_layout(
    shapes: Sequence[tuple[int, int, int]], *, cell_tokens: Range = (1, 3), extra_pad: int = 0, seed: int = 0
) -> TableLayout:
    """One ``(query_len, rows, columns)`` per example (plus a header row); padded to the longest plus ``extra_pad``."""
    rng = random.Random(seed)
    cells = [_draw_cells(rng, rows, columns, cell_tokens) for _, rows, columns in shapes]
    return layout_from_cells([q for q, _, _ in shapes], cells, pad=extra_pad)


def random_layout(
    batch: int = 3,
    *,
    query_len: Range = (2, 10),
    rows: Range = (1, 5),
    cols: Range = (1, 4),
    cell_tokens: Range = (1, 3),
    pad: Range = (0, 5),
    seed: int = 0,
) -> TableLayout:
    """Each range an inclusive ``(low, high)`` drawn per example (``cell_tokens`` per cell; a header row added to
    ``rows``); padded to the longest example plus its ``pad``."""
    rng = random.Random(seed)
    query_lens, cells, pads = [], [], []
    for _ in range(batch):
        n_rows, n_cols = rng.randint(*rows), rng.randint(*cols)
        query_lens.append(rng.randint(*query_len))
        cells.append(_draw_cells(rng, n_rows, n_cols, cell_tokens))
        pads.append(rng.randint(*pad))
    return layout_from_cells(query_lens, cells, pad=pads)
