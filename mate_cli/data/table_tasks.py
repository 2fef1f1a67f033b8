"""The table tasks of MATE's Table 4 (SQA, WikiTQ, TabFact), supervised as TAPAS does:

- **SQA**: the gold ``answer_coordinates`` are the answer cells; ``prev_labels`` mark the previous question's gold
  answer cells (at evaluation, the model's own previous prediction: :mod:`mate_cli.lit_modules.table_qa`).
- **WikiTQ** (weak supervision): the answer cells are those that, selected alone, the official metric would match to a
  gold answer; every gold value must be found, else none is used. ``float_answer`` is the answer when it is one number
  (else NaN), and every cell carries TAPAS's numeric value for the expected aggregation result.
- **TabFact**: the statement is the question; the label is the verdict.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Literal, Mapping

import torch

from mate_cli import tasks
from mate_cli.data.datamodule import Collator, SplitDataModule, question_from_record
from mate_cli.data.numbers import FLOAT32_MAX, TableNumbers
from mate_cli.data.other_tables import EVAL_TABLES, PAIRING, with_other_tables
from mate_cli.data.records import Batch, Question, Table, TaskBatch
from mate_cli.data.tokenize import PRUNING_CHOICES, TableTokenizer, check_linearization
from mate_cli.errors import MateError, check_choice
from mate_cli.metrics.wtq import CANON_EMULATION, predicted_values, target_values
from mate_cli.pretrained import load_tokenizer
from mate_cli.layout import padded
from mate_cli.tasks import TableTask

log = logging.getLogger(__name__)

AMBIGUOUS_ANSWERS = ("first", "all", "drop")
Coord = tuple[int, int]


def answer_matches(task: TableTask, question: Question, table: Table) -> list[list[Coord]]:
    """Per gold answer item, the (data row, column) cells that supervise it, in row order; ``[]`` when some item is
    found in no cell. Gold cells (SQA): one each."""
    if task.answer == "cells":
        return [[cell] for cell in sorted({(int(r), int(c)) for r, c in question.answer_coordinates})]
    if task.answer != "texts" or not question.answers:
        return []
    cells = {
        (r, c): predicted_values([cell.text])[0]
        for r, row in enumerate(table.rows)
        for c, cell in enumerate(row)
        if cell.text.strip()
    }
    found = []
    for target in target_values(question.answers, question.canonical_answers):
        hits = sorted(coord for coord, value in cells.items() if target.match(value))
        if not hits:
            return []
        found.append(hits)
    return found


def first_cell_per_answer(example: dict, matches: list[list[Coord]]) -> None:
    """``ambiguous_answers=first``: one candidate per answer item, its first cell in row order that kept a token and is
    not an earlier item's; an item without one counts as cut."""
    cell_of = {tuple(xy): k + 1 for k, xy in enumerate(example["cell_coords"])}
    chosen: list[int] = []
    for hits in matches:
        free = [cell_of[c] for c in hits if c in cell_of and cell_of[c] not in chosen]
        if free:
            chosen.append(free[0])
    example["candidates"] = sorted(chosen)
    example["candidates_dropped"] = len(matches) - len(chosen)


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


def answer_float(text: str) -> float:
    """An answer text as TAPAS reads a WikiTQ answer as a number, else NaN (also beyond float32): thousands separators
    removed (``1,484,900``), one other comma a decimal comma (``5,5``); ``3rd``, units and words are not numbers."""
    text = text.strip()
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    elif text.count(",") == 1 and "." not in text:
        text = text.replace(",", ".")
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) and abs(value) <= FLOAT32_MAX else math.nan


def scalar_answer(task: TableTask, question: Question) -> float:
    return answer_float(question.answers[0]) if task.aggregates and len(question.answers) == 1 else math.nan


def cell_numbers(table: Table, coords: list[list[int]]) -> list[float]:
    """TAPAS's numeric value of each listed cell (NaN: none)."""
    columns = TableNumbers.of([[c.text for c in row] for row in table.rows]).columns
    values = (columns[c].get(r) if c < len(columns) else None for r, c in coords)
    return [float(value) if isinstance(value, (int, float)) else math.nan for value in values]


