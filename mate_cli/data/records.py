"""Plain records the data pipeline passes around: questions, tables, encoded examples and batches."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

import torch

from mate_cli.layout import TableLayout


@dataclass
class Cell:
    """One table cell: its text and the ``/wiki/...`` links it carries."""

    text: str
    links: list[str] = field(default_factory=list)


@dataclass
class Table:
    """``rows`` are the data rows (header excluded). ``title``, ``section_title``, ``intro``: HybridQA's page text
    (TabFact's caption is its ``title``)."""

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
    """One traced HybridQA answer source: ``coord`` = (data row, column); ``source`` 'table'|'passage'."""

    text: str
    coord: tuple[int, int]
    link: Optional[str]
    source: str


@dataclass
class Question:
    """One question (or TabFact statement) about one table. HybridQA fills ``answer_text`` / ``answer_nodes``; the
    table tasks fill ``answers`` (the gold texts, unescaped) and, per task, ``canonical_answers`` (WikiTQ; empty:
    unknown), ``answer_coordinates`` / ``sequence_id`` / ``position`` (SQA; 0-based), ``label`` (TabFact: 1 entailed,
    0 refuted) and ``channel`` (TabFact's ``simple`` / ``complex``; None: unknown)."""

    question_id: str
    question: str
    table_id: str
    answer_text: Optional[str] = None
    answer_nodes: list[AnswerNode] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    canonical_answers: list[str] = field(default_factory=list)
    answer_coordinates: list[list[int]] = field(default_factory=list)
    label: Optional[int] = None
    sequence_id: Optional[str] = None
    position: int = 0
    channel: Optional[str] = None

    @property
    def answered(self) -> bool:
        """Whether it carries a gold answer of its task's kind (a released test file's questions do not)."""
        answer = self.answer_text or self.answer_nodes or self.answers or self.answer_coordinates
        return bool(answer or self.label is not None)


@dataclass
class EncodedExample:
    """One tokenized question + table as plain lists (Arrow-friendly); :mod:`mate_cli.data.tokenize` makes it.

    ``layout`` maps each :data:`~mate_cli.layout.ID_FIELDS` name to a list as long as ``input_ids``.
    ``cell_coords[k - 1]`` is the (data row, column) of cell id k; ``candidates`` are the cell ids of answer cells that
    kept a token. Counts: ``rows_dropped`` trailing data rows (row-id limit or budget), ``columns_dropped`` (column-id
    limit), ``candidates_dropped`` (answer cells without a token), ``columns_pruned`` (HEM), ``tokens_pruned`` (table
    word pieces cut by the budget). ``full_length``: the length with nothing cut by the budget (the question as cut,
    the table within the id limits), the same for every ``max_length``.
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
    columns_pruned: int = 0
    tokens_pruned: int = 0
    full_length: int = 0


@dataclass
class Batch:
    """A collated cell-selection batch: ``input_ids`` ``[batch, seq]``; per cell id, ``[batch, max_cells + 1]`` (index 0
    unused): ``cell_mask`` (the cell exists), ``candidate_mask``, ``cell_coords`` ``[..., 2]`` (data row, column; -1:
    none)."""

    input_ids: torch.Tensor
    layout: TableLayout
    cell_mask: torch.Tensor
    candidate_mask: torch.Tensor
    cell_coords: torch.Tensor
    question_ids: list[str]
    table_ids: list[str]

    def to(self, device) -> "Batch":
        """A copy with every field that has ``.to`` on ``device`` (also the ``to`` of the other batch classes); copies
        to a GPU do not block the host (:meth:`TableLayout.to`)."""
        target = torch.device(device)
        kwargs = {"non_blocking": True} if target.type == "cuda" else {}
        return self._map(lambda v: v.to(target, **kwargs) if isinstance(v, torch.Tensor) else v.to(target))

    def pin_memory(self) -> "Batch":
        """A copy with every tensor in page-locked memory (the DataLoader's ``pin_memory``; also the other batch
        classes')."""
        return self._map(lambda v: v.pin_memory())

    def _map(self, fn) -> "Batch":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return type(self)(**{k: fn(v) if isinstance(v, (torch.Tensor, TableLayout)) else v for k, v in values.items()})

    def select(self, index: list[int]) -> "Batch":
        """The sub-batch of the examples at ``index``, in that order."""
        rows = torch.tensor(index, dtype=torch.long, device=self.input_ids.device)
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (torch.Tensor, TableLayout)):
                out[f.name] = value.select(rows) if isinstance(value, TableLayout) else value[rows]
            elif isinstance(value, list) and len(value) == len(self):
                out[f.name] = [value[i] for i in index]
            else:
                out[f.name] = value
        return type(self)(**out)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class TaskBatch(Batch):
    """A table task's batch: :class:`Batch` plus its supervision. ``labels`` ``[batch]``: TabFact verdicts (-1
    unknown); ``float_answer`` ``[batch]``: WikiTQ's scalar answer (NaN: not one number); ``cell_values``
    ``[batch, max_cells + 1]``: each cell's number (NaN: none). The per-example lists are as on :class:`Question`;
    ``cell_texts`` are each cell id's text (WikiTQ's denotation)."""

    labels: Optional[torch.Tensor] = None
    float_answer: Optional[torch.Tensor] = None
    cell_values: Optional[torch.Tensor] = None
    answers: list = field(default_factory=list)
    canonical_answers: list = field(default_factory=list)
    answer_coordinates: list = field(default_factory=list)
    cell_texts: list = field(default_factory=list)
    sequence_ids: list = field(default_factory=list)
    positions: list = field(default_factory=list)
    channels: list = field(default_factory=list)
    full_lengths: list = field(default_factory=list)


@dataclass
class MaskedBatch:
    """A collated masked-LM batch: ``input_ids`` ``[batch, seq]`` after masking, ``labels`` ``[batch, seq]`` the
    original id at predicted positions and -100 elsewhere, per example its ``source`` (``hybridqa:<table>#passage1``,
    ``<file>:<line>``)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    layout: TableLayout
    sources: list[str]

    to, pin_memory, _map = Batch.to, Batch.pin_memory, Batch._map
    __len__ = Batch.__len__
