"""BERT/TAPAS input embeddings: word + position + the seven TAPAS token types, a table each
(``token_type_embeddings_{i}``; a BERT checkpoint's segment table is the first, the other six start fresh).

``reset_position_index_per_cell`` restarts the position at each cell's first token, as
``transformers.TapasEmbeddings`` does: a cell is a (column, row) pair, so query, special tokens and padding share cell
(0, 0) and keep absolute positions.
"""

from __future__ import annotations

import torch
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.layout import TOKEN_TYPE_FIELDS, TableLayout


def cell_position_ids(
    column_ids: torch.Tensor, row_ids: torch.Tensor, max_position: int, num_rows: int
) -> torch.Tensor:
    """``[batch, seq]``: each token's position minus the first position of its (column, row) cell (cells need not be
    contiguous), clipped to ``max_position - 1``. ``num_rows`` (the row table's size) bounds ``row_ids``."""
    seq_len = column_ids.shape[1]
    positions = torch.arange(seq_len, device=column_ids.device).expand_as(column_ids)
    cell_key = column_ids.long() * num_rows + row_ids.long()
    order = torch.argsort(cell_key, dim=1, stable=True)  # cells grouped, positions ascending
    sorted_key = cell_key.gather(1, order)
    starts = torch.ones_like(sorted_key, dtype=torch.bool)
    starts[:, 1:] = sorted_key[:, 1:] != sorted_key[:, :-1]
    start_index = torch.where(starts, positions, torch.zeros_like(positions)).cummax(dim=1).values
    first_sorted = order.gather(1, start_index)  # first position of each sorted token's cell
    first = torch.empty_like(first_sorted).scatter_(1, order, first_sorted)
    return (positions - first).clamp(max=max_position - 1)


#: the key a layout's cache holds once its token-type ids were checked against every table that reads them
TYPE_IDS_CHECKED = ("embeddings.type_ids_checked",)


class TableEmbeddings(nn.Module):
    """Module names are ``TapasEmbeddings``'."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.type_vocab_sizes = tuple(int(size) for size in config.type_vocab_sizes)
        if len(self.type_vocab_sizes) != len(TOKEN_TYPE_FIELDS):
            raise MateError(
                f"model.type_vocab_sizes has {len(self.type_vocab_sizes)} entries but the table layout has "
                f"{len(TOKEN_TYPE_FIELDS)} token types ({', '.join(TOKEN_TYPE_FIELDS)}); give one size per type"
            )
        for i, size in enumerate(self.type_vocab_sizes):
            setattr(self, f"token_type_embeddings_{i}", nn.Embedding(size, config.hidden_size))
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.max_position_embeddings = config.max_position_embeddings
        self.reset_position_index_per_cell = config.reset_position_index_per_cell

    def token_type_tables(self) -> list[nn.Embedding]:
        return [getattr(self, f"token_type_embeddings_{i}") for i in range(len(self.type_vocab_sizes))]

    def position_ids(self, layout: TableLayout) -> torch.Tensor:
        """The layout's own position ids, else absolute ones, or per cell when reset is on."""
        if layout.position_ids is not None:
            return layout.position_ids
        batch, seq_len = layout.batch_size, layout.seq_len
        if self.reset_position_index_per_cell:
            num_rows = self.type_vocab_sizes[TOKEN_TYPE_FIELDS.index("row_ids")]
            return cell_position_ids(layout.column_ids, layout.row_ids, self.max_position_embeddings, num_rows)
        if seq_len > self.max_position_embeddings:
            raise MateError(
                f"sequence of {seq_len} tokens exceeds the model's max_position_embeddings="
                f"{self.max_position_embeddings}; set dataset.max_length<={self.max_position_embeddings} "
                "or model.encoder.reset_position_index_per_cell=true"
            )
        return torch.arange(seq_len, device=layout.device).expand(batch, seq_len)

    def check_type_ids(self, layout: TableLayout) -> None:
        """Refuse ids that overflow their token-type table. It reads them on the host: :meth:`forward` calls it on CPU
        only, for a layout not marked :data:`TYPE_IDS_CHECKED`; a training or evaluation batch is checked before it
        moves to its device (``EncoderTaskModule.check_type_ids``)."""
        for i, (name, table) in enumerate(zip(TOKEN_TYPE_FIELDS, self.token_type_tables())):
            ids = getattr(layout, name)
            outside = ids[(ids < 0) | (ids >= table.num_embeddings)]
            if outside.numel():
                raise MateError(
                    f"layout.{name} holds id {int(outside[0])} but token_type_embeddings_{i} has only "
                    f"{table.num_embeddings} entries; cap it in the tokenizer (fewer rows/columns per table) "
                    f"or raise model.type_vocab_sizes[{i}]"
                )

    def forward(self, input_ids: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        """``[batch, seq]`` WordPiece ids -> ``[batch, seq, hidden]``; ``layout=None``: all token types 0."""
        layout = TableLayout.plain(input_ids) if layout is None else layout.to(input_ids.device)
        checked = layout.is_cached(TYPE_IDS_CHECKED)
        if input_ids.device.type == "cpu" and not checked and not torch.compiler.is_compiling():
            self.check_type_ids(layout)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids(layout))
        for ids, table in zip((getattr(layout, name) for name in TOKEN_TYPE_FIELDS), self.token_type_tables()):
            embeddings = embeddings + table(ids)
        return self.dropout(self.LayerNorm(embeddings))
