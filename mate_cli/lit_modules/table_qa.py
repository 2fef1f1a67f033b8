"""SQA and WikiTQ: the encoder and TAPAS's heads (:mod:`mate_cli.modeling.tapas_heads`).

Logged per evaluation: ``<stage>/loss`` (over the examples that supervise something), ``<stage>/accuracy`` (SQA's ALL;
WikiTQ's denotation accuracy), SQA's SEQ as ``<stage>/seq`` and its accuracy at the first, second and third question of
a sequence as ``<stage>/accuracy_q1``, ``accuracy_q2`` and ``accuracy_q3`` (the Q1-Q3 that SQA's and TAPAS's papers
report beside ALL and SEQ; later positions count in ALL only), SQA's accuracy on the questions whose gold answer is one
cell and on those whose answer is several cells, ``<stage>/accuracy_single_cell_answers`` and
``accuracy_multi_cell_answers`` (the run's own decoding), and ``<stage>/accuracy_long`` and ``long_questions`` over
the questions whose whole input exceeds ``long_table_tokens`` word pieces whatever ``max_length`` (so runs at different
lengths score the same questions), and ``<stage>/cell_top1`` (:func:`top_cell_hits`: of the questions with an answer
cell, the share whose most probable cell is one; it needs no threshold, so it shows cell selection learned before any
probability reaches ``cell_classification_threshold`` and accuracy moves). ``<stage>/accuracy_at_least_one_cell`` is
``<stage>/accuracy`` as the same weights score it decoded with ``head.at_least_one_cell=true`` (the most probable cell
where none passes the threshold), what ``mate eval "overrides=['model.head.at_least_one_cell=true']"`` would give; SQA's
questions after the first then read that decoding's own previous answers, so it costs them a second forward (with
``at_least_one_cell`` already set, it is ``accuracy``). With DoT, ``<stage>/answer_cells_kept``: the share of questions
with answer cells that keep a token of every answer cell after the top-K selection.

SQA's evaluation feeds each question the model's own prediction for the previous one as ``prev_labels`` (as TAPAS
does), position by position, so the split must come in position order on one process (under DDP: a warning, zeros)."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, Mapping

import torch
from torch import nn
from torchmetrics import SumMetric

from mate_cli import tasks
from mate_cli.data.records import TaskBatch
from mate_cli.errors import MateError
from mate_cli.trainer.lightning_internals import is_log_step
from mate_cli.lit_modules.base import EvaluatedTaskModule, stage_metrics
from mate_cli.metrics.sqa import ANSWER_SIZES, QUESTION_NUMBERS, SequenceAccuracy, answer_cells, sequence_key
from mate_cli.metrics.wtq import denotation_correct
from mate_cli.modeling.dot import answer_cells_kept, cells_with_tokens
from mate_cli.modeling import checkpoints
from mate_cli.pretrained import read_config, resolve_pretrained
from mate_cli.modeling.heads import pool_cells
from mate_cli.modeling.tapas_heads import AGGREGATIONS, QAOutput, TapasHeadConfig, TapasQAHead, token_numeric_values

log = logging.getLogger(__name__)

#: SQA: each decoded answer's cells (row, column) by its question's (sequence, position)
Answers = dict[tuple[str, int], set[tuple[int, int]]]


class TableQAModule(EvaluatedTaskModule):
    """``head``: :class:`~mate_cli.modeling.tapas_heads.TapasHeadConfig` settings; ``null`` ones come from a TAPAS
    ``pretrained`` checkpoint (whose head weights load too), else TAPAS's defaults."""

    uses_pooler = True
    supports_dot = True

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable,
        scheduler: Callable | None = None,
        task: str = "sqa",
        head: Mapping | None = None,
        pretrained: str | None = None,
        long_table_tokens: int | None = None,
        **extra,
    ) -> None:
        table_task = tasks.get(task, "model.task")
        if not table_task.selects_cells:
            raise MateError(
                f"model.task={task!r} answers with a verdict, not cells; this head selects cells: use the "
                "entailment module (EntailmentModule, e.g. model=tabfact)"
            )
        super().__init__(encoder, optimizer, scheduler, **extra)
        head = {str(k): v for k, v in dict(head or {}).items()}  # plain values: checkpoints load weights_only
        self.save_hyperparameters(
            {"task": task, "head": head, "pretrained": pretrained, "long_table_tokens": long_table_tokens}
        )
        self.task = table_task
        self.long_table_tokens = None if long_table_tokens is None else int(long_table_tokens)
        settings = read_config(resolve_pretrained(pretrained)) if pretrained else {}
        tapas = settings.get("model_type") == "tapas"  # a TAPAS config.json holds head settings
        self.head_config = TapasHeadConfig.from_checkpoint(head, settings if tapas else {})
        config = encoder.config
        self.head = TapasQAHead(config.hidden_size, self.head_config, config.initializer_range, config.hidden_dropout)
        if not self.head_config.num_aggregation_labels:  # SQA: nothing reads [CLS]; DDP must not wait for it
            encoder.pooler.requires_grad_(False)
        if pretrained:
            checkpoints.load_head(self.head, pretrained, "task head")
        self.metrics = stage_metrics(
            "loss",
            "accuracy",
            "answer_cells_kept",
            "accuracy_long",
            "cell_top1",
            "accuracy_at_least_one_cell",
            *(f"accuracy_q{n}" for n in QUESTION_NUMBERS),
            *(f"accuracy_{size}_cell_answers" for size in ANSWER_SIZES),
            seq=SequenceAccuracy,
            long_questions=SumMetric,
        )
        self.predictions: list[dict] = []
        #: SQA: each decoded answer by (sequence, position), for the next question's prev_labels; the second, the
        #: answers decoded with at least one cell (``accuracy_at_least_one_cell``)
        self._predicted: Answers = {}
        self._predicted_at_least_one_cell: Answers = {}
        self._warned_missing = False
        #: WikiTQ's weak-supervision counts of this training epoch (:meth:`_count_answer_supervision`)
        self._supervision_counts: torch.Tensor | None = None

    def forward(self, batch: TaskBatch, with_loss: bool = False) -> QAOutput:
        """The heads' output on ``batch`` as given (with DoT, callers pass the kept tokens: ``self.prune``)."""
        hidden = self.encode(batch.input_ids, batch.layout)
        pooled = self.pool(hidden, batch.layout)
        with torch.autocast(hidden.device.type, enabled=False):  # the head in float32 (tapas_heads docstring)
            hidden, pooled = hidden.float(), pooled.float()
            if not with_loss:
                return self.head(hidden, pooled, batch.layout)
            cell_ids = batch.layout.cell_ids
            labels = batch.candidate_mask.gather(1, cell_ids) & batch.layout.attention_mask
            values, scale = token_numeric_values(batch.cell_values.float(), cell_ids)
            return self.head(hidden, pooled, batch.layout, labels.long(), batch.float_answer.float(), values, scale)

    def supervised(self, batch: TaskBatch) -> torch.Tensor:
        """``[batch]`` bool: examples with an answer cell, or (WikiTQ) a scalar answer."""
        has_cell = (batch.candidate_mask & batch.cell_mask).any(dim=-1)
        return has_cell | ~torch.isnan(batch.float_answer) if self.task.aggregates else has_cell

    def training_step(self, batch: TaskBatch, batch_idx: int) -> torch.Tensor:
        kept, pruned = self.prune(batch)
        if pruned is not None:
            self._log_answer_cells_kept(kept, "train")
        out = self(kept, with_loss=True)
        loss = out.loss.mean()
        self.log("train/loss", loss, batch_size=len(batch), sync_dist=True)
        if out.aggregate is not None:
            self._count_answer_supervision(kept, out)
        # SQA: ALL with the gold previous answers the batch trains on (teacher forcing); decoded on the host, so only
        # on the steps that log (the host waits for the GPU there anyway)
        if is_log_step(self.trainer):
            correct = torch.tensor([row["correct"] for row in self.decode(kept, out)])
            self.log_train_metric("accuracy", correct, len(batch))
        return self.with_pruning_loss(loss, batch, pruned)

    def _count_answer_supervision(self, batch: TaskBatch, out: QAOutput) -> None:
        """Adds this batch to the epoch's counts of how TAPAS's weak supervision trained WikiTQ's one-number answers
        (on the device: no step waits for them; :meth:`on_train_epoch_end` logs their shares)."""
        number = ~torch.isnan(batch.float_answer)
        # as the head decides it: an answer cell with a token in the input (DoT's kept tokens included)
        answer_tokens = batch.candidate_mask.gather(1, batch.layout.cell_ids) & batch.layout.attention_mask
        in_table = number & answer_tokens.any(dim=-1)
        aggregating = out.aggregate > 0
        cut = aggregating & (out.answer_kept == 0)
        counts = torch.stack([(in_table & ~aggregating).sum(), in_table.sum(), cut.sum(), aggregating.sum()])
        self._supervision_counts = counts if self._supervision_counts is None else self._supervision_counts + counts

    def on_train_epoch_end(self) -> None:
        """``train/numbers_in_table_as_selection``: of the one-number answers found in a cell of the input, the share
        trained as cell selection (the operators' probability at most ``cell_selection_preference``);
        ``train/answer_loss_cut``: of the examples trained as an aggregation, the share whose loss
        ``answer_loss_cutoff`` zeroed. Over the epoch's steps (since the resume, in a resumed epoch)."""
        counts, self._supervision_counts = self._supervision_counts, None
        if not self.head_config.num_aggregation_labels:
            return
        if counts is None:  # this process trained no batch this epoch; the others' counts still add up below
            counts = torch.zeros(4, dtype=torch.long, device=self.device)
        # every process sums the counts of all (the same calls on each), then logs the same shares
        selected, in_table, cut, aggregating = self.trainer.strategy.reduce(counts, reduce_op="sum").tolist()
        for name, part, whole in (
            ("numbers_in_table_as_selection", selected, in_table),
            ("answer_loss_cut", cut, aggregating),
        ):
            if whole:
                self.log(f"train/{name}", part / whole)

    def _log_answer_cells_kept(self, kept: TaskBatch, stage: str) -> None:
        answer = kept.candidate_mask & kept.cell_mask
        has = answer.any(dim=1)
        if not bool(has.any()):
            return
        share, count = answer_cells_kept(answer, kept.layout)[has].float(), int(has.sum())
        if stage == "train":
            self.log(
                "train/answer_cells_kept", share.mean(), on_step=False, on_epoch=True, batch_size=count, sync_dist=True
            )
        else:
            self.update_logged(stage, "answer_cells_kept", share, batch_size=count)

    def pruning_loss(self, batch: TaskBatch, pruned) -> torch.Tensor:
        """P-DoT / PJ-DoT (App. C.2): per-token BCE of the pruner's logits against "in an answer cell", over the table
        tokens of the examples with one. Not TAPAS's column-then-cell loss: the pruner only ranks tokens."""
        cell_ids = batch.layout.cell_ids
        labels = (batch.candidate_mask & batch.cell_mask).gather(1, cell_ids) & batch.layout.attention_mask
        weight = (batch.layout.is_table & labels.any(dim=1, keepdim=True)).float()
        losses = nn.functional.binary_cross_entropy_with_logits(pruned.logits, labels.float(), reduction="none")
        return (losses * weight).sum() / weight.sum().clamp(min=1)

    def _reset_predictions(self) -> None:
        self.predictions, self._predicted, self._predicted_at_least_one_cell = [], {}, {}

    on_validation_epoch_start = on_test_epoch_start = on_predict_epoch_start = _reset_predictions

    def _eval_step(self, batch: TaskBatch, stage: str) -> None:
        for given in self._in_position_order(batch):
            part, pruned = self.prune(self._with_predicted_previous(given))
            if pruned is not None:
                self._log_answer_cells_kept(part, stage)
            out = self(part, with_loss=True)
            keep = self.supervised(part)
            if bool(keep.any()):
                loss = out.loss[keep].mean().detach()
                self.update_logged(stage, "loss", loss, weight=keep.sum(), batch_size=len(part))
            rows = self.remember(self.decode(part, out))
            hits = top_cell_hits(self.cell_probs(part, out), part.candidate_mask & part.cell_mask)
            if len(hits):
                self.update_logged(stage, "cell_top1", hits, batch_size=len(hits))
            correct = self._correct(rows)
            self.update_logged(stage, "accuracy", correct, batch_size=len(part), prog_bar=True)
            if self.task.sequential:
                keys = [sequence_key(r["sequence_id"] or r["question_id"]) for r in rows]
                keys = torch.tensor(keys, device=self.device)
                self.update_logged(stage, "seq", keys, correct.bool(), batch_size=len(part))
                self._log_positions(part, correct, stage)
            if self.task.answer == "cells":
                self._log_answer_sizes(part, correct, stage)
            self._log_long_tables(part, correct, stage)
            self._log_at_least_one_cell(given, part, out, correct, stage)
            self.predictions.extend(rows)

    def _log_at_least_one_cell(
        self, given: TaskBatch, part: TaskBatch, out: QAOutput, correct: torch.Tensor, stage: str
    ) -> None:
        """``<stage>/accuracy_at_least_one_cell``: ``given`` (the questions ``part`` was built from; SQA: those of one
        position) decoded with the most probable cell where none passes the threshold. ``part`` and ``out`` are the
        configured decoding's input and output: the same for WikiTQ and for the first questions of SQA's sequences;
        SQA's later questions are run again with this decoding's own previous answers as their ``prev_labels``."""
        if self.head_config.at_least_one_cell:
            self.update_logged(stage, "accuracy_at_least_one_cell", correct, batch_size=len(part))
            return
        if self.task.sequential and any(given.positions):
            part, _ = self.prune(self._with_predicted_previous(given, self._predicted_at_least_one_cell))
            out = self(part)
        rows = self.remember(self.decode(part, out, at_least_one_cell=True), self._predicted_at_least_one_cell)
        self.update_logged(stage, "accuracy_at_least_one_cell", self._correct(rows), batch_size=len(part))

    def _correct(self, rows: list[dict]) -> torch.Tensor:
        """``[rows]`` float on the module's device: 1 where a decoded answer is right."""
        return torch.tensor([row["correct"] for row in rows], dtype=torch.float, device=self.device)

    def _log_positions(self, part: TaskBatch, correct: torch.Tensor, stage: str) -> None:
        """SQA: ``<stage>/accuracy_q<n>`` over the questions at position ``n - 1`` of their sequence."""
        for n in QUESTION_NUMBERS:
            if at := [i for i, position in enumerate(part.positions) if position == n - 1]:
                self.update_logged(stage, f"accuracy_q{n}", correct[at], batch_size=len(at))

    def _log_answer_sizes(self, part: TaskBatch, correct: torch.Tensor, stage: str) -> None:
        """SQA: ``<stage>/accuracy_single_cell_answers`` and ``accuracy_multi_cell_answers`` over the questions whose
        gold answer is one cell, and several (a question with none counts in neither)."""
        sizes = [len(answer_cells(cells)) for cells in part.answer_coordinates]
        for size, wanted in ANSWER_SIZES.items():
            if at := [i for i, n in enumerate(sizes) if wanted(n)]:
                self.update_logged(stage, f"accuracy_{size}_cell_answers", correct[at], batch_size=len(at))

    def _log_long_tables(self, part: TaskBatch, correct: torch.Tensor, stage: str) -> None:
        if self.long_table_tokens is None or not part.full_lengths:
            return
        if not (long := [i for i, n in enumerate(part.full_lengths) if n > self.long_table_tokens]):
            return
        self.update_logged(stage, "accuracy_long", correct[long], batch_size=len(long))
        count = torch.tensor(len(long), device=self.device)
        self.update_logged(stage, "long_questions", count, batch_size=len(long))

    def _in_position_order(self, batch: TaskBatch) -> list[TaskBatch]:
        """SQA: the batch split by sequence position, ascending; otherwise ``[batch]``."""
        positions = sorted(set(batch.positions))
        if not self.task.sequential or len(positions) <= 1:
            return [batch]
        return [batch.select([i for i, p in enumerate(batch.positions) if p == position]) for position in positions]

    def _with_predicted_previous(self, batch: TaskBatch, predicted: Answers | None = None) -> TaskBatch:
        """SQA: ``prev_labels`` from this model's answers to the previous questions (``predicted``, as
        :meth:`remember` keeps them; the configured decoding's unless given)."""
        if not self.task.sequential:
            return batch
        predicted = self._predicted if predicted is None else predicted
        wanted: list[tuple[int, int, int]] = []  # (example, row, column) of each cell of a previous answer
        for i, (sequence, position) in enumerate(zip(batch.sequence_ids, batch.positions)):
            if position == 0:
                continue
            if (previous := predicted.get((sequence, position - 1))) is None:
                if not self._warned_missing:
                    log.warning(
                        "SQA: no prediction for the question before %s (position %d); its prev_labels "
                        "are zeros. Evaluate in position order on one process.",
                        batch.question_ids[i],
                        position,
                    )
                    self._warned_missing = True
                continue
            wanted.extend((i, r, c) for r, c in previous)
        # matched on the batch's device: one copy to it a position, no read back (a cell this table lacks matches none)
        marks = torch.zeros(batch.cell_mask.shape, dtype=torch.long, device=batch.cell_mask.device)
        if wanted:
            answers = torch.tensor(wanted, dtype=batch.cell_coords.dtype, device=batch.cell_coords.device)
            match = (batch.cell_coords[answers[:, 0]] == answers[:, None, 1:]).all(-1)  # [answer cells, cells + 1]
            match[:, 0] = False  # cell id 0: no cell
            marks.index_add_(0, answers[:, 0], match.long())
        cell_ids = batch.layout.cell_ids
        prev_labels = ((marks > 0).gather(1, cell_ids) & (cell_ids > 0)).long()
        return replace(batch, layout=batch.layout.with_fields(prev_labels=prev_labels))

    @staticmethod
    def cell_probs(batch: TaskBatch, out: QAOutput) -> torch.Tensor:
        """``[batch, cells + 1]``: each cell's probability of selection, the mean of its tokens' (TAPAS's)."""
        cell_ids = batch.layout.cell_ids * batch.layout.attention_mask
        return pool_cells(torch.sigmoid(out.logits.float()), cell_ids, batch.cell_mask.shape[1] - 1)

    @torch.no_grad()
    def decode(self, batch: TaskBatch, out: QAOutput, at_least_one_cell: bool | None = None) -> list[dict]:
        """Per example: the selected cells, the aggregation, the answer (WikiTQ), and whether it is right.
        ``at_least_one_cell``: the head's setting unless given."""
        probs = self.cell_probs(batch, out)
        selected = (probs > self.head_config.cell_classification_threshold) & batch.cell_mask
        if self.head_config.at_least_one_cell if at_least_one_cell is None else at_least_one_cell:
            # none above the threshold: the most probable cell that has a token (DoT may keep none of a cell's)
            usable = batch.cell_mask & cells_with_tokens(batch.layout, batch.cell_mask.shape[1] - 1)
            none = ~selected.any(-1) & usable.any(-1)
            top = probs.masked_fill(~usable, -1.0).argmax(-1, keepdim=True)
            selected |= torch.zeros_like(selected).scatter_(1, top, none.unsqueeze(1))
        aggregation = out.aggregation_logits
        operators = aggregation.argmax(-1).tolist() if aggregation is not None else [0] * len(batch)
        # the selected cells' ids, coordinates and numbers read once for the batch (on a GPU a read waits for the
        # device: one a cell would be hundreds a batch)
        picked = selected.nonzero()
        where = batch.cell_coords[picked[:, 0], picked[:, 1]].tolist()
        numbers = batch.cell_values[picked[:, 0], picked[:, 1]].tolist() if self.task.aggregates else []
        cells_of: list[list[int]] = [[] for _ in range(len(batch))]
        coords_of: list[list[tuple[int, int]]] = [[] for _ in range(len(batch))]
        values_of: list[list[float]] = [[] for _ in range(len(batch))]
        for j, (i, k) in enumerate(picked.tolist()):  # in example order, then cell id order
            cells_of[i].append(k)
            coords_of[i].append(tuple(where[j]))
            if numbers:
                values_of[i].append(numbers[j])
        rows = []
        for i in range(len(batch)):
            cells, coords = cells_of[i], coords_of[i]
            operator = AGGREGATIONS[operators[i]] if self.task.aggregates else "NONE"
            row = {
                "question_id": batch.question_ids[i],
                "table_id": batch.table_ids[i],
                "sequence_id": batch.sequence_ids[i],
                "position": batch.positions[i],
                "coordinates": [list(c) for c in coords],
                "aggregation": operator,
            }
            if self.task.answer == "texts":
                texts = [batch.cell_texts[i][k - 1] for k in cells] if batch.cell_texts else []
                row["answer"] = aggregate_answer(operator, texts, values_of[i])
                canon = batch.canonical_answers[i] if batch.canonical_answers else None
                row["correct"] = bool(batch.answers[i]) and denotation_correct(batch.answers[i], row["answer"], canon)
            else:
                gold = answer_cells(batch.answer_coordinates[i]) if batch.answer_coordinates else set()
                row["correct"] = set(coords) == gold
            rows.append(row)
        return rows

    def remember(self, rows: list[dict], predicted: Answers | None = None) -> list[dict]:
        """SQA: keep each decoded answer for the next question of its sequence, in ``predicted`` (the configured
        decoding's unless given)."""
        predicted = self._predicted if predicted is None else predicted
        if self.task.sequential:
            for row in rows:
                predicted[(row["sequence_id"], row["position"])] = {tuple(c) for c in row["coordinates"]}
        return rows

    def predict_step(self, batch: TaskBatch, batch_idx: int) -> list[dict]:
        """Decoded answers; SQA position by position with the model's own previous answers."""
        rows = []
        for part in self._in_position_order(batch):
            part, _ = self.prune(self._with_predicted_previous(part))
            rows.extend(self.remember(self.decode(part, self(part))))
        return rows


