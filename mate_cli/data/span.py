"""PointR stage 2 data (MATE paper §4.2): one expanded cell and the question -> the span model's input.

``[CLS] question [SEP] cell text ( every sentence of each linked passage ) [SEP]``; the question is cut to
``max_question_tokens``, then the context to what is left of ``max_length`` (paper: the first 512). Gold span: the
**first** occurrence of the answer in the context; examples whose answer is not in the kept window are counted,
skipped for training and kept for evaluation.

Cells: training takes ``all`` gold cells, one example each, or the ``first`` (``train_cells``); validation and test
one per question, the first whose context contains the answer, else the first. The split is stage 1's.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from functools import cached_property

import torch

from mate_cli.data.datamodule import Collator, SplitDataModule, question_from_record
from mate_cli.data.expand import format_expanded, split_sentences
from mate_cli.data.hybridqa import HybridQAReader
from mate_cli.metrics.normalize import answer_words
from mate_cli.data.records import Batch, Cell, Question
from mate_cli.data.tokenize import candidate_cells
from mate_cli.errors import MateError
from mate_cli.pretrained import load_tokenizer
from mate_cli.layout import TableLayout, batch_width, padded

log = logging.getLogger(__name__)

TRAIN_CELLS = ("all", "first")


def cell_context(cell: Cell, passages: dict[str, str]) -> tuple[str, int]:
    """``(context text, links without a passage)``."""
    sentences: list[str] = []
    missing = 0
    for link in dict.fromkeys(cell.links):
        if link in passages:
            sentences.extend(split_sentences(passages[link]))
        else:
            missing += 1
    return format_expanded(cell.text.strip(), sentences), missing


def find_answer_span(context: str, answer: str | None) -> tuple[int, int] | None:
    """Char span ``[start, end)`` of the first occurrence of ``answer``, word by word."""
    target = [w for w, _, _ in answer_words(answer or "")]
    if not target:
        return None
    words = answer_words(context)
    n = len(target)
    for i in range(len(words) - n + 1):
        if words[i][0] == target[0] and [w for w, _, _ in words[i : i + n]] == target:
            return words[i][1], words[i + n - 1][2]
    return None


@dataclass
class SpanExample:
    """One encoded (question, cell) pair. ``offsets[j]``: token j's char span in ``context`` (``[0, 0]`` outside it).
    ``gold_start``/``gold_end``: token indices, -1 when the answer is not in the kept window. ``has_gold_cell`` False:
    a placeholder for a question without one (counted, never batched)."""

    question_id: str
    table_id: str
    coord: list[int]
    answer: str
    context: str
    input_ids: list[int] = field(default_factory=list)
    layout: dict[str, list[int]] = field(default_factory=lambda: {"segment_ids": []})
    context_mask: list[int] = field(default_factory=list)
    start_ok: list[int] = field(default_factory=list)
    end_ok: list[int] = field(default_factory=list)
    offsets: list[list[int]] = field(default_factory=list)
    gold_start: int = -1
    gold_end: int = -1
    answer_in_context: bool = False
    context_truncated: bool = False
    missing_passages: int = 0
    has_gold_cell: bool = True


def encode_span_example(
    tokenizer,
    question: Question,
    coord: tuple[int, int],
    context: str,
    max_length: int = 512,
    max_question_tokens: int = 64,
    missing_passages: int = 0,
) -> SpanExample:
    if max_length < 4:
        raise MateError(f"dataset.max_length={max_length} leaves no room for the context; use >= 4 (paper: 512)")
    q_ids = tokenizer(question.question, add_special_tokens=False, verbose=False)["input_ids"][:max_question_tokens]
    enc = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    room = max(0, max_length - 3 - len(q_ids))
    ctx_ids, ctx_offsets, word_ids = enc["input_ids"], enc["offset_mapping"], enc.word_ids()
    keep = min(room, len(ctx_ids))
    prefix = len(q_ids) + 2
    input_ids = [tokenizer.cls_token_id, *q_ids, tokenizer.sep_token_id, *ctx_ids[:keep], tokenizer.sep_token_id]
    n = len(input_ids)
    start_ok, end_ok = [0] * n, [0] * n
    for j in range(keep):
        start_ok[prefix + j] = int(j == 0 or word_ids[j] != word_ids[j - 1])
        end_ok[prefix + j] = int(j + 1 == len(ctx_ids) or word_ids[j] != word_ids[j + 1])
    offsets = [[0, 0]] * prefix + [list(o) for o in ctx_offsets[:keep]] + [[0, 0]]
    example = SpanExample(
        question_id=question.question_id,
        table_id=question.table_id,
        coord=list(coord),
        answer=question.answer_text or "",
        context=context,
        input_ids=input_ids,
        layout={"segment_ids": [0] * prefix + [1] * (n - prefix)},
        context_mask=[0] * prefix + [1] * keep + [0],
        start_ok=start_ok,
        end_ok=end_ok,
        offsets=offsets,
        context_truncated=keep < len(ctx_ids),
        missing_passages=missing_passages,
    )
    span = find_answer_span(context, question.answer_text)
    example.answer_in_context = span is not None
    if span is not None:
        tokens = _char_span_to_tokens(ctx_offsets[:keep], *span)
        if tokens is not None:
            example.gold_start, example.gold_end = prefix + tokens[0], prefix + tokens[1]
    return example


def _char_span_to_tokens(offsets, start: int, end: int) -> tuple[int, int] | None:
    """First token ending after ``start`` .. last token starting before ``end`` (None if cut off)."""
    first = next((j for j, (s, e) in enumerate(offsets) if e > start and e > s), None)
    last = next(
        (j for j in range(len(offsets) - 1, -1, -1) if offsets[j][0] < end and offsets[j][1] > offsets[j][0]), None
    )
    return None if first is None or last is None or last < first or offsets[last][1] < end else (first, last)


def span_text(context: str, offsets: list[list[int]], start: int, end: int) -> str:
    """The context text of tokens ``start..end`` (inclusive); ``""`` for no span."""
    return "" if start < 0 or end < start else context[offsets[start][0] : offsets[end][1]].strip()


@dataclass
class SpanBatch:
    """Token tensors ``[batch, seq]``, ``gold_start``/``gold_end`` ``[batch]`` (-1: none). The layout holds segment ids
    only (0 query, 1 context): the span model sees no table structure."""

    input_ids: torch.Tensor
    layout: TableLayout
    context_mask: torch.Tensor
    start_ok: torch.Tensor
    end_ok: torch.Tensor
    gold_start: torch.Tensor
    gold_end: torch.Tensor
    question_ids: list[str]
    answers: list[str]
    contexts: list[str]
    offsets: list[list[list[int]]]
    coords: list[list[int]]

    to, pin_memory, _map = Batch.to, Batch.pin_memory, Batch._map
    __len__ = Batch.__len__

    def texts(self, start: torch.Tensor, end: torch.Tensor) -> list[str]:
        """Span texts of per-example token indices ``start``/``end`` ``[batch]``."""
        return [span_text(c, o, int(s), int(e)) for c, o, s, e in zip(self.contexts, self.offsets, start, end)]


class SpanCollator(Collator):
    def __call__(self, examples: list[dict]) -> SpanBatch:
        lists = [ex["input_ids"] for ex in examples]
        ids = padded(lists, self.pad_id, width=batch_width(lists, self.multiple, self.cap))
        seq = ids.shape[1]
        flags = {
            k: padded([ex[k] for ex in examples], False, torch.bool, seq)
            for k in ("context_mask", "start_ok", "end_ok")
        }
        return SpanBatch(
            input_ids=ids,
            layout=TableLayout.from_lists([ex["layout"] for ex in examples], seq),
            **flags,
            gold_start=torch.tensor([int(ex["gold_start"]) for ex in examples]),
            gold_end=torch.tensor([int(ex["gold_end"]) for ex in examples]),
            question_ids=[ex["question_id"] for ex in examples],
            answers=[ex["answer"] for ex in examples],
            contexts=[ex["context"] for ex in examples],
            offsets=[ex["offsets"] for ex in examples],
            coords=[list(ex["coord"]) for ex in examples],
        )


@dataclass
class _SpanEncoder:
    root: str
    pretrained: str
    max_length: int
    max_question_tokens: int
    cells: str

    @cached_property
    def _state(self) -> tuple:
        return HybridQAReader(self.root), load_tokenizer(self.pretrained)

    def __call__(self, record: dict) -> list[dict]:
        files, tokenizer = self._state
        question = question_from_record(record)
        table = files.table(question.table_id)
        passages = files.passages(question.table_id)
        coords = candidate_cells(question, table, passages)
        if not coords:
            answer = question.answer_text or ""
            return [
                asdict(SpanExample(question.question_id, question.table_id, [-1, -1], answer, "", has_gold_cell=False))
            ]
        contexts = {xy: cell_context(table.rows[xy[0]][xy[1]], passages) for xy in coords}
        if self.cells == "validation":
            with_answer = [xy for xy in coords if find_answer_span(contexts[xy][0], question.answer_text)]
            coords = (with_answer or coords)[:1]
        elif self.cells == "first":
            coords = coords[:1]
        lengths = self.max_length, self.max_question_tokens
        return [
            asdict(encode_span_example(tokenizer, question, xy, contexts[xy][0], *lengths, contexts[xy][1]))
            for xy in coords
        ]


class SpanDataModule(SplitDataModule):
    """PointR stage-2 data. ``max_span_length`` is only for the stats (gold spans longer than the head's band)."""

    kind = "span"

    def __init__(self, *, max_span_length: int | None = None, train_cells: str = "all", **common) -> None:
        super().__init__(**common)
        if train_cells not in TRAIN_CELLS:
            raise MateError(f"dataset.train_cells={train_cells!r} is invalid; use one of {TRAIN_CELLS}")
        self.max_span_length, self.train_cells = max_span_length, train_cells

    def cells_mode(self, split: str) -> str:
        return self.train_cells if split == "train" else "validation"

    def cache_payload(self, split: str) -> dict:
        return {"cells": self.cells_mode(split)}

    def encode(self, questions: list[Question], split: str):
        encoder = _SpanEncoder(
            self.root, self.pretrained, self.max_length, self.max_question_tokens, self.cells_mode(split)
        )
        return self._map(questions, encoder, split)

    def split_stats(self, ds) -> dict:
        names = ["question_id", "has_gold_cell", "answer_in_context", "gold_start", "gold_end", "context_truncated",
                 "missing_passages"]  # fmt: skip
        rows = ds.select_columns(names).to_list()
        real = [r for r in rows if r["has_gold_cell"]]
        stats = {
            "questions": len({r["question_id"] for r in rows}),
            "questions_without_gold_cell": sum(not r["has_gold_cell"] for r in rows),
            "examples": len(real),
            "answer_in_context": sum(r["answer_in_context"] for r in real),
            "answer_in_window": sum(r["gold_start"] >= 0 for r in real),
            "context_truncated": sum(r["context_truncated"] for r in real),
            "missing_passage_links": sum(r["missing_passages"] for r in real),
        }
        if self.max_span_length:
            stats["gold_longer_than_max_span"] = sum(
                r["gold_start"] >= 0 and r["gold_end"] - r["gold_start"] >= self.max_span_length for r in real
            )
        return stats

    def usable_rows(self, split: str, ds) -> list[int] | None:
        """Rows with a gold cell; for training, only those whose answer is in the window."""
        if not len(ds):
            return None
        flags = ds.select_columns(["has_gold_cell", "gold_start"]).to_list()
        if split != "train":
            return [i for i, r in enumerate(flags) if r["has_gold_cell"]]
        keep = [i for i, r in enumerate(flags) if r["has_gold_cell"] and r["gold_start"] >= 0]
        if len(keep) < len(ds):
            log.info(
                "span train: %d examples skipped (no gold cell, or answer not in the context window)",
                len(ds) - len(keep),
            )
        if not keep:
            raise MateError(
                "no span training example has the answer in its context; check dataset.root and dataset.max_length"
            )
        return keep

    def collator(self) -> SpanCollator:
        return SpanCollator(self.pad_id, **self.width())
