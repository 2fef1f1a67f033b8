"""TAPAS's fine-tuning heads and losses (Herzig et al. 2020; TabFact: Eisenschlos et al. 2020).

Names are ``transformers``' (``TapasConfig``, ``TapasFor*``), so a TAPAS checkpoint's ``config.json`` and head weights
load by name. A cell is TAPAS's (row id, column id) pair, the header row and the query (0, 0) included, ids clipped at
``max_num_rows - 1`` / ``max_num_columns - 1``.

Cell selection (TAPAS §3): token logits ``(w · h_t + b) / temperature``; a cell's logit is its tokens' mean; a
column's logit is the mean over its cells of a second projection's cell means (column 0, the query, excluded unless
``allow_empty_column_selection``). With ``select_one_column`` the loss is ``-log P(gold column)`` plus the mean
Bernoulli NLL of the gold column's cells, and a prediction selects only in the arg-max column. A prediction is the cells
above ``cell_classification_threshold``; with ``at_least_one_cell`` (not TAPAS's) the most probable cell that has a
token where none is.
Aggregation (WikiTQ) classifies the pooled [CLS] over :data:`AGGREGATIONS`. With ``use_answer_as_supervision`` an
example whose answer is not a number, or is found in the table while the operators get at most
``cell_selection_preference`` of the mass, learns cell selection and NONE; the other scalar answers learn
``-log P(any operator)`` plus a Huber loss between the expected result and the answer, both zeroed when that Huber
loss exceeds ``answer_loss_cutoff``. ``aggregation_supervision=hard_em`` is not TAPAS's: :func:`consistent_selection`.

One deliberate difference from ``transformers``: padding belongs to no cell (TAPAS counts it in the query cell, so
there the loss of an example with no answer cell, and column 0's logit, depend on the batch's padding). On unpadded
inputs, and padded ones whose examples all have an answer cell, logits and loss equal ``TapasForQuestionAnswering``'s
(the loss with ``allow_empty_column_selection=false``; tests/modeling/test_tapas_heads.py). The caller runs the
head in float32 (``TableQAModule.forward``: label counts and answers exceed bf16's range). Gumbel options draw
only in training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, Mapping, NamedTuple

import torch
from torch import nn

from mate_cli.errors import MateError, check_choice
from mate_cli.layout import TableLayout

log = logging.getLogger(__name__)

#: TAPAS's aggregation operators for WikiTQ, in its label order.
AGGREGATIONS = ("NONE", "SUM", "AVERAGE", "COUNT")
#: TAPAS's stand-ins for log(0) and for a safe division.
LOG_ZERO = -10000.0
EPSILON = 1e-10
APPROXIMATIONS = ("ratio", "first_order", "second_order")
#: how a scalar answer supervises the aggregation examples (:func:`consistent_selection`)
AGGREGATION_SUPERVISIONS = ("expected", "hard_em")


@dataclass
class TapasHeadConfig:
    """TAPAS's head settings (``transformers.TapasConfig``'s names and defaults; task yamls set published values)."""

    num_aggregation_labels: int = 0
    temperature: float = 1.0
    select_one_column: bool = True
    allow_empty_column_selection: bool = False
    positive_label_weight: float = 10.0
    average_logits_per_cell: bool = False
    disable_per_token_loss: bool = False
    use_answer_as_supervision: bool | None = None
    cell_selection_preference: float | None = None
    answer_loss_cutoff: float | None = None
    huber_loss_delta: float | None = None
    answer_loss_importance: float = 1.0
    use_normalized_answer_loss: bool = False
    average_approximation_function: str = "ratio"
    aggregation_temperature: float = 1.0
    aggregation_loss_weight: float = 1.0
    max_num_rows: int = 64
    max_num_columns: int = 32
    init_cell_selection_weights_to_zero: bool = False
    cell_classification_threshold: float = 0.5
    #: not TAPAS's (it answers nothing then): where no cell passes the threshold, decoding selects the most probable one
    at_least_one_cell: bool = False
    use_gumbel_for_cells: bool = False
    use_gumbel_for_aggregation: bool = False
    aggregation_supervision: str = "expected"

    def __post_init__(self) -> None:
        choices_of = {
            "average_approximation_function": APPROXIMATIONS,
            "aggregation_supervision": AGGREGATION_SUPERVISIONS,
        }
        for name, choices in choices_of.items():
            value = str(getattr(self, name)).lower()
            check_choice(f"model.head.{name}", value, choices)
            setattr(self, name, value)
        if self.num_aggregation_labels not in (0, len(AGGREGATIONS)):
            raise MateError(
                f"model.head.num_aggregation_labels={self.num_aggregation_labels} is invalid; use 0 "
                f"(SQA) or {len(AGGREGATIONS)} ({', '.join(AGGREGATIONS)}: WikiTQ)"
            )
        if self.num_aggregation_labels and not self.use_answer_as_supervision:
            raise MateError(
                "model.head.num_aggregation_labels>0 needs model.head.use_answer_as_supervision=true "
                "(supervised aggregation labels are not supported)"
            )
        if self.num_aggregation_labels and self.cell_selection_preference is None:
            raise MateError(
                "model.head.use_answer_as_supervision=true needs model.head.cell_selection_preference "
                "(TAPAS's WikiTQ value: 0.207951)"
            )
        if self.num_aggregation_labels and not self.use_normalized_answer_loss and self.huber_loss_delta is None:
            raise MateError(
                "model.head.use_answer_as_supervision=true needs model.head.huber_loss_delta "
                "(TAPAS's WikiTQ value: 0.121194)"
            )

    @classmethod
    def from_checkpoint(cls, settings: Mapping[str, Any], checkpoint: Mapping[str, Any] | None) -> "TapasHeadConfig":
        """``settings`` (the yaml; ``None`` values unset) over a TAPAS ``config.json`` over the defaults."""
        checkpoint = checkpoint or {}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise MateError(f"model.head has unknown setting(s) {unknown}; the TAPAS head settings are {sorted(names)}")
        values = {name: checkpoint[name] for name in names if checkpoint.get(name) is not None}
        values.update({k: v for k, v in settings.items() if v is not None})
        return cls(**values)


class QAOutput(NamedTuple):
    """``logits`` ``[batch, seq]``, the same with or without labels: with ``select_one_column`` each token carries its
    cell's logit, the chosen column's only; without it, the token logits (their cell's mean with
    ``average_logits_per_cell``). ``aggregation_logits`` ``[batch, ops]`` or None; ``loss`` ``[batch]`` (its mean is
    TAPAS's loss) or None. With the loss of answer-supervised aggregation (WikiTQ), how each example was supervised,
    ``[batch]`` 0/1: ``aggregate`` (trained as an aggregation, not as cell selection) and ``answer_kept`` (its loss
    not zeroed by ``answer_loss_cutoff``); else None."""

    logits: torch.Tensor
    aggregation_logits: torch.Tensor | None
    loss: torch.Tensor | None
    aggregate: torch.Tensor | None = None
    answer_kept: torch.Tensor | None = None


class CellIndex:
    """Tokens grouped into TAPAS cells: segment ``row * C + column`` (``C = max_num_columns``), ``R * C`` for padding,
    which every reduction drops. ``real`` ``[batch, seq]`` and ``cell_mask`` ``[batch, cells]`` (a cell with real
    tokens) are 1/0 in ``dtype``."""

    def __init__(
        self, layout: TableLayout, max_num_rows: int, max_num_columns: int, dtype: torch.dtype = torch.float32
    ) -> None:
        rows = layout.row_ids.clamp(max=max_num_rows - 1)
        self.columns = layout.column_ids.clamp(max=max_num_columns - 1)
        self.num_rows, self.num_columns = max_num_rows, max_num_columns
        self.num_cells = max_num_rows * max_num_columns
        real = layout.attention_mask
        self.cell = torch.where(real, rows * max_num_columns + self.columns, self.num_cells)
        self.column = torch.where(real, self.columns, max_num_columns)
        self.column_of_cell = torch.arange(self.num_cells, device=rows.device) % max_num_columns
        self.real = real.to(dtype)
        self.cell_mask = self.cell_mean(self.real)

    @staticmethod
    def _reduce(values: torch.Tensor, index: torch.Tensor, size: int, how: str) -> torch.Tensor:
        out = values.new_zeros(values.shape[0], size + 1)
        return out.scatter_reduce(1, index, values, reduce=how, include_self=False)[:, :size]

    def cell_mean(self, values: torch.Tensor) -> torch.Tensor:
        """``[batch, seq]`` -> ``[batch, cells]`` mean per cell (0 for an empty cell)."""
        return self._reduce(values, self.cell, self.num_cells, "mean")

    def cell_max(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, self.cell, self.num_cells, "amax")

    def column_sum_of_cells(self, cell_values: torch.Tensor) -> torch.Tensor:
        """``[batch, cells]`` -> ``[batch, columns]`` sum over each column's cells."""
        index = self.column_of_cell.expand_as(cell_values)
        return cell_values.new_zeros(cell_values.shape[0], self.num_columns).scatter_add(1, index, cell_values)

    def column_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``[batch, seq]`` token values -> ``[batch, columns]`` sum per column."""
        return self._reduce(values, self.column, self.num_columns, "sum")

    def gather(self, cell_values: torch.Tensor) -> torch.Tensor:
        """``[batch, cells]`` -> ``[batch, seq]`` each token its cell's value (padding: 0)."""
        padded = torch.cat([cell_values, cell_values.new_zeros(cell_values.shape[0], 1)], dim=1)
        return padded.gather(1, self.cell)


class TapasQAHead(nn.Module):
    """Cell selection, and aggregation when ``num_aggregation_labels > 0``: SQA and WikiTQ."""

    def __init__(
        self, hidden_size: int, config: TapasHeadConfig, initializer_range: float = 0.02, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.config = config
        self.dropout = nn.Dropout(dropout)
        self.output_weights = nn.Parameter(torch.empty(hidden_size))
        self.output_bias = nn.Parameter(torch.zeros(()))
        self.column_output_weights = nn.Parameter(torch.empty(hidden_size))
        self.column_output_bias = nn.Parameter(torch.zeros(()))
        for weights in (self.output_weights, self.column_output_weights):
            if config.init_cell_selection_weights_to_zero:
                nn.init.zeros_(weights)
            else:
                nn.init.normal_(weights, std=initializer_range)
        if config.num_aggregation_labels > 0:
            self.aggregation_classifier = nn.Linear(hidden_size, config.num_aggregation_labels)
            nn.init.normal_(self.aggregation_classifier.weight, std=initializer_range)
            nn.init.zeros_(self.aggregation_classifier.bias)

    def forward(
        self,
        hidden: torch.Tensor,
        pooled: torch.Tensor,
        layout: TableLayout,
        labels: torch.Tensor | None = None,
        float_answer: torch.Tensor | None = None,
        numeric_values: torch.Tensor | None = None,
        numeric_values_scale: torch.Tensor | None = None,
    ) -> QAOutput:
        """Logits, and with ``labels`` (``[batch, seq]``, 1 on gold answer cells' tokens) the loss. ``pooled``
        ``[batch, hidden]``; ``float_answer`` ``[batch]`` (NaN: not one number); ``numeric_values`` and
        ``numeric_values_scale``: ``[batch, seq]``, :func:`token_numeric_values`."""
        cfg = self.config
        hidden = self.dropout(hidden)
        index = CellIndex(layout, cfg.max_num_rows, cfg.max_num_columns, hidden.dtype)
        token_logits = (hidden @ self.output_weights + self.output_bias) / cfg.temperature
        column_logits = self._column_logits(hidden, index) if cfg.select_one_column else None
        aggregation_logits = self.aggregation_classifier(pooled) if cfg.num_aggregation_labels > 0 else None
        if cfg.average_logits_per_cell:
            token_logits = index.gather(index.cell_mean(token_logits))
        if labels is None:  # the logits the loss call returns (what eval decodes), without its labels
            if column_logits is not None:
                token_logits = _single_column_selection(
                    token_logits, column_logits, torch.zeros_like(token_logits), index
                )[1]
            return QAOutput(token_logits, aggregation_logits, None)
        labels = labels.long() * layout.attention_mask
        aggregate = None
        if cfg.num_aggregation_labels > 0:
            if not cfg.use_answer_as_supervision:  # a config changed after TapasHeadConfig checked it
                raise MateError(
                    "supervised aggregation labels are not supported; set "
                    "model.head.use_answer_as_supervision=true (TAPAS's WikiTQ setting)"
                )
            if float_answer is None:
                raise ValueError("answer-supervised aggregation needs float_answer (NaN where none)")
            if numeric_values is None or numeric_values_scale is None:
                raise ValueError("answer-supervised aggregation needs numeric_values and numeric_values_scale")
            aggregate = _aggregate_mask(float_answer, aggregation_logits, cfg.cell_selection_preference, labels)
        selection, logits = self._selection_loss(token_logits, column_logits, index, labels)
        loss = torch.zeros_like(selection)
        if not cfg.disable_per_token_loss:
            loss = loss + (selection if aggregate is None else selection * (1.0 - aggregate))
        if cfg.num_aggregation_labels > 0:
            answer = (float_answer, numeric_values, numeric_values_scale)
            aggregation_loss, kept = self._aggregation_loss(
                aggregation_logits, aggregate, logits, answer, layout, index, token_logits, column_logits
            )
            return QAOutput(logits, aggregation_logits, loss + aggregation_loss, aggregate, kept)
        return QAOutput(logits, aggregation_logits, loss)

    def _column_logits(self, hidden: torch.Tensor, index: CellIndex) -> torch.Tensor:
        token = hidden @ self.column_output_weights + self.column_output_bias
        cells = index.cell_mean(token)
        count = index.column_sum_of_cells(index.cell_mask)
        logits = index.column_sum_of_cells(cells * index.cell_mask) / (count + EPSILON)
        columns = torch.arange(index.num_columns, device=hidden.device)
        empty = (count < 0.5) & (columns != 0)
        logits = logits + LOG_ZERO * empty.to(logits.dtype)
        if not self.config.allow_empty_column_selection:
            logits = logits + LOG_ZERO * (columns == 0).to(logits.dtype)
        return logits

    def _selection_loss(self, token_logits, column_logits, index: CellIndex, labels: torch.Tensor):
        """``(loss [batch], token logits the prediction reads)`` for token-level ``labels``."""
        if self.config.select_one_column:
            return _single_column_selection(token_logits, column_logits, labels, index)
        weight = torch.where(labels == 0, 1.0, self.config.positive_label_weight).to(token_logits.dtype)
        per_token = nn.functional.binary_cross_entropy_with_logits(
            token_logits, labels.to(token_logits.dtype), reduction="none"
        )
        return (per_token * weight * index.real).sum(1) / (index.real.sum(1) + EPSILON), token_logits

    def _aggregation_loss(
        self, aggregation_logits, aggregate, logits, answer, layout, index: CellIndex, token_logits, column_logits
    ):
        """The aggregation examples' loss, and 1 where ``answer_loss_cutoff`` left it (0 where it zeroed an aggregating
        example's); ``answer``: (float answer, token values, their scale)."""
        cfg = self.config
        float_answer, values, scale = answer
        log_probs = torch.log_softmax(aggregation_logits, dim=-1)
        # weak supervision: NONE for cell-selection examples, "some operator" for the others
        extra = -log_probs[:, 0] * (1.0 - aggregate)
        extra = extra - torch.log(torch.softmax(aggregation_logits, dim=-1)[:, 1:].sum(1)) * aggregate
        extra = cfg.aggregation_loss_weight * extra
        # the answer loss: Huber between the soft selection's expected result and the answer
        probs = torch.sigmoid(logits)
        if self.training and cfg.use_gumbel_for_cells:
            probs = relaxed_bernoulli(logits, cfg.temperature)
        table_mask = (layout.row_ids > 0).to(logits.dtype)
        approximation, gumbel = cfg.average_approximation_function, self.training and cfg.use_gumbel_for_aggregation
        expected = expected_result(
            probs, values, scale, table_mask, aggregation_logits, approximation, cfg.aggregation_temperature, gumbel
        )
        target = torch.nan_to_num(float_answer, nan=0.0)
        if cfg.use_normalized_answer_loss:
            norm = (torch.maximum(expected.abs(), target.abs()) + EPSILON).detach()
            answer_loss = huber(expected / norm * aggregate, target / norm * aggregate, 1.0)
        else:
            answer_loss = huber(expected * aggregate, target * aggregate, cfg.huber_loss_delta)
        cutoff = cfg.answer_loss_cutoff
        keep = torch.ones_like(answer_loss) if cutoff is None else (answer_loss <= cutoff).to(answer_loss.dtype)
        loss = (extra + cfg.answer_loss_importance * answer_loss * aggregate) * keep
        if cfg.aggregation_supervision == "hard_em":
            found, operator, _, chosen, _, _ = consistent_selection(
                token_logits, column_logits, index, values, float_answer, log_probs
            )
            # the consistent selection as gold cells of TAPAS's own selection loss, and its operator
            pseudo = index.gather(chosen.to(token_logits.dtype)).long() * layout.attention_mask
            cell_loss, _ = self._selection_loss(token_logits, column_logits, index, pseudo)
            operator_loss = -log_probs.gather(1, operator[:, None] + 1).squeeze(1)
            em = cfg.aggregation_loss_weight * operator_loss + cfg.answer_loss_importance * cell_loss
            loss = torch.where(found & (aggregate > 0), em, loss)
            keep = torch.where(found & (aggregate > 0), torch.ones_like(keep), keep)
        return loss, keep.detach()


class TapasClassificationHead(nn.Module):
    """TabFact's entailment classifier on the pooled sequence (label 0 refuted, 1 entailed)."""

    def __init__(
        self, hidden_size: int, num_labels: int = 2, initializer_range: float = 0.02, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """``[batch, hidden]`` -> ``[batch, num_labels]`` logits."""
        return self.classifier(self.dropout(pooled))


def _single_column_selection(token_logits, column_logits, labels, index: CellIndex):
    """TAPAS's hierarchical loss (module docstring) and token logits ``[batch, seq]`` keeping only the arg-max column's
    cells (others lowered by ``LOG_ZERO``)."""
    cell_logits = index.cell_mean(token_logits)
    per_column = index.column_sum(labels.float())
    nothing = per_column.max(dim=-1).values == 0
    gold_column = torch.where(nothing, 0, per_column.argmax(dim=-1))
    column_loss = -torch.log_softmax(column_logits, dim=-1).gather(1, gold_column[:, None]).squeeze(1)
    cell_labels = index.cell_max(labels.float())
    in_gold = (index.column_of_cell[None, :] == gold_column[:, None]).to(token_logits.dtype)
    log_likelihood = -nn.functional.binary_cross_entropy_with_logits(cell_logits, cell_labels, reduction="none")
    cell_mask = index.cell_mask
    cell_loss = -(log_likelihood * in_gold * cell_mask).sum(1) / ((in_gold * cell_mask).sum(1) + EPSILON)
    loss = column_loss + torch.where(nothing, 0.0, cell_loss)
    chosen = column_logits.argmax(dim=-1)
    in_chosen = (index.column_of_cell[None, :] == chosen[:, None]) & (index.column_of_cell[None, :] != 0)
    masked = cell_logits + LOG_ZERO * (1.0 - cell_mask * in_chosen.to(cell_mask.dtype))
    return loss, index.gather(masked)


def consistent_selection(
    token_logits, column_logits, index: CellIndex, values, answer, operator_log_probs, tolerance: float = 1e-6
):
    """Hard EM (``aggregation_supervision=hard_em``, not TAPAS's): the most probable decodable (column, cells,
    operator) whose result is ``answer``, as labels of TAPAS's column, cell and operator losses. Why: TAPAS's expected
    result fits the answer with soft cell probabilities a prediction never uses (a COUNT fitted by eleven cells at 0.27
    decodes to no cell; the ratio AVERAGE gives a lone cell's value at any probability).

    Searched per column (one group without ``column_logits``): its top-k data cells for every k, and each single data
    cell; a selection qualifies with SUM, AVERAGE (over its numbers) or COUNT within ``tolerance`` x max(1, |answer|),
    scored by ``log P(column) + sum log P(cell in or out) + log P(operator)``. Returns ``(found, operator (0 SUM,
    1 AVERAGE, 2 COUNT), column, cells, candidates (the column's data cells), cell logits)``, each ``[batch]`` or
    ``[batch, cells]``; ``found`` is false without a scalar answer or a consistent selection.
    """
    batch = token_logits.shape[0]
    rows, columns = index.num_rows, index.num_columns
    cell_logits = index.cell_mean(token_logits)
    row_of_cell = torch.arange(index.num_cells, device=token_logits.device) // columns
    present = (index.cell_mask > 0) & (row_of_cell > 0)
    numeric = index.cell_max((~torch.isnan(values)).to(token_logits.dtype)) > 0
    cell_values = index.cell_mean(torch.nan_to_num(values, nan=0.0))
    with torch.no_grad():
        if column_logits is None:  # one group: every data cell
            groups = lambda x: x[:, None, :]  # noqa: E731
            column_scores = torch.zeros(batch, 1, dtype=torch.float64, device=token_logits.device)
        else:  # segment row * C + column -> [batch, column, row]
            groups = lambda x: x.reshape(batch, rows, columns).transpose(1, 2)  # noqa: E731
            column_scores = torch.log_softmax(column_logits.double(), dim=-1)
        logit, valid = groups(cell_logits).double(), groups(present)
        order = logit.masked_fill(~valid, float("-inf")).argsort(dim=-1, descending=True, stable=True)
        valid, logit = valid.gather(-1, order), logit.gather(-1, order)
        is_number = groups(numeric).gather(-1, order) & valid
        value = groups(cell_values).double().gather(-1, order)
        total = torch.where(is_number, value, 0.0).cumsum(-1)
        numbers = is_number.double().cumsum(-1)
        count = torch.arange(1, order.shape[-1] + 1, device=order.device, dtype=torch.float64).expand_as(total)
        target = answer.double()[:, None, None]
        close = lambda result: (result - target).abs() <= tolerance * target.abs().clamp(min=1.0)  # noqa: E731
        ok = torch.stack([close(total), close(total / numbers.clamp(min=1.0)) & (numbers > 0), close(count)], dim=-1)
        ok = ok & valid[..., None] & ~torch.isnan(target)[..., None]
        inside = torch.where(valid, nn.functional.logsigmoid(logit), 0.0)
        outside = torch.where(valid, nn.functional.logsigmoid(-logit), 0.0)
        prefix = inside.cumsum(-1) + outside.sum(-1, keepdim=True) - outside.cumsum(-1)
        # and each single cell holding the answer (SUM or AVERAGE of one cell), wherever the model ranks it
        single_ok = torch.stack([close(value) & is_number] * 2 + [close(torch.ones_like(value))], dim=-1)
        single_ok = single_ok & valid[..., None] & ~torch.isnan(target)[..., None]
        single = inside + outside.sum(-1, keepdim=True) - outside
        ok, selections = torch.cat([ok, single_ok], dim=2), torch.cat([prefix, single], dim=2)
        score = (
            selections[..., None] + column_scores[:, :, None, None] + operator_log_probs.double()[:, None, None, 1:]
        )  # [batch, group, selection, operator]
        best = score.masked_fill(~ok, float("-inf")).flatten(1).argmax(1)
        found = ok.flatten(1).any(1)
        size = order.shape[-1]
        column, selection, operator = best // (2 * size * 3), best // 3 % (2 * size), best % 3
        positions = torch.arange(size, device=order.device)[None, :]
        chosen = torch.where(
            (selection < size)[:, None], positions <= selection[:, None], positions == (selection - size)[:, None]
        )
        chosen = chosen & valid[torch.arange(batch), column]
        picked = torch.zeros(batch, size, dtype=torch.bool, device=order.device).scatter(
            1, order[torch.arange(batch), column], chosen
        )
        if column_logits is None:
            cells, candidates = picked, present
        else:
            in_column = row_of_cell.new_zeros(batch, rows, columns, dtype=torch.bool)
            in_column[torch.arange(batch), :, column] = True
            cells = torch.zeros_like(in_column)
            cells[torch.arange(batch), :, column] = picked
            cells, candidates = cells.flatten(1), present & in_column.flatten(1)
    return found, operator, column, cells, candidates, cell_logits


def _aggregate_mask(answer, aggregation_logits, preference, labels) -> torch.Tensor:
    """1 where an example aggregates: a scalar answer, unless it has an answer cell and operator mass <= preference."""
    scalar = (~torch.isnan(answer)).to(aggregation_logits.dtype)
    operators = torch.softmax(aggregation_logits, dim=-1)[:, 1:].sum(1)
    select = (operators <= preference) & (labels.sum(1) > 0)
    return torch.where(select, torch.zeros_like(scalar), scalar).detach()


def relaxed_bernoulli(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """TAPAS's ``use_gumbel_for_cells``: a relaxed Bernoulli draw per token, ``sigmoid(logits + L / T)`` with logistic
    noise ``L`` (``logits`` are already divided by ``temperature`` T)."""
    u = torch.rand_like(logits).clamp(1e-6, 1 - 1e-6)
    return torch.sigmoid(logits + torch.logit(u) / temperature)


def expected_result(
    probs, values, scale, table_mask, aggregation_logits, approximation="ratio", temperature=1.0, gumbel=False
) -> torch.Tensor:
    """``[batch]``: the expected SUM / AVERAGE / COUNT of a soft selection, weighted by the operators' probabilities
    (``gumbel``: TAPAS's ``use_gumbel_for_aggregation``, a relaxed one-hot draw). ``probs``, ``values`` (NaN: none),
    ``scale`` (dividing by it counts each cell once) and ``table_mask`` (data rows) are ``[batch, seq]``."""
    p = probs / scale * table_mask
    count = p.sum(1)
    values = torch.nan_to_num(values, nan=0.0)
    total = (p * values).sum(1)
    if approximation == "ratio":
        average = total / (count + EPSILON)
    else:
        others = p.sum(1, keepdim=True) - p + 1
        if approximation == "first_order":
            average = (values * p / others).sum(1)
        else:
            pointwise = p * (1 - p)
            variance = pointwise.sum(1, keepdim=True) - pointwise
            average = (values * p * (variance / others.square() + 1) / others).sum(1)
    if gumbel:
        operators = torch.distributions.RelaxedOneHotCategorical(
            torch.tensor(temperature, device=aggregation_logits.device), logits=aggregation_logits[:, 1:]
        ).rsample()
    else:
        operators = torch.softmax(aggregation_logits[:, 1:] / temperature, dim=-1)
    return (torch.stack([total, average, count], dim=1) * operators).sum(1)


def huber(prediction: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    errors = (prediction - target).abs()
    return torch.where(errors < delta, 0.5 * errors**2, errors * delta - 0.5 * delta**2)


def token_numeric_values(cell_values: torch.Tensor, cell_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(value, scale)`` from per-cell values ``[batch, cells + 1]`` (index 0 or NaN: none); ``scale``
    is the token count of the token's cell (1 outside cells), as TAPAS's tokenizer writes it."""
    values = cell_values.gather(1, cell_ids)
    values = torch.where(cell_ids > 0, values, torch.full_like(values, float("nan")))
    counts = torch.zeros_like(cell_values).scatter_add(1, cell_ids, torch.ones_like(values))
    scale = torch.where(cell_ids > 0, counts.gather(1, cell_ids), torch.ones_like(values)).clamp(min=1)
    return values, scale
