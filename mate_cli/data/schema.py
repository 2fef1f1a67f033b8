"""Plain records the data pipeline passes around (before tensors).

``Question``/``Table``/``Cell`` mirror the upstream HybridQA files; ``EncodedExample``
is what tokenization produces (one question, plain Python lists, Arrow-friendly);
``Batch`` is what the collator hands the Lightning modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from mate_cli.modeling.layout import TableLayout


@dataclass
class Cell:
    """One table cell: its text and the ``/wiki/...`` links it carries."""

    text: str
    links: list[str] = field(default_factory=list)


@dataclass
class Table:
    """A WikiTables-WithLinks table. ``rows`` are the data rows (header excluded)."""

    table_id: str
    header: list[Cell]
    rows: list[list[Cell]]
    title: str = ""
    section_title: str = ""
    intro: str = ""

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_columns(self) -> int:
        return len(self.header)


@dataclass
class AnswerNode:
    """One traced answer source: ``coord`` = (data row, column), 0-based; ``source`` 'table'|'passage'."""

    text: str
    coord: tuple[int, int]
    link: Optional[str]
    source: str


@dataclass
class Question:
    question_id: str
    question: str
    table_id: str
    answer_text: Optional[str] = None
    answer_nodes: list[AnswerNode] = field(default_factory=list)


@dataclass
class EncodedExample:
    """One tokenized question + table.

    ``layout`` maps each :data:`~mate_cli.modeling.layout.ID_FIELDS` name to a per-token
    list as long as ``input_ids`` (collators pad it with ``TableLayout.from_lists``).
    ``cell_coords[k - 1]`` is the (data row, column) of cell id k; ``candidates`` are the
    cell ids (1-based) whose cell contains or links to the answer and survived truncation.
    Counts of what was left out: ``rows_dropped`` trailing data rows (over the row-id limit
    or the length budget), ``columns_dropped`` trailing columns (over the column-id limit),
    ``ranks_clipped`` cells whose (inverse) rank was clipped to the rank-id limit,
    ``candidates_dropped`` candidate cells without tokens.
    """

    question_id: str
    table_id: str
    input_ids: list[int]
    layout: dict[str, list[int]]
    cell_coords: list[list[int]]
    candidates: list[int]
    truncated: bool = False
    rows_dropped: int = 0
    candidates_dropped: int = 0
    columns_dropped: int = 0
    ranks_clipped: int = 0


@dataclass
class Batch:
    """A collated batch for cell selection.

    Attributes:
        input_ids: ``[batch, seq]`` WordPiece ids, padded with the pad id.
        layout: the `TableLayout` of those tokens.
        cell_mask: ``[batch, max_cells + 1]`` bool, True for cell ids that exist (index 0 unused).
        candidate_mask: ``[batch, max_cells + 1]`` bool, True for candidate cells.
        cell_coords: ``[batch, max_cells + 1, 2]`` (data row, column) of each cell id, -1 if none.
        question_ids / table_ids: per example.
    """

    input_ids: torch.Tensor
    layout: TableLayout
    cell_mask: torch.Tensor
    candidate_mask: torch.Tensor
    cell_coords: torch.Tensor
    question_ids: list[str]
    table_ids: list[str]

    def to(self, device) -> "Batch":
        return Batch(
            input_ids=self.input_ids.to(device),
            layout=self.layout.to(device),
            cell_mask=self.cell_mask.to(device),
            candidate_mask=self.candidate_mask.to(device),
            cell_coords=self.cell_coords.to(device),
            question_ids=self.question_ids,
            table_ids=self.table_ids,
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]
