"""Benchmark inputs: realistic tables that fill the sequence exactly (no padding, the worst case for every backend),
from :func:`mate_cli.modeling.synthetic.filled_layout`, with random input ids. Longer sequences get more rows (the
defaults: ~2 at 512 tokens, ~34 at 8192, ~136 at 32768) while cells stay HybridQA-sized."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from mate_cli.errors import MateError
from mate_cli.layout import TableLayout
from mate_cli.modeling.synthetic import filled_layout


@dataclass(frozen=True)
class TableShape:
    """How the benchmark table is drawn (``bench.table.*``)."""

    query_tokens: int = 60
    columns: int = 8
    cell_tokens: int = 30
    seed: int = 0

    def check(self) -> None:
        if self.query_tokens < 2:
            raise MateError(f"bench.table.query_tokens={self.query_tokens} must be >= 2 ([CLS] and [SEP])")
        if self.columns < 1 or self.cell_tokens < 1:
            raise MateError(
                f"bench.table.columns={self.columns} and bench.table.cell_tokens={self.cell_tokens} must be >= 1"
            )


def table_layout(seq_len: int, batch: int = 1, shape: TableShape | None = None) -> tuple[torch.Tensor, TableLayout]:
    """``(input_ids [batch, seq_len], layout)``: ``batch`` different tables, random non-special ids."""
    shape = shape or TableShape()
    shape.check()
    if seq_len <= shape.query_tokens:
        raise MateError(
            f"bench length {seq_len} leaves no room for a table after the {shape.query_tokens}-token query; "
            "use longer bench.lengths or a smaller bench.table.query_tokens"
        )
    generator = torch.Generator().manual_seed(shape.seed)
    input_ids = torch.randint(1000, 30000, (batch, seq_len), generator=generator)
    input_ids[:, 0], input_ids[:, shape.query_tokens - 1] = 101, 102  # [CLS], [SEP]
    return input_ids, filled_layout(seq_len, batch, **asdict(shape))


def describe(layout: TableLayout) -> dict[str, int]:
    """Shape summary of example 0: rows, columns, longest row and column (tokens), |Q|."""
    table = layout.is_table[0]
    rows, cols = layout.row_ids[0][table], layout.column_ids[0][table]
    return {
        "query": int(layout.is_query[0].sum()),
        "rows": int(rows.max()) if table.any() else 0,
        "columns": int(cols.max()) if table.any() else 0,
        "longest_row": int(torch.bincount(rows[rows > 0]).max()) if (rows > 0).any() else 0,
        "longest_column": int(torch.bincount(cols).max()) if table.any() else 0,
    }
