"""Random, realistic `TableLayout`s for tests (shared by every attention/encoder test).

Every example is laid out the way ``mate_cli.data.tokenize`` lays out TAPAS input::

    [CLS] query tokens [SEP] | header row | data row 1 | ... | data row R | padding

- query, [CLS], [SEP]: segment 0, row 0, column 0, cell 0 (the query set Q);
- header cells: segment 1, row 0, column c (1-based), cell 0;
- data cells: segment 1, row r (1-based), column c, cell k (row-major, 1-based);
- every cell spans one or more tokens; padding comes last (``attention_mask`` False,
  every id 0).

Three entry points, simplest first:

- :func:`random_layout` — a batch of tables with different shapes and padding;
  every range is an inclusive ``(low, high)`` pair drawn per example (per cell for
  ``cell_tokens``). Deterministic for a given ``seed``.
- :func:`long_table_layout` — one realistic long table that fills ``seq_len``
  (benchmarks: a 60-token query and 30 x 8 multi-token cells at 8192 tokens).
- :func:`build_layout` — from explicit per-example cell lengths, when a test needs
  an exact shape (e.g. one row longer than the attention radius).
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from mate_cli.modeling.layout import TableLayout

Range = tuple[int, int]

__all__ = ["build_layout", "random_layout", "long_table_layout", "max_segment_lengths"]


def _example_ids(query_len: int, cells: Sequence[Sequence[int]]) -> dict[str, list[int]]:
    """Id lists for one example. ``cells[r][c]`` = tokens of row r (0 = header), column c."""
    n_query = query_len + 2  # [CLS] ... [SEP]
    ids = {name: [0] * n_query for name in ("segment_ids", "row_ids", "column_ids", "cell_ids")}
    cell_id = 0
    for r, row in enumerate(cells):
        for c, length in enumerate(row):
            if r > 0:
                cell_id += 1
            values = (("segment_ids", 1), ("row_ids", r), ("column_ids", c + 1), ("cell_ids", cell_id if r > 0 else 0))
            for name, value in values:
                ids[name] += [value] * length
    return ids


def build_layout(
    query_lens: Sequence[int],
    cells: Sequence[Sequence[Sequence[int]]],
    seq_len: int | None = None,
    pad: int | Sequence[int] = 0,
) -> TableLayout:
    """A batch from explicit shapes.

    Args:
        query_lens: query tokens of each example, without [CLS] and [SEP].
        cells: per example, ``cells[r][c]`` = token count of row r (0 = header), column c.
        seq_len: padded length; default: the longest example plus its ``pad``.
            Examples longer than ``seq_len`` are truncated (trailing table tokens dropped).
        pad: extra padding at the end of the longest example (int or one per example)
            when ``seq_len`` is not given.
    """
    examples = [_example_ids(q, c) for q, c in zip(query_lens, cells)]
    pads = [pad] * len(examples) if isinstance(pad, int) else list(pad)
    if seq_len is None:
        seq_len = max(len(e["segment_ids"]) + p for e, p in zip(examples, pads))
    fields = {name: torch.zeros(len(examples), seq_len, dtype=torch.long) for name in examples[0]}
    mask = torch.zeros(len(examples), seq_len, dtype=torch.bool)
    for b, example in enumerate(examples):
        n = min(len(example["segment_ids"]), seq_len)
        mask[b, :n] = True
        for name, values in example.items():
            fields[name][b, :n] = torch.tensor(values[:n], dtype=torch.long)
    return TableLayout(attention_mask=mask, **fields)


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
        pad: padding after each example, beyond the longest example's end.
        seed: makes the draw reproducible.
    """
    rng = random.Random(seed)
    draw = lambda r: rng.randint(r[0], r[1])  # noqa: E731
    query_lens, cells, pads = [], [], []
    for _ in range(batch):
        n_rows, n_cols = draw(rows), draw(cols)
        query_lens.append(draw(query_len))
        cells.append([[draw(cell_tokens) for _ in range(n_cols)] for _ in range(n_rows + 1)])
        pads.append(draw(pad))
    lengths = [q + 2 + sum(map(sum, c)) for q, c in zip(query_lens, cells)]
    seq_len = max(n + p for n, p in zip(lengths, pads))
    return build_layout(query_lens, cells, seq_len=seq_len)


def long_table_layout(
    seq_len: int = 8192,
    *,
    batch: int = 1,
    query_len: int = 58,
    rows: int = 30,
    cols: int = 8,
    fill: float = 1.0,
    seed: int = 0,
) -> TableLayout:
    """A realistic long table that fills ``fill * seq_len`` tokens (rest is padding).

    Cells get random lengths (1 .. 2 x the mean) so that the header, ``rows`` data rows
    and ``cols`` columns together fill the budget; the default is a 60-token query
    ([CLS] + 58 + [SEP]) and a 30 x 8 table at 8192 tokens (~33 tokens per cell).
    """
    rng = random.Random(seed)
    budget = int(fill * seq_len) - (query_len + 2)
    n_cells = (rows + 1) * cols
    mean = budget / n_cells
    cells = []
    for _ in range(batch):
        lengths = [max(1, int(rng.uniform(0.25, 1.75) * mean)) for _ in range(n_cells)]
        scale = budget / sum(lengths)
        lengths = [max(1, int(x * scale)) for x in lengths]
        lengths[-1] += budget - sum(lengths)
        cells.append([lengths[r * cols : (r + 1) * cols] for r in range(rows + 1)])
    return build_layout([query_len] * batch, cells, seq_len=seq_len)


def max_segment_lengths(layout: TableLayout) -> dict[str, int]:
    """Longest query set, row and column (in tokens) over the batch.

    ``{"query": max |Q|, "row": longest row, "column": longest column}``; useful to
    check whether MATE's bucketed approximation is exact (|Q| <= G, segments <= R).
    """
    out = {"query": int(layout.is_query.sum(1).max())}
    for view in ("row", "column"):
        ids = layout.view_ids(view)
        longest = 0
        for b in range(layout.batch_size):
            table = layout.is_table[b]
            if table.any():
                longest = max(longest, int(torch.bincount(ids[b][table]).max()))
        out[view] = longest
    return out
