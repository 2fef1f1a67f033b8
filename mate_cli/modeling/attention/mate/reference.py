"""MATE's efficient implementation (paper §3.1, App. D), spelled out: sort per head, then bucket.

Read this file first: it is the one explanation of the algorithm; :mod:`.bucketed`, :mod:`.cpu_kernel` and
:mod:`.triton` compute the same function, fused, and are tested against it. Every head sorts its tokens by its own
traversal (``layout.head_sort_order``: the query set Q first, then row by row or column by column, padding last).
In that order:

- the first ``G`` tokens are the **global** part: it "attends to and from everything" (§3.1; App. D's ``Q.global``
  rows read ``K.full``): every token may attend to it, and each of its real tokens has a dense row against every
  real key, under MATE's pattern (a table token there sees the query set and its whole row/column);
- the sorted sequence is padded to ``T = nb * R`` and cut into ``nb`` buckets of ``R`` tokens (the **long** part); a
  bucket attends to the globals plus a **window** of three buckets (previous, itself, next: ``3R`` keys). Window keys
  inside the global part are masked out, so no key is counted twice.

Towards the globals and inside the window, MATE's pattern (:func:`.plan.mate_allowed`) is applied as a mask,
and one softmax runs over ``[globals ; window]``. Hence the result equals the masked reference whenever every
query-set token is among the first ``G`` sorted tokens and every row (row heads) or column (column heads) spans at
most ``R`` tokens; otherwise a long table token loses the part of its row/column beyond its window, and query
tokens beyond ``G`` see only the globals and their window (the paper's approximation).

**One difference from the paper's efficient form**: the bucket grid starts at sorted position 0, not at ``G`` (§3.1:
"split off the first G tokens and group the rest in evenly sized buckets"; TAPAS's release buckets sorted position
``i >= G`` as ``(i - G) // R``). The windows are therefore shifted by ``G mod R``: on a synthetic 1,903-token table
(G=116, R=42) the long rows of the column heads keep 246,207 pairs against the paper's 244,411 (row heads: 197,595
and 200,655). Both equal ``exact`` under the conditions above. Matching it means offsetting the grid in every
implementation of this variant together (they are tested against this file).

:func:`bucketed_attention_reference` follows App. D's einsum strings over :class:`MultiView` tensors, with the masks
and sort orders of the :class:`~.plan.BucketPlan`: readable, differentiable, O(N) memory, but several full
passes over the scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mate_cli.modeling.attention.backend import block_windows
from mate_cli.modeling.attention.mate.plan import BucketPlan, sort_heads, unsort_heads


@dataclass
class MultiView:
    """Views of one per-head sorted tensor (App. D's ``MultiViewEmbedding``): ``full``
    ``[batch, heads, T, head_dim]`` (zero-padded to ``T = nb * R``), ``global_`` its first ``G`` tokens, ``long``
    ``[batch, heads, nb, R, head_dim]`` (the buckets), ``window`` ``[batch, heads, nb, 3R, head_dim]`` (each bucket
    with its neighbours; zeros beyond the ends)."""

    full: torch.Tensor
    global_: torch.Tensor
    long: torch.Tensor
    window: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor, plan: BucketPlan) -> "MultiView":
        """Sort ``x`` ``[batch, heads, seq, head_dim]`` by the plan's per-head order and view it."""
        B, H, N, D = x.shape
        R, nb, G = plan.radius, plan.num_buckets, plan.global_len
        full = sort_heads(x, plan.perm, plan.padded_len)
        long = full.view(B, H, nb, R, D)
        return cls(full=full, global_=full[:, :, :G], long=long, window=block_windows(long))


def bucketed_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BucketPlan) -> torch.Tensor:
    """App. D with einsum strings: the fused ``bucketed_attention``'s function, without dropout. ``q, k, v``:
    ``[batch, heads, seq, head_dim]`` (q not pre-scaled); returns the same shape. Materialises
    ``[batch, heads, T, G + 3R]`` scores."""
    B, H, N, D = q.shape
    G, R, P = plan.global_len, plan.radius, plan.dense_rows
    Q, K, V = (MultiView.of(x, plan) for x in (q * D**-0.5, k, v))
    neg = torch.finfo(q.dtype).min
    # the plan's masks per head view [B, V, ...] -> per head [B, H, ...]
    long_allowed = plan.long_allowed[:, plan.head_view].view(B, H, plan.num_buckets, R, G + 3 * R)

    score_to_global = torch.einsum("BHNFE,BHTE->BHNFT", Q.long, K.global_)
    score_to_window = torch.einsum("BHNFE,BHNTE->BHNFT", Q.long, K.window)
    prob_from_long = torch.softmax(
        torch.cat([score_to_global, score_to_window], -1).masked_fill(~long_allowed, neg), -1
    )
    context_from_long = torch.einsum("BHNFT,BHTE->BHNFE", prob_from_long[..., :G], V.global_) + torch.einsum(
        "BHNFT,BHNTE->BHNFE", prob_from_long[..., G:], V.window
    )
    context = context_from_long.reshape(B, H, plan.padded_len, D)

    if P:  # the global part: one dense row each
        score_from_global = torch.einsum("BHFE,BHTE->BHFT", Q.full[:, :, :P], K.full)
        prob_from_global = torch.softmax(score_from_global.masked_fill(~plan.dense_allowed[:, plan.head_view], neg), -1)
        context_from_global = torch.einsum("BHFT,BHTE->BHFE", prob_from_global, V.full)
        take = plan.dense_take[:, None, :, None]
        context = torch.cat([torch.where(take, context_from_global, context[:, :, :P]), context[:, :, P:]], 2)
    return unsort_heads(context, plan.inverse)
