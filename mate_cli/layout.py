"""`TableLayout`: where each token sits in the table (docs/architecture.md, "The one idea").

Ids follow TAPAS, so its checkpoints load unchanged; padding is 0 in every id. ``segment_ids``: 0 for the query and
[CLS]/[SEP], 1 for table tokens (header included). ``row_ids``: 0 for query and header, 1..R for data rows.
``column_ids``: 0 for the query, 1..C. ``cell_ids``: k >= 1 for the k-th *data* cell (row-major), else 0. The other
TAPAS token types are zeros when unused. ``key_bias``: ``[batch, seq]`` float, ``-inf`` removes the key.

MATE's query set Q (attends to and is attended by everything) is every real token with ``segment_ids == 0``; header
tokens are table tokens (a row head shows them the header row, a column head their column).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Mapping, Sequence

import torch

View = Literal["row", "column"]

#: TAPAS token-type order, as in ``transformers.TapasConfig.type_vocab_sizes``.
TOKEN_TYPE_FIELDS = (
    "segment_ids",
    "column_ids",
    "row_ids",
    "prev_labels",
    "column_ranks",
    "inv_column_ranks",
    "numeric_relations",
)
#: TAPAS's token-type vocabulary sizes in that order (``transformers.TapasConfig().type_vocab_sizes``).
TAPAS_TYPE_VOCAB_SIZES = (3, 256, 256, 2, 256, 256, 10)

#: Every per-token id a tokenizer records (the one list of them): the TAPAS token types plus the cell id.
ID_FIELDS = TOKEN_TYPE_FIELDS + ("cell_ids",)

#: Sort key of padding in :meth:`TableLayout.group_ids` (after every row/column id).
PADDING_GROUP = 2**40


def padded(lists: Sequence[Sequence], value: float, dtype: torch.dtype = torch.long, width: int | None = None):
    """``lists`` as one ``[len(lists), width]`` tensor, each row filled up with ``value`` (``width``: the longest)."""
    out = torch.full((len(lists), max(map(len, lists)) if width is None else width), value, dtype=dtype)
    for i, values in enumerate(lists):
        out[i, : len(values)] = torch.as_tensor(values, dtype=dtype)
    return out


def batch_width(lists: Sequence[Sequence], multiple: int | None = None, cap: int | None = None) -> int:
    """The length a batch of ``lists`` is padded to: the longest, rounded up to a multiple of ``multiple`` when given
    (never beyond ``cap``, the longest an example may be), so that batches come in a few shapes only."""
    longest = max(map(len, lists))
    if not multiple:
        return longest
    rounded = -(-longest // multiple) * multiple
    return rounded if cap is None else max(longest, min(rounded, cap))


def memoized(method):
    """``method`` with its result kept per arguments in the instance's ``_cache``: built once per layout (or plan),
    shared by every layer."""

    @functools.wraps(method)
    def cached_method(self, *args, **kwargs):
        key = (method.__name__, *args, *sorted(kwargs.items()))
        if key not in self._cache:
            self._cache[key] = method(self, *args, **kwargs)
        return self._cache[key]

    return cached_method


@dataclass(eq=False)
class TableLayout:
    """``[batch, seq]`` tensors (``attention_mask`` True for real tokens; missing ids zeros)."""

    attention_mask: torch.Tensor
    segment_ids: torch.Tensor
    row_ids: torch.Tensor
    column_ids: torch.Tensor
    cell_ids: torch.Tensor | None = None
    prev_labels: torch.Tensor | None = None
    column_ranks: torch.Tensor | None = None
    inv_column_ranks: torch.Tensor | None = None
    numeric_relations: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    key_bias: torch.Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.attention_mask = self.attention_mask.bool()
        zeros = torch.zeros_like(self.segment_ids)
        for name in ("cell_ids", "prev_labels", "column_ranks", "inv_column_ranks", "numeric_relations"):
            if getattr(self, name) is None:
                setattr(self, name, zeros)

    @classmethod
    def from_lists(cls, examples: Sequence[Mapping[str, Sequence[int]]], seq_len: int | None = None) -> "TableLayout":
        """Pad per-example :data:`ID_FIELDS` lists (``segment_ids`` required: it gives the length; a missing field is
        zeros) to ``seq_len`` (default: the longest example)."""
        lengths = [len(ex["segment_ids"]) for ex in examples]
        seq_len = max(lengths + [0]) if seq_len is None else seq_len
        mask = torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]
        ids = {
            name: padded([ex.get(name) if ex.get(name) is not None else [] for ex in examples], 0, width=seq_len)
            for name in ID_FIELDS
        }
        return cls(attention_mask=mask, **ids)

    @classmethod
    def plain(cls, input_ids: torch.Tensor) -> "TableLayout":
        """No table and no padding: every token a query token, every id 0."""
        zeros = torch.zeros_like(input_ids, dtype=torch.long)
        return cls(torch.ones_like(zeros, dtype=torch.bool), segment_ids=zeros, row_ids=zeros, column_ids=zeros)

    @property
    def batch_size(self) -> int:
        return self.segment_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.segment_ids.shape[1]

    @property
    def device(self) -> torch.device:
        return self.segment_ids.device

    @property
    def token_type_ids(self) -> torch.Tensor:
        """TAPAS token types ``[batch, seq, 7]`` in :data:`TOKEN_TYPE_FIELDS` order."""
        return torch.stack([getattr(self, name) for name in TOKEN_TYPE_FIELDS], dim=-1)

    @property
    def is_query(self) -> torch.Tensor:
        """``[batch, seq]`` bool: real tokens of the query set Q (query, [CLS], [SEP])."""
        return (self.segment_ids == 0) & self.attention_mask

    @property
    def is_table(self) -> torch.Tensor:
        """``[batch, seq]`` bool: real table tokens (header included)."""
        return (self.segment_ids != 0) & self.attention_mask

    def view_ids(self, view: View) -> torch.Tensor:
        if view not in ("row", "column"):
            raise ValueError(f"view must be 'row' or 'column', got {view!r}")
        return self.row_ids if view == "row" else self.column_ids

    @memoized
    def group_ids(self, view: View) -> torch.Tensor:
        """``[batch, seq]`` long, cached: 0 query set, row/column id + 1 table tokens, :data:`PADDING_GROUP` padding."""
        group = torch.where(self.is_query, 0, self.view_ids(view).clamp(min=0) + 1)
        return torch.where(self.attention_mask, group, group.new_full((), PADDING_GROUP))

    @memoized
    def allowed(self, view: View) -> torch.Tensor:
        """Exact MATE pattern of one head type, ``[batch, seq, seq]`` bool (from, to), cached: i may attend to j iff
        j is real and (i in Q, or j in Q, or i, j share the row/column). A padding query attends to the real tokens,
        so its output stays finite."""
        ids = self.view_ids(view)
        q = self.is_query
        same = ids[:, :, None] == ids[:, None, :]
        pattern = q[:, :, None] | q[:, None, :] | same | ~self.attention_mask[:, :, None]
        return pattern & self.attention_mask[:, None, :]

    @memoized
    def sort_order(self, view: View) -> tuple[torch.Tensor, torch.Tensor]:
        """``(perm, inverse)``, each ``[batch, seq]`` long, cached. ``x.gather(1, perm)`` orders tokens by
        :meth:`group_ids`, each group in position order; ``sorted.gather(1, inverse) == x``."""
        pos = torch.arange(self.seq_len, device=self.device).expand_as(self.segment_ids)
        # positions break ties: one argsort of group * (seq + 1) + position
        group = self.group_ids(view).clamp(max=PADDING_GROUP // (self.seq_len + 1))
        perm = torch.argsort(group * (self.seq_len + 1) + pos, dim=1, stable=True)
        return perm, torch.argsort(perm, dim=1)

    def head_views(self, num_heads: int, row_heads_ratio: float) -> list[View]:
        """The view of each head: the first ``round(ratio * heads)`` are row heads."""
        num_row = int(round(row_heads_ratio * num_heads))
        return ["row"] * num_row + ["column"] * (num_heads - num_row)

    @memoized
    def head_sort_order(self, num_heads: int, row_heads_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head ``(perm, inverse)``, each ``[batch, heads, seq]``, cached."""
        perms, invs = zip(*(self.sort_order(v) for v in self.head_views(num_heads, row_heads_ratio)))
        return torch.stack(perms, dim=1), torch.stack(invs, dim=1)

    def is_cached(self, key) -> bool:
        """Whether :meth:`cached` holds ``key``."""
        return key in self._cache

    def cached(self, key, build):
        """Memoise ``build()`` on this layout under ``key``."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def to(self, device) -> "TableLayout":
        """This layout on ``device`` (itself, cache kept, when it is already there). Copies to a GPU do not block the
        host (safe from any memory; overlapped with the GPU's work from pinned memory: :meth:`pin_memory`)."""
        target = torch.device(device)
        if self.device.type == target.type and (target.index is None or self.device.index == target.index):
            return self
        non_blocking = target.type == "cuda"
        return TableLayout(**self.map_tensors(lambda t: t.to(device, non_blocking=non_blocking)))

    def pin_memory(self) -> "TableLayout":
        """A copy in page-locked memory (the DataLoader's ``pin_memory``)."""
        return TableLayout(**self.map_tensors(lambda t: t.pin_memory()))

    def select(self, index) -> "TableLayout":
        return TableLayout(**self.map_tensors(lambda t: t[index]))

    def map_tensors(self, fn) -> dict:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_cache"}
        return {name: None if value is None else fn(value) for name, value in values.items()}

    def with_fields(self, **changes) -> "TableLayout":
        """A copy with some fields replaced and an empty cache."""
        return replace(self, _cache={}, **changes)
