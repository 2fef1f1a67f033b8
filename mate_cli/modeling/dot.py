"""DoT, the double transformer (Krichene et al. 2021): a shallow pruning transformer keeps the top-K tokens, and its
scores bias the task transformer's attention.

- Pruner: a :class:`~.encoder.TableEncoder` of its own (:data:`PRUNER_SIZES` or any checkpoint), one linear logit per
  token, score ``s_t = log P(t | q, T) = log sigmoid(logit_t)`` (§2).
- Selection: ``token`` keeps the K highest ``s_t``; ``column`` (C-DoT, App. D; the paper's WikiTQ setting) keeps whole
  columns by their tokens' mean ``s_t`` (header included) while they fit in K. The query set is always kept, since the
  task heads read [CLS] (the paper does not say); ties go to the earlier token; input order is kept.
- Task transformer: the kept tokens, their full-input positions and ``s_t`` as ``layout.key_bias`` (eq. 2), so App. A.3
  holds: it equals the task model on all tokens with ``s_t = -inf`` for the others.
- Losses (App. A.2, C.2; :data:`LOSSES`): ``joint`` trains both by the task loss, through the bias; ``pruning`` gives
  the task model no scores and trains the pruner by the task module's ``pruning_loss`` on answer cells; ``both`` does
  both. TabFact has no answer cells: J-DoT only here (the paper's Table 10 also trains P-DoT and PJ-DoT on TabFact,
  with a pruning loss like the task's entailment loss, App. C.2; not implemented).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling.heads import pool_cells
from mate_cli.layout import TableLayout

#: the pruning transformer sizes of Turc et al. (2019), as TAPAS publishes them pre-trained
PRUNER_SIZES = {size: f"google/tapas-{size}" for size in ("mini", "small", "medium", "large")}
#: the paper's letters for model sizes (``DoT(s-256-l)``); other checkpoints are named by their basename
SIZE_LETTERS = {"mini": "mini", "small": "s", "medium": "m", "base": "b", "large": "l"}
SELECTIONS = ("token", "column")
#: ``model.dot.loss`` -> the paper's name (App. C.2)
LOSSES = {"joint": "J-DoT", "pruning": "P-DoT", "both": "PJ-DoT"}


@dataclass
class Pruned:
    """What the pruner gives the task model (``K' = min(K, seq)``): ``input_ids`` ``[batch, K']`` the kept word pieces
    in input order; their ``layout`` (full-input ``position_ids``, ``key_bias`` the kept scores, ``None`` for P-DoT);
    ``index`` ``[batch, K']`` their full-input positions; ``scores`` ``[batch, seq]`` every token's ``s_t`` (column
    scores in column mode); ``logits`` ``[batch, seq]`` the token head's."""

    input_ids: torch.Tensor
    layout: TableLayout
    index: torch.Tensor
    scores: torch.Tensor
    logits: torch.Tensor


def column_scores(scores: torch.Tensor, layout: TableLayout) -> torch.Tensor:
    """C-DoT: each table token gets the mean score of its column's tokens, others keep their own (differentiable)."""
    table = layout.is_table
    columns = torch.where(table, layout.column_ids, 0)  # id 0 collects the other tokens and is never read
    means = pool_cells(scores, columns, int(columns.max()) if columns.numel() else 0)
    return torch.where(table, means.gather(1, columns), scores)


def keep_rank(scores: torch.Tensor, layout: TableLayout, top_k: int, selection: str) -> torch.Tensor:
    """``[batch, seq]`` ranking key for :func:`select`: query set ``+inf``, padding ``-inf``, table tokens their score;
    in ``column`` mode ``-inf`` too from the first column (best first) that does not fit in ``top_k``."""
    inf = torch.tensor(float("inf"), dtype=scores.dtype, device=scores.device)
    key = torch.where(layout.is_table, scores.detach(), -inf)
    if selection == "column":
        key = torch.full_like(key, -inf)
        for b in range(scores.shape[0]):
            table = layout.is_table[b]
            room = top_k - int(layout.is_query[b].sum())
            ids = layout.column_ids[b][table]
            values = scores[b].detach()[table]
            by_column = sorted({int(c) for c in ids.tolist()}, key=lambda c: (-float(values[ids == c][0]), c))
            # the best columns while their sizes add up to at most room (a prefix: every size is >= 1)
            totals = itertools.accumulate(int((ids == column).sum()) for column in by_column)
            kept = by_column[: sum(total <= room for total in totals)]
            chosen = table & torch.isin(layout.column_ids[b], ids.new_tensor(kept))
            key[b] = torch.where(chosen, scores[b].detach(), -inf)
    return torch.where(layout.is_query, inf, key)


def select(rank: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[batch, K']``: the indices of the ``K' = min(top_k, seq)`` highest ``rank`` (ties: earlier first), in
    input order."""
    k = min(top_k, rank.shape[1])
    order = torch.sort(rank, dim=1, descending=True, stable=True).indices[:, :k]
    return order.sort(dim=1).values


def gather_layout(
    layout: TableLayout, index: torch.Tensor, kept: torch.Tensor, positions: torch.Tensor, key_bias: torch.Tensor | None
) -> TableLayout:
    """The kept tokens' layout, positions from the full input; a slot that holds no kept token (padding, or a dropped
    column's token) becomes padding in every field, so no head counts it."""
    fields = {
        name: torch.where(kept, value.gather(1, index), 0)
        for name, value in layout.map_tensors(lambda t: t).items()
        if value is not None and name not in ("attention_mask", "position_ids", "key_bias")
    }
    return TableLayout(attention_mask=kept, position_ids=positions.gather(1, index), key_bias=key_bias, **fields)


class DoubleTransformer(nn.Module):
    """DoT's pruning transformer and selection (module docstring); ``top_k``: K (paper: 256)."""

    def __init__(self, pruner: nn.Module, top_k: int = 256, selection: str = "token", loss: str = "joint") -> None:
        super().__init__()
        if selection not in SELECTIONS:
            raise MateError(f"model.dot.selection={selection!r} is not one of {', '.join(SELECTIONS)}")
        if loss not in LOSSES:
            raise MateError(f"model.dot.loss={loss!r} is not one of {', '.join(LOSSES)} (J-DoT, P-DoT, PJ-DoT)")
        if int(top_k) < 1:
            raise MateError(f"model.dot.top_k={top_k} is invalid: keep at least one token (paper: 256)")
        self.pruner = pruner
        self.token_head = nn.Linear(pruner.config.hidden_size, 1)
        nn.init.normal_(self.token_head.weight, std=pruner.config.initializer_range)
        nn.init.zeros_(self.token_head.bias)
        self.top_k, self.selection, self.loss = int(top_k), selection, loss
        pruner.pooler.requires_grad_(False)  # a pruning head that reads [CLS] turns it back on

    @classmethod
    def build(
        cls,
        size: str = "small",
        pretrained: str | None = None,
        attention: Callable | str = "dense",
        max_length: int | None = None,
        **options,
    ) -> "DoubleTransformer":
        """From ``conf/model/dot/*.yaml``: the pruner is ``pretrained`` or the TAPAS checkpoint of ``size``."""
        from mate_cli.modeling.encoder import TableEncoder

        if pretrained is None and size not in PRUNER_SIZES:
            raise MateError(
                f"model.dot.size={size!r} is not one of {', '.join(PRUNER_SIZES)}; "
                "or set model.dot.pretrained=<dir | hub id>"
            )
        pruner = TableEncoder.from_pretrained(pretrained or PRUNER_SIZES[size], attention, max_length=max_length)
        return cls(pruner, **options)

    @property
    def biased(self) -> bool:
        """Whether the task model's attention gets the scores (J-DoT, PJ-DoT)."""
        return self.loss != "pruning"

    def forward(self, input_ids: torch.Tensor, layout: TableLayout, positions: torch.Tensor) -> Pruned:
        """``input_ids`` ``[batch, seq]``: the full (CC/HEM-pre-selected) input; ``positions``: the task model's
        position ids for it."""
        hidden = self.pruner(input_ids, layout)
        with torch.autocast(hidden.device.type, enabled=False):  # float32 scores: bf16 would tie many of them
            logits = self.token_head(hidden.to(self.token_head.weight.dtype)).squeeze(-1)
        scores = nn.functional.logsigmoid(logits)
        if self.selection == "column":
            scores = column_scores(scores, layout)
        rank = keep_rank(scores, layout, self.top_k, self.selection)
        index = select(rank, self.top_k)
        kept = layout.attention_mask.gather(1, index) & (rank.gather(1, index) > float("-inf"))
        bias = torch.where(kept, scores.gather(1, index), 0.0) if self.biased else None
        pruned_layout = gather_layout(layout, index, kept, positions, bias)
        kept_ids = torch.where(kept, input_ids.gather(1, index), self.pruner.config.pad_token_id)
        return Pruned(kept_ids, pruned_layout, index, scores, logits)


def cells_with_tokens(layout: TableLayout, num_cells: int) -> torch.Tensor:
    """``[batch, num_cells + 1]`` bool: the cell ids with a real token in ``layout`` (index 0 False)."""
    ids = torch.where(layout.attention_mask, layout.cell_ids, 0)
    kept = torch.zeros(ids.shape[0], num_cells + 1, dtype=torch.bool, device=ids.device)
    kept.scatter_(1, ids, True)
    kept[:, 0] = False
    return kept


def answer_cells_kept(answer_cells: torch.Tensor, layout: TableLayout) -> torch.Tensor:
    """``[batch]`` bool: every answer cell (``[batch, cells + 1]`` by id; none: True) keeps a token in ``layout``."""
    kept = cells_with_tokens(layout, answer_cells.shape[1] - 1)
    return (kept | ~answer_cells).all(dim=1)


def size_letter(pretrained: str | None) -> str:
    """The paper's letter for a checkpoint (``google/tapas-large`` -> ``l``); else its basename."""
    name = Path(str(pretrained or "").rstrip("/")).name
    for size, letter in SIZE_LETTERS.items():
        if name in (size, f"tapas-{size}") or name.startswith(f"tapas-{size}-"):
            return letter
    return name or "?"


def paper_name(
    pruning: str, max_length: int, selection: str, pruner: str, top_k: int, task: str, loss: str = "joint"
) -> str:
    """DoT's notation (§3): ``CC-1024 DoT(s-256-l)``; ``C-`` for column selection, ``P-DoT``/``PJ-DoT`` for the
    pruning losses (App. C.2), no heuristic when the input is not pre-selected."""
    heuristic = {"cc": "CC-", "hem": "HEM-"}.get(str(pruning).lower(), "")
    kind = ("C-" if selection == "column" else "") + (LOSSES[loss] if loss != "joint" else "DoT")
    return f"{heuristic}{max_length} {kind}({size_letter(pruner)}-{top_k}-{size_letter(task)})"