def previous_answers(questions: list[Question]) -> dict[str, list[Coord]]:
    """SQA: question id -> the gold answer cells of the previous question of its sequence."""
    steps = {(q.sequence_id, q.position): q for q in questions if q.sequence_id is not None}
    return {
        q.question_id: sorted({(int(r), int(c)) for r, c in prev.answer_coordinates})
        for (sequence, position), q in steps.items()
        if (prev := steps.get((sequence, position - 1))) is not None
    }


def encode_task_question(
    tokenizer: TableTokenizer,
    task: TableTask,
    question: Question,
    table: Table,
    prev: list[Coord] | None = None,
    ambiguous_answers: str = "all",
) -> dict:
    """An ``EncodedExample`` dict plus its supervision."""
    matches = answer_matches(task, question, table)
    cells = sorted({cell for hits in matches for cell in hits})
    example = asdict(tokenizer.encode(question, table, candidates=cells, prev_answer_coords=prev))
    ambiguous = any(len(hits) > 1 for hits in matches)
    if ambiguous and ambiguous_answers == "first":
        first_cell_per_answer(example, matches)
    kept = {tuple(xy) for xy in example["cell_coords"]}
    example.update(
        label=-1 if question.label is None else int(question.label),
        float_answer=scalar_answer(task, question),
        cell_values=cell_numbers(table, example["cell_coords"]) if task.aggregates else [],
        answers=list(question.answers),
        canonical_answers=list(question.canonical_answers),
        cell_texts=[table.rows[r][c].text for r, c in example["cell_coords"]] if task.answer == "texts" else [],
        answer_coordinates=[list(map(int, c)) for c in question.answer_coordinates],
        has_answer_cells=bool(cells),
        ambiguous_answer=ambiguous,
        # answer items none of whose cells kept a token (a copy of an answer cut elsewhere is no loss)
        answers_cut=sum(1 for hits in matches if not any(cell in kept for cell in hits)),
        sequence_id=question.sequence_id or "",
        position=int(question.position),
        channel=question.channel or "",
    )
    return example


def table_tokenizer(tokenizer, settings: Mapping) -> TableTokenizer:
    """The ``TableTokenizer`` of a table task's ``dataset`` settings; training and ``mate predict`` (a run's config,
    older runs' missing keys at their defaults) both build it here, so one run encodes one way."""
    return TableTokenizer(
        tokenizer,
        max_length=int(settings["max_length"]),
        max_question_tokens=int(settings["max_question_tokens"]),
        pruning=str(settings.get("pruning", "none")),
        empty_cell_token=bool(settings.get("empty_cell_token", True)),
        linearization=str(settings.get("linearization", "tapas")),
    )


@dataclass
class _TaskEncoder:
    """A question record -> its encoded example; the reader and tokenizer are made at the first record."""

    task: TableTask
    root: str
    tokenizer_args: dict
    prev: dict[str, list[Coord]]
    ambiguous_answers: str = "all"

    @cached_property
    def _state(self) -> tuple:
        tokenizer = table_tokenizer(load_tokenizer(self.tokenizer_args["pretrained"]), self.tokenizer_args)
        return self.task.make_reader(self.root), tokenizer

    def __call__(self, record: dict) -> dict:
        reader, tokenizer = self._state
        question = question_from_record(record)
        table, prev = reader.table(question.table_id), self.prev.get(question.question_id)
        return encode_task_question(tokenizer, self.task, question, table, prev, self.ambiguous_answers)


