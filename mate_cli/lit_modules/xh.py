"""Transformer-XH (Zhao et al. 2020; :mod:`mate_cli.modeling.xh`) as a PointR stage-1 baseline on HybridQA graphs, with
``CellSelectionModule``'s loss, metrics and predictions. A cell's logit is its tokens' mean score across the question's
nodes.

Passage evidence reaches cell scores one edge per hop layer but the last (which, without ``model.extra_layers``, no
cell score reads): ``hop_layers=L`` carries it at most ``L - 1`` edges (a passage's own rows need ``L >= 2``, rows
linked to them ``L >= 3``). A first-layer hop carries nothing (every hub is the same [CLS] embedding), so with every
layer hopping (``null``, the paper's) evidence travels ``num_layers - 2`` edges (4 for MiniLM's 6 layers)."""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn

from mate_cli.data.graph import GraphBatch
from mate_cli.lit_modules.cell_selection import CellSelectionModule
from mate_cli.modeling.heads import masked_fill_invalid, pool_cells
from mate_cli.errors import MateError
from mate_cli.modeling.xh import HopLayers

log = logging.getLogger(__name__)


class GraphCellSelectionModule(CellSelectionModule):
    """``hop_layers``: how many of the encoder's last layers hop (``None``: all, the paper's)."""

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable,
        scheduler: Callable | None = None,
        mml: bool = True,
        hop_layers: int | None = None,
        **extra,
    ) -> None:
        super().__init__(encoder, optimizer, scheduler, mml=mml, **extra)
        if getattr(encoder, "compiled", None) is not None:  # the hop layers run the encoder's layers one by one
            raise MateError(
                "model.encoder.compile applies to the encoder's stack of layers, which Transformer-XH runs one layer "
                "at a time with hop attention between them; set model.encoder.compile=false for model=xh"
            )
        self.hop = HopLayers(encoder.config, hop_layers)
        if self.hop.hops and self.extra is None:
            # no cell score reads the last hop: kept (the paper's architecture), frozen (no decay, no DDP wait)
            self.hop.hops[-1].requires_grad_(False)

    def forward(self, batch: GraphBatch) -> torch.Tensor:
        """Cell logits ``[questions, cells + 1]``."""
        hidden = self.hop(self.encoder, batch.input_ids, batch.layout, batch.edges)
        if self.extra is not None:
            hidden = self.extra(hidden, batch.layout.attention_mask)
        token_logits = self.head.token_scorer(hidden).squeeze(-1)  # [nodes, seq]
        questions, width = batch.cell_mask.shape
        # one pooling over the whole batch: token -> (its question, its cell) as one flat id
        ids = batch.node_graph[:, None] * width + batch.layout.cell_ids * batch.layout.attention_mask
        pooled = pool_cells(token_logits.reshape(1, -1), ids.reshape(1, -1), questions * width - 1)
        not_a_cell = torch.zeros_like(batch.cell_mask)
        not_a_cell[:, 0] = True  # each question's id 0: its query, header and passage tokens
        return masked_fill_invalid(pooled.view(questions, width), ~not_a_cell)

    def export_pretrained(self, directory, tokenizer=None):
        log.warning(
            "export_encoder: the encoder alone, without its hop layers: it reads each node on its own, which "
            "is not the Transformer-XH model that was trained"
        )
        return super().export_pretrained(directory, tokenizer=tokenizer)