def top_cell_hits(probs: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """``[questions with an answer cell]`` float: 1 where the question's most probable cell is an answer cell.

    ``probs`` ``[batch, cells + 1]`` as :meth:`TableQAModule.cell_probs` gives them (cells without a token, and
    column 0, at the dtype's minimum); ``answer`` the same shape, bool. With ``select_one_column`` the cells outside
    the predicted column have probabilities near 0, so this is the top cell of that column."""
    has = answer.any(dim=1)
    top = probs[has].argmax(dim=1, keepdim=True)
    return answer[has].gather(1, top).squeeze(1).float()


def aggregate_answer(operator: str, texts: list[str], values: list[float]) -> list[str]:
    """The denotation of a selection: NONE -> the cells' texts; COUNT -> how many; SUM / AVERAGE -> of the cells'
    numbers (cells without one left out)."""
    if operator == "NONE":
        return list(texts)
    if operator == "COUNT":
        return [str(len(texts))]
    if not (numbers := [v for v in values if not math.isnan(v)]):
        return []
    result = sum(numbers) if operator == "SUM" else sum(numbers) / len(numbers)
    return [format_number(result)]


def format_number(value: float) -> str:
    """``3.0`` -> ``3``; otherwise up to 15 significant digits."""
    return str(int(value)) if float(value).is_integer() else format(value, ".15g")