class TableTaskDataModule(SplitDataModule):
    """SQA, WikiTQ or TabFact data for the TAPAS heads. ``ambiguous_answers``, for WikiTQ answer items found in several
    cells: ``first`` labels the first copy in row order (as TAPAS), ``all`` every copy, ``drop`` every copy and leaves
    the question out of training. ``drop_cut_answers``: drop training questions with an answer item none of whose cells
    survived the length cut. ``eval_tables``: ``shuffled`` pairs each validation and test statement with another table
    of its split (:mod:`mate_cli.data.other_tables`; TabFact only)."""

    def __init__(
        self,
        *,
        task: str,
        pruning: str = "none",
        empty_cell_token: bool = True,
        long_table_tokens: int | None = None,
        ambiguous_answers: Literal["first", "all", "drop"] = "all",
        drop_cut_answers: bool = False,
        linearization: str = "tapas",
        eval_tables: Literal["own", "shuffled"] = "own",
        **common,
    ) -> None:
        self.task = tasks.get(task)
        check_choice("dataset.eval_tables", eval_tables, EVAL_TABLES)
        if eval_tables != "own" and self.task.answer != "verdict":
            raise MateError(
                f"dataset.eval_tables={eval_tables} pairs each statement with another table: a verdict keeps its "
                f"meaning there, {self.task.name}'s answers (cells of their own table) do not; use it on a TabFact run"
            )
        self.eval_tables = eval_tables
        check_choice("dataset.pruning", pruning, PRUNING_CHOICES)
        check_choice("dataset.ambiguous_answers", ambiguous_answers, AMBIGUOUS_ANSWERS)
        self.pruning, self.empty_cell_token = pruning, bool(empty_cell_token)
        self.ambiguous_answers, self.drop_cut_answers = ambiguous_answers, bool(drop_cut_answers)
        self.linearization = str(linearization)
        check_linearization(self.linearization, pruning)
        self.long_table_tokens = None if long_table_tokens is None else int(long_table_tokens)
        super().__init__(**common)
        self.kind = self.task.name

    def make_reader(self, root: str):
        return self.task.make_reader(root)

    def questions(self, split: str) -> list[Question]:
        chosen = super().questions(split)
        if self.eval_tables == "shuffled" and split in ("validation", "test") and chosen:
            return with_other_tables(chosen, f"the {split} split of {self.root}")
        return chosen

    def cache_payload(self, split: str) -> dict:
        # WikiTQ's answer cells depend on the gold-side canonical forms (their emulation included)
        canon = CANON_EMULATION if self.task.answer == "texts" else None
        shuffled = self.eval_tables != "own" and split in ("validation", "test")
        return {
            **({"eval_tables": PAIRING} if shuffled else {}),  # the own tables' entries keep their keys
            "task": self.task.name,
            "pruning": self.pruning,
            "empty_cell_token": self.empty_cell_token,
            "linearization": self.linearization,
            "canon_emulation": canon,
            # which copies of an answer are candidates (drop labels every copy, as all does)
            "one_cell_per_answer": self.task.answer == "texts" and self.ambiguous_answers == "first",
        }

    def tokenizer_args(self) -> dict:
        names = ("pretrained", "max_length", "max_question_tokens", "pruning", "empty_cell_token", "linearization")
        return {name: getattr(self, name) for name in names}

    def encode(self, questions: list[Question], split: str):
        encoder = _TaskEncoder(
            self.task, self.root, self.tokenizer_args(), previous_answers(questions), self.ambiguous_answers
        )
        return self._map(questions, encoder, split)

    def split_stats(self, ds) -> dict:
        """``answer_cells_kept``: the share of the questions with answer cells whose every answer cell kept a token
        (WikiTQ's scalar answers not counted); ``answer_cells_kept_long`` the same over the ``long_questions``, whose
        whole input is longer than ``long_table_tokens`` (the model's ``<stage>/accuracy_long`` questions)."""
        n = len(ds)
        with_cells = [i for i, has in enumerate(ds["has_answer_cells"]) if has]
        dropped = ds["candidates_dropped"]

        def kept_share(questions: list[int]) -> float | None:
            return round(sum(1 for i in questions if int(dropped[i]) == 0) / len(questions), 4) if questions else None

        stats = {
            "questions": n,
            "fit_without_truncation": round(1 - sum(bool(t) for t in ds["truncated"]) / n, 4),
            "questions_with_answer_cells": len(with_cells),
            "answer_cells_kept": kept_share(with_cells),
            "rows_dropped": sum(int(r) for r in ds["rows_dropped"]),
            "columns_dropped": sum(int(c) for c in ds["columns_dropped"]),
            "ambiguous_answers": sum(bool(a) for a in ds["ambiguous_answer"]),
            "columns_pruned": sum(int(v) for v in ds["columns_pruned"]),
            "tokens_pruned": sum(int(v) for v in ds["tokens_pruned"]),
        }
        if self.long_table_tokens is not None:
            full = ds["full_length"]
            long = {i for i in range(n) if int(full[i]) > self.long_table_tokens}
            stats["long_questions"] = len(long)
            stats["answer_cells_kept_long"] = kept_share([i for i in with_cells if i in long])
        return stats

    def usable_rows(self, split: str, ds) -> list[int] | None:
        """Training: the examples that supervise something (an answer cell left, or a scalar answer), less those
        ``drop_cut_answers`` and ``ambiguous_answers=drop`` exclude. SQA evaluation: position by position."""
        if split == "train" and self.task.selects_cells:
            floats, cells, cut = ds["float_answer"], ds["has_answer_cells"], ds["answers_cut"]
            ambiguous = ds["ambiguous_answer"] if self.ambiguous_answers == "drop" else [False] * len(ds)
            why = {}
            for i, candidates in enumerate(ds["candidates"]):
                if not candidates and math.isnan(floats[i]):
                    why[i] = "dropped_no_supervision"
                elif self.drop_cut_answers and cells[i] and int(cut[i]):
                    why[i] = "dropped_answer_cut"
                elif ambiguous[i]:
                    why[i] = "dropped_ambiguous"
            counts = {
                name: sum(1 for w in why.values() if w == name)
                for name in ("dropped_no_supervision", "dropped_answer_cut", "dropped_ambiguous")
            }
            self.stats.setdefault(split, {}).update(counts)
            if why:
                reasons = ", ".join(
                    f"{name.removeprefix('dropped_').replace('_', ' ')}: {n}" for name, n in counts.items() if n
                )
                log.info("%s train: %d of %d questions dropped (%s)", self.task.name, len(why), len(ds), reasons)
            keep = [i for i in range(len(ds)) if i not in why]
            if not keep:
                raise MateError(
                    f"no {self.task.name} training question has an answer cell; check dataset.root and "
                    "dataset.max_length"
                )
            return keep
        if split != "train" and self.task.sequential:
            positions = ds["position"]
            return sorted(range(len(ds)), key=lambda i: (positions[i], i))
        return None

    def collator(self) -> "TaskCollator":
        return TaskCollator(self.pad_id, **self.width())


class TaskCollator(Collator):
    def __call__(self, examples: list[Mapping]) -> TaskBatch:
        base = super().__call__(examples)
        values = [[math.nan, *(math.nan if v is None else v for v in ex["cell_values"])] for ex in examples]
        return TaskBatch(
            **{f.name: getattr(base, f.name) for f in fields(Batch)},
            labels=torch.tensor([int(ex["label"]) for ex in examples]),
            float_answer=torch.tensor(
                [math.nan if ex["float_answer"] is None else ex["float_answer"] for ex in examples], dtype=torch.float
            ),
            cell_values=padded(values, math.nan, torch.float, base.cell_mask.shape[1]),
            **{key: [list(ex[key]) for ex in examples] for key in ("answers", "answer_coordinates", "cell_texts")},
            canonical_answers=[list(ex["canonical_answers"] or []) for ex in examples],
            sequence_ids=[ex["sequence_id"] or None for ex in examples],
            positions=[int(ex["position"]) for ex in examples],
            channels=[ex["channel"] or None for ex in examples],
            full_lengths=[int(ex["full_length"]) for ex in examples],
        )
