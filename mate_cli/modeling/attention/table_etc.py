"""TABLEETC: ETC-style global-local attention with one memory token per row and column.

MATE §5.1's ETC baseline (Ainslie et al., 2020): a 256-token global memory, half one token per table row, half one
per column, with "a special relative positional value" between a token and its row or column memory. The paper leaves
the rest open; this module fixes it:

- Memory (:meth:`TableETCAttention.extend_inputs`, on layer 0's backend; the encoder strips it before the heads):
  ``G = num_global`` slots. Row slot ``s < G/2`` serves data rows ``r >= 1`` with ``(r - 1) % (G/2) == s``, column
  slots likewise, so rows and columns beyond ``G/2`` fold and the load spreads evenly. Header tokens belong to their
  column's slot only; query tokens and specials to none. A slot starts as the mean embedding of its members plus
  ``memory_type_embeddings[0]`` (row) or ``[1]`` (column); one without members is masked.
- Extended layout: memory tokens have ``segment_ids == 2`` (:data:`MEMORY_SEGMENT`), row slots ``row_ids = s + 1``,
  column slots ``column_ids = s + 1``, other ids 0, ``attention_mask`` = "the slot has members"; no new layout field.
- Attention (positions ``[0, G)`` global, the rest long): global -> every real token; long -> every real memory slot
  and the long tokens within ``local_radius`` (default 84, ETC's), in blocks of ``local_radius`` that see the
  previous, own and next block (masked to the exact radius): ``O(seq * (G + 3 * local_radius))``, never ``seq x seq``.
- Relative ids (Shaw et al., 2018 style; the paper cites Dai et al., 2019), score ``q . (k + r[id]) / sqrt(head_dim)``:
  1 / 2 long token -> its own row / column memory; 3 / 4 row / column memory -> a member; ``5 + M + clip(j - i, -M,
  M)`` long i -> long j in the window (``M = max_relative_distance``, default 12 as in ETC); 0 every other pair.
- New parameters (not in BERT/TAPAS checkpoints), N(0, ``init_std`` = 0.02): ``relative_embeddings``
  ``[num_relative_ids, head_dim]`` per layer, shared by the heads; ``memory_type_embeddings``
  ``[2, num_heads * head_dim]`` on layer 0's backend only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from mate_cli.errors import MateError
from mate_cli.modeling.attention.backend import AttentionBackend, block_windows, check_range, register
from mate_cli.layout import TableLayout

#: ``segment_ids`` value that marks global memory tokens in the extended layout.
MEMORY_SEGMENT = 2
TABLE_SEGMENT = 1

REL_GENERIC = 0
REL_TO_OWN_ROW_MEMORY = 1
REL_TO_OWN_COLUMN_MEMORY = 2
REL_ROW_MEMORY_TO_MEMBER = 3
REL_COLUMN_MEMORY_TO_MEMBER = 4
#: First id of the clipped long <-> long distance ids.
REL_LOCAL_OFFSET = 5


def member_slots(layout: TableLayout, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Folded memory slot of each token's row and column, each ``[batch, seq]`` long; ``-1`` for no slot (query,
    specials, padding, memory; header tokens have no row slot)."""
    table = (layout.segment_ids == TABLE_SEGMENT) & layout.attention_mask
    row = torch.where(table & (layout.row_ids > 0), (layout.row_ids - 1) % half, -1)
    column = torch.where(table & (layout.column_ids > 0), (layout.column_ids - 1) % half, -1)
    return row, column


