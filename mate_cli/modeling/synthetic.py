"""Synthetic `TableLayout`s: the one builder behind the tests and the benchmark.

Every example is laid out the way ``mate_cli.data.tokenize`` lays out TAPAS input::

    [CLS] query tokens [SEP] | header row | data row 1 | ... | data row R | padding

- query, [CLS], [SEP]: segment 0, row 0, column 0, cell 0 (the query set Q);
- header cells: segment 1, row 0, column c (1-based), cell 0;
- data cells: segment 1, row r (1-based), column c, cell k (row-major, 1-based);
- every cell spans one or more tokens; padding comes last (``attention_mask`` False,
  every id 0). The other TAPAS token types are zeros.

Entry points, most explicit first:

- :func:`layout_from_cells`: from per-example cell lengths, when a test needs an
  exact shape (e.g. one row longer than the attention radius);
- :func:`shaped_layout`: one ``(query_len, rows, columns)`` per example, random
  1-3-token cells;
- :func:`random_layout`: a batch of tables with random shapes and padding (every
  range an inclusive ``(low, high)`` pair);
- :func:`filled_layout`: a realistic table that fills ``seq_len`` exactly (the
  benchmark's input, :mod:`mate_cli.bench.layouts`): fixed columns, multi-token cells,
  as many rows as it takes.

All are deterministic for a given ``seed`` (Python's ``random.Random``).
"""

from __future__ import annotations

import random
from typing import Sequence

from mate_cli.modeling.layout import TableLayout

Range = tuple[int, int]

__all__ = ["Range", "filled_layout", "layout_from_cells", "random_layout", "shaped_layout"]


def _example_ids(query_len: int, cells: Sequence[Sequence[int]]) -> dict[str, list[int]]:
    """Id lists for one example. ``cells[r][c]`` = tokens of row r (0 = header), column c."""
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
    """A batch from explicit shapes.

    Args:
        query_lens: query tokens of each example, without [CLS] and [SEP].
        cells: per example, ``cells[r][c]`` = token count of row r (0 = header), column c
            (rows may be ragged).
        seq_len: padded length (at least the longest example); default: the longest
            example plus its ``pad``.
        pad: padding after each example (int or one per example) when ``seq_len`` is
            not given.
    """
    examples = [_example_ids(q, c) for q, c in zip(query_lens, cells)]
    pads = [pad] * len(examples) if isinstance(pad, int) else list(pad)
    if seq_len is None:
        seq_len = max(len(e["segment_ids"]) + p for e, p in zip(examples, pads))
    return TableLayout.from_lists(examples, seq_len)


def _draw_cells(rng: random.Random, rows: int, columns: int, cell_tokens: Range) -> list[list[int]]:
    """Token counts of a header row plus ``rows`` data rows of ``columns`` cells (row-major)."""
    return [[rng.randint(*cell_tokens) for _ in range(columns)] for _ in range(rows + 1)]


def shaped_layout(
    shapes: Sequence[tuple[int, int, int]], *, cell_tokens: Range = (1, 3), extra_pad: int = 0, seed: int = 0
) -> TableLayout:
    """One ``(query_len, rows, columns)`` per example (a header row is added), cells of
    ``cell_tokens`` tokens each; padded to the longest example plus ``extra_pad``."""
    rng = random.Random(seed)
    cells = [_draw_cells(rng, rows, columns, cell_tokens) for _, rows, columns in shapes]
    lengths = [q + 2 + sum(map(sum, c)) for (q, _, _), c in zip(shapes, cells)]
    return layout_from_cells([q for q, _, _ in shapes], cells, seq_len=max(lengths) + extra_pad)


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
    """A batch of random tables with different shapes and padding.

    Args:
        batch: number of examples.
        query_len: query tokens per example (without [CLS]/[SEP]).
        rows: data rows per example (a header row is always added).
        cols: columns per example.
        cell_tokens: tokens per cell, drawn per cell.
        pad: padding after each example; the batch is padded to the longest
            example-plus-padding.
        seed: makes the draw reproducible.
    """
    rng = random.Random(seed)
    query_lens, cells, pads = [], [], []
    for _ in range(batch):
        n_rows, n_cols = rng.randint(*rows), rng.randint(*cols)
        query_lens.append(rng.randint(*query_len))
        cells.append(_draw_cells(rng, n_rows, n_cols, cell_tokens))
        pads.append(rng.randint(*pad))
    return layout_from_cells(query_lens, cells, pad=pads)


def _fill_cells(budget: int, columns: int, cell_tokens: int, rng: random.Random) -> list[list[int]]:
    """Token counts ``cells[r][c]`` (row 0 = header) that exactly fill ``budget`` tokens."""
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
    """``batch`` realistic tables that each fill ``seq_len`` tokens exactly (no padding).

    ``query_tokens`` tokens for ``[CLS] query [SEP]`` (>= 2), ``columns`` columns and as
    many data rows as it takes; cells have a random number of tokens, uniform in
    ``[0.25, 1.75] x cell_tokens`` (multi-token cells, like HybridQA cells expanded with
    passage sentences), so rows and columns have ragged lengths; the last cell is
    trimmed so the table ends exactly at ``seq_len``. Example b is drawn with seed
    ``seed + b``. The defaults give ~2 rows at 512 tokens, ~34 at 8192, ~136 at 32768.
    """
    if query_tokens < 2 or seq_len <= query_tokens or columns < 1 or cell_tokens < 1:
        raise ValueError(
            f"no table fits: seq_len={seq_len}, query_tokens={query_tokens}, "
            f"columns={columns}, cell_tokens={cell_tokens}"
        )
    cells = [_fill_cells(seq_len - query_tokens, columns, cell_tokens, random.Random(seed + b)) for b in range(batch)]
    return layout_from_cells([query_tokens - 2] * batch, cells, seq_len=seq_len)
