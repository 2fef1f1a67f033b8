"""Plain records the data pipeline passes around (before tensors).

``Question``/``Table``/``Cell`` mirror the upstream HybridQA files; ``EncodedExample``
is what tokenization produces (one question, plain Python lists, Arrow-friendly);
``Batch`` is what the collator hands the Lightning modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    """One question (or TabFact statement) about one table.

    HybridQA fills ``answer_text`` / ``answer_nodes``. The table tasks use:

    - ``answers``: the gold answer texts (WikiTQ ``targetValue`` split on ``|``; SQA
      ``answer_text``), already unescaped;
    - ``canonical_answers``: WikiTQ, the canonical form of each of ``answers`` (the tagged
      file's ``targetCanon``, which the official evaluator reads gold answers through);
      empty when not known (:mod:`mate_cli.metrics.wtq` then emulates them);
    - ``answer_coordinates``: gold answer cells as ``[data row, column]``, 0-based (SQA);
    - ``label``: TabFact's verdict, 1 entailed / 0 refuted;
    - ``sequence_id`` / ``position``: SQA's question sequence (``<id>/<annotator>``) and
      the 0-based position in it;
    - ``channel``: TabFact's ``simple`` / ``complex`` when the upstream id lists are present.
    """

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
    ``candidates_dropped`` candidate cells without tokens, ``columns_pruned`` columns removed
    by the HEM length heuristic, ``tokens_pruned`` table word pieces cut to fit the length
    budget (by whichever heuristic, the default fit included). ``full_length``: the tokens
    the input would take with nothing cut by the length budget ([CLS], the question as
    encoded, [SEP], every header and cell word piece within the id limits), the same for
    every ``max_length``: the long-table slice of an evaluation is read from it.
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


def moved_to(record, device):
    """A copy of the dataclass ``record`` with every field that has ``.to`` (tensors, layouts) on ``device``."""
    values = {f.name: getattr(record, f.name) for f in fields(record)}
    return type(record)(**{k: v.to(device) if hasattr(v, "to") else v for k, v in values.items()})


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
        """The same batch with every tensor (and the layout) on ``device``."""
        return moved_to(self, device)

    def select(self, index: list[int]) -> "Batch":
        """The sub-batch of the examples at ``index`` (in that order)."""
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
    """A collated batch of a table task (SQA, WikiTQ, TabFact): :class:`Batch` plus its supervision.

    Attributes:
        labels: ``[batch]`` TabFact verdicts (1 entailed, 0 refuted; -1 unknown).
        float_answer: ``[batch]`` the scalar answer (WikiTQ), NaN when the answer is not one number.
        cell_values: ``[batch, max_cells + 1]`` each cell's number (NaN: none; index 0 unused).
        answers: per example, the gold answer texts; answer_coordinates: the gold cells (SQA).
        canonical_answers: per example, the answers' canonical forms (WikiTQ; empty: not known).
        cell_texts: per example, the text of each cell id (WikiTQ: the denotation of a selection).
        sequence_ids / positions: SQA sequences (``None`` / 0 elsewhere).
        channels: TabFact's ``simple``/``complex`` or ``None``.
        full_lengths: per example, its length with nothing cut (``EncodedExample.full_length``).
    """

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
    """A collated batch for masked-LM pre-training.

    Attributes:
        input_ids: ``[batch, seq]`` WordPiece ids after masking, padded with the pad id.
        labels: ``[batch, seq]`` the original id at predicted positions, -100 elsewhere.
        layout: the `TableLayout` of those tokens.
        sources: per example, where it came from (``hybridqa:<table>#passage1``, ``<file>:<line>``).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    layout: TableLayout
    sources: list[str]

    to = Batch.to  # the same generic field-wise move and length as Batch
    __len__ = Batch.__len__


def has_answer(question: Question) -> bool:
    """Whether a question carries any gold answer (a released test split carries none)."""
    return bool(
        question.answer_text
        or question.answer_nodes
        or question.answers
        or question.answer_coordinates
        or question.label is not None
    )