def _pool_slots(hidden: torch.Tensor, slot: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``hidden`` ``[batch, seq, hidden]`` per slot -> ``([batch, slots, hidden], has_members)``."""
    batch, _, width = hidden.shape
    index = torch.where(slot >= 0, slot, num_slots)  # non-members go to a spill slot
    sums = hidden.new_zeros(batch, num_slots + 1, width)
    sums.scatter_add_(1, index[..., None].expand(-1, -1, width), hidden)
    counts = hidden.new_zeros(batch, num_slots + 1)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=hidden.dtype))
    counts = counts[:, :num_slots]
    return sums[:, :num_slots] / counts.clamp(min=1)[..., None], counts > 0


def extend_layout(layout: TableLayout, slot_exists: torch.Tensor) -> TableLayout:
    """Prepend ``G = slot_exists.shape[1]`` memory tokens to every field of ``layout``."""
    batch, num_global = slot_exists.shape
    half = num_global // 2
    zeros = layout.segment_ids.new_zeros(batch, num_global)
    slot_ids = torch.arange(1, half + 1, device=layout.device).expand(batch, half)
    no_ids = slot_ids.new_zeros(batch, half)
    prefix = {
        "attention_mask": slot_exists,
        "segment_ids": torch.full_like(zeros, MEMORY_SEGMENT),
        "row_ids": torch.cat([slot_ids, no_ids], dim=1),
        "column_ids": torch.cat([no_ids, slot_ids], dim=1),
    }
    return layout.with_fields(
        **{
            name: torch.cat([prefix.get(name, zeros).to(device=value.device, dtype=value.dtype), value], dim=1)
            for name, value in layout.map_tensors(lambda t: t).items()
            if value is not None
        }
    )


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    """``[..., seq, d]`` -> ``[..., num_blocks, size, d]``, zero-padded at the end."""
    pad = -x.shape[-2] % size
    return functional.pad(x, (0, 0, 0, pad)).unflatten(-2, (-1, size))


@dataclass
class EtcPlan:
    """Masks and relative ids of one extended layout, cached for all layers: ``G`` memory tokens, ``L`` long tokens in
    ``nb`` blocks of ``radius``."""

    global_key_mask: torch.Tensor  # [batch, seq] bool: keys of global queries
    global_rel: torch.Tensor  # [batch, G, seq] long
    long_mask: torch.Tensor  # [batch, nb, radius, G + 3 * radius] bool
    long_rel: torch.Tensor  # [batch, nb, radius, G + 3 * radius] long
    long_len: int


@register("table_etc")
class TableETCAttention(AttentionBackend):
    """Global row/column memory + local long attention with relative ids (module docstring)."""

    def __init__(
        self,
        *,
        num_global: int = 256,
        local_radius: int = 84,
        max_relative_distance: int = 12,
        init_std: float = 0.02,
        **shared,
    ) -> None:
        super().__init__(**shared)
        check_range("attention.num_global", num_global, 2)
        if num_global % 2:
            raise MateError(
                f"attention.num_global={num_global} is invalid: it must be even (half row, half column "
                "memory); set attention.num_global=<even value>"
            )
        check_range("attention.local_radius", local_radius, 1)
        check_range("attention.max_relative_distance", max_relative_distance, 0)
        self.num_global = int(num_global)
        self.local_radius = int(local_radius)
        self.max_relative_distance = int(max_relative_distance)
        self.num_relative_ids = REL_LOCAL_OFFSET + 2 * self.max_relative_distance + 1
        self.relative_embeddings = nn.Parameter(torch.empty(self.num_relative_ids, self.head_dim))
        nn.init.normal_(self.relative_embeddings, std=init_std)
        if self.layer_index == 0:
            self.memory_type_embeddings = nn.Parameter(torch.empty(2, self.num_heads * self.head_dim))
            nn.init.normal_(self.memory_type_embeddings, std=init_std)
        else:
            self.register_parameter("memory_type_embeddings", None)

    def extra_repr(self) -> str:
        return (
            f"num_global={self.num_global}, local_radius={self.local_radius}, "
            f"max_relative_distance={self.max_relative_distance}"
        )

    def extend_inputs(self, hidden: torch.Tensor, layout: TableLayout | None) -> tuple[torch.Tensor, TableLayout, int]:
        """Prepend the row/column memory: ``hidden`` ``[batch, seq, hidden]`` and the tokenizer's layout
        -> ``(hidden [batch, G + seq, hidden], layout [batch, G + seq], G)``."""
        layout = self.require_layout(layout)
        if self.memory_type_embeddings is None:
            raise MateError(
                f"table_etc: extend_inputs was called on layer {self.layer_index}'s backend; "
                "the encoder must call it on layer 0's backend"
            )
        if hidden.shape[-1] != self.memory_type_embeddings.shape[-1]:
            raise MateError(
                f"table_etc: hidden size {hidden.shape[-1]} != num_heads * head_dim = "
                f"{self.memory_type_embeddings.shape[-1]}; check model.hidden_size and model.num_heads"
            )
        half = self.num_global // 2
        row_slot, column_slot = member_slots(layout, half)
        rows, row_exists = _pool_slots(hidden, row_slot, half)
        columns, column_exists = _pool_slots(hidden, column_slot, half)
        types = self.memory_type_embeddings.to(hidden.dtype)
        memory = torch.cat([rows + types[0], columns + types[1]], dim=1)
        extended = extend_layout(layout, torch.cat([row_exists, column_exists], dim=1))
        return torch.cat([memory, hidden], dim=1), extended, self.num_global

    def plan(self, layout: TableLayout) -> EtcPlan:
        """The :class:`EtcPlan` of the extended ``layout``."""
        key = ("table_etc", self.num_global, self.local_radius, self.max_relative_distance)
        return layout.cached(key, lambda: self._build_plan(layout))

    def _build_plan(self, layout: TableLayout) -> EtcPlan:
        num_global, radius, half = self.num_global, self.local_radius, self.num_global // 2
        if layout.seq_len <= num_global or not bool((layout.segment_ids[:, :num_global] == MEMORY_SEGMENT).all()):
            raise MateError(
                f"table_etc: the layout has no {num_global}-token memory prefix; the encoder must call "
                "extend_inputs on layer 0's backend and pass the returned layout to every layer"
            )
        memory_mask = layout.attention_mask[:, :num_global]
        long = layout.select((slice(None), slice(num_global, None)))
        row_slot, column_slot = member_slots(long, half)
        # memory token g is row slot g (g < G/2) or column slot g - G/2
        slots = torch.arange(num_global, device=layout.device)
        is_row = slots < half
        members = torch.where(is_row[:, None], row_slot[:, None, :], column_slot[:, None, :] + half)
        members = members == slots[:, None]  # [batch, G, L]
        to_long = torch.where(
            members, torch.where(is_row, REL_ROW_MEMORY_TO_MEMBER, REL_COLUMN_MEMORY_TO_MEMBER)[:, None], REL_GENERIC
        )
        global_rel = functional.pad(to_long, (num_global, 0), value=REL_GENERIC)  # memory -> memory: generic
        to_memory = torch.where(
            members.transpose(1, 2), torch.where(is_row, REL_TO_OWN_ROW_MEMORY, REL_TO_OWN_COLUMN_MEMORY), REL_GENERIC
        )  # [batch, L, G]
        # long -> long: query a of a block, key c of its window -> distance c - radius - a
        offset = torch.arange(3 * radius, device=layout.device)[None, :] - radius
        distance = offset - torch.arange(radius, device=layout.device)[:, None]  # [radius, 3 radius]
        near = distance.abs() <= radius
        M = self.max_relative_distance
        local_rel = REL_LOCAL_OFFSET + distance.clamp(-M, M) + M
        key_real = block_windows(_blocks(long.attention_mask[..., None].to(torch.uint8), radius))[..., 0].bool()
        to_memory_blocks = _blocks(to_memory, radius)  # [batch, nb, radius, G]
        batch, num_blocks = to_memory_blocks.shape[:2]
        to_memory_mask = memory_mask[:, None, None, :].expand(batch, num_blocks, radius, num_global)
        long_mask = torch.cat([to_memory_mask, key_real[:, :, None, :] & near], dim=-1)
        long_rel = torch.cat([to_memory_blocks, local_rel.expand(batch, num_blocks, radius, 3 * radius)], dim=-1)
        return EtcPlan(layout.attention_mask, global_rel, long_mask, long_rel, long.seq_len)

    def _probs(self, q: torch.Tensor, keys: torch.Tensor, rel_ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``softmax(q . (k + r[id]))`` over the last axis in at least float32, then dropout. ``q`` ``[..., queries,
        head_dim]`` is already scaled; ``rel_ids`` and ``allowed`` broadcast to ``[..., queries, keys]``."""
        scores = torch.einsum("...id,...jd->...ij", q, keys)
        rel_dot = torch.einsum("...id,rd->...ir", q, self.relative_embeddings.to(q.dtype))
        scores = scores.add_(rel_dot.gather(-1, rel_ids.expand(*rel_dot.shape[:-1], rel_ids.shape[-1])))
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        scores = scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
        return self.attention_dropout(torch.softmax(scores, dim=-1).to(q.dtype))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        """``q, k, v`` ``[batch, heads, G + long, head_dim]``, memory first, ``q`` not pre-scaled; ``layout`` the
        extended one from :meth:`extend_inputs`. Returns the context in the same shape."""
        layout = self.require_layout(layout)
        if layout.seq_len != q.shape[-2]:
            raise MateError(f"table_etc: layout has {layout.seq_len} tokens but q has {q.shape[-2]}")
        plan = self.plan(layout)
        num_global, radius = self.num_global, self.local_radius
        q = q / math.sqrt(self.head_dim)

        probs = self._probs(q[:, :, :num_global], k, plan.global_rel[:, None], plan.global_key_mask[:, None, None, :])
        context_mem = torch.einsum("bhgn,bhnd->bhgd", probs, v)

        q_long = _blocks(q[:, :, num_global:], radius)  # [batch, heads, nb, radius, head_dim]
        num_blocks = q_long.shape[2]

        def block_keys(x: torch.Tensor) -> torch.Tensor:  # [batch, heads, nb, G + 3 radius, head_dim]
            memory = x[:, :, None, :num_global].expand(-1, -1, num_blocks, -1, -1)
            return torch.cat([memory, block_windows(_blocks(x[:, :, num_global:], radius))], dim=-2)

        probs = self._probs(q_long, block_keys(k), plan.long_rel[:, None], plan.long_mask[:, None])
        context_long = torch.einsum("bhcij,bhcjd->bhcid", probs, block_keys(v))
        context_long = context_long.flatten(2, 3)[:, :, : plan.long_len]
        return torch.cat([context_mem, context_long], dim=2)
