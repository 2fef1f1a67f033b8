"""MATE attention: every implementation against the paper's definition.

Exactness tests log their measured max |diff| (``--log-cli-level=INFO`` shows them).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mate_cli.errors import MateError
from mate_cli.modeling.attention import mate as mate_mod
from mate_cli.modeling.attention.mate import bucketed as mate_bucketed
from mate_cli.modeling.attention.mate import MateAttention, head_masks, masked_attention
from mate_cli.modeling.attention.mate.block_sparse import block_sparse_attention, flex_mate_attention
from mate_cli.modeling.attention.mate.bucketed import bucketed_attention
from mate_cli.modeling.attention.mate.plan import bucket_plan
from mate_cli.modeling.attention.mate.reference import bucketed_attention_reference
from mate_cli.modeling.synthetic import filled_layout, layout_from_cells
from tests.modeling.random_layouts import random_layout

log = logging.getLogger(__name__)
RATIOS = (0.5, 0.0, 1.0)  # mixed, column heads only, row heads only (paper Table 6 ablations)


# ----------------------------------------------------------------- references
def paper_sets(layout, num_heads: int, ratio: float) -> list:
    """A_k^i from the paper's definition, with Python loops over raw ids.

    ``sets[b][h][k]``: allowed key positions of real token k (padding keys excluded).
    """
    num_row = int(round(ratio * num_heads))
    out = []
    for b in range(layout.batch_size):
        real = [bool(x) for x in layout.attention_mask[b]]
        seg, rows, cols = (x[b].tolist() for x in (layout.segment_ids, layout.row_ids, layout.column_ids))
        in_q = [real[j] and seg[j] == 0 for j in range(len(real))]
        per_head = []
        for h in range(num_heads):
            ids = rows if h < num_row else cols
            sets = {}
            for k in range(len(real)):
                if not real[k]:
                    continue
                if in_q[k]:
                    sets[k] = {j for j in range(len(real)) if real[j]}
                else:
                    sets[k] = {j for j in range(len(real)) if real[j] and (in_q[j] or ids[j] == ids[k])}
            per_head.append(sets)
        out.append(per_head)
    return out


def loop_attention(q, k, v, sets) -> torch.Tensor:
    """softmax over A_k^i, one token at a time (real rows only; padding rows are 0)."""
    out = torch.zeros_like(q)
    d = q.shape[-1]
    for b, per_head in enumerate(sets):
        for h, rows in enumerate(per_head):
            for i, allowed in rows.items():
                j = torch.tensor(sorted(allowed))
                p = torch.softmax(k[b, h, j] @ q[b, h, i] / d**0.5, 0)
                out[b, h, i] = p @ v[b, h, j]
    return out


def inputs(layout, heads=4, dim=8, dtype=torch.float64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    shape = (layout.batch_size, heads, layout.seq_len, dim)
    return [torch.randn(shape, generator=g, dtype=dtype, requires_grad=grad) for _ in range(3)]


def run(fn, layout, q, k, v):
    """``(output at real tokens, dq, dk, dv)`` for a random cotangent on real tokens."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    real = layout.attention_mask[:, None, :, None]
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype) * real
    (out * cot).sum().backward()
    return [(out * real).detach(), q.grad, k.grad, v.grad]


def max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def max_segment_lengths(layout) -> dict[str, int]:
    """Longest query set, row and column (in tokens, header row included) over the batch:
    MATE's bucketed approximation is exact when |Q| <= G and every segment <= R."""
    out = {"query": int(layout.is_query.sum(1).max())}
    for view in ("row", "column"):
        ids = layout.view_ids(view)
        out[view] = max(
            (
                int(torch.bincount(ids[b][layout.is_table[b]]).max())
                for b in range(layout.batch_size)
                if layout.is_table[b].any()
            ),
            default=0,
        )
    return out


def exact_layouts():
    """Layouts where G=16 covers Q and every row/column fits R=16 (bucketed is exact)."""
    yield random_layout(3, query_len=(2, 8), rows=(1, 3), cols=(1, 3), cell_tokens=(1, 3), pad=(0, 5), seed=1)
    yield random_layout(2, query_len=(1, 12), rows=(2, 4), cols=(1, 2), cell_tokens=(1, 2), pad=(0, 9), seed=7)


# -------------------------------------------------------------- (a) the mask
@pytest.mark.parametrize("ratio", RATIOS)
def test_masked_pattern_is_the_paper_set_definition(ratio):
    for seed in (0, 3):
        layout = random_layout(3, query_len=(1, 6), rows=(1, 4), cols=(1, 3), cell_tokens=(1, 3), pad=(0, 4), seed=seed)
        masks = head_masks(layout, 4, ratio)
        for b, per_head in enumerate(paper_sets(layout, 4, ratio)):
            for h, rows in enumerate(per_head):
                for i, allowed in rows.items():
                    assert set(masks[b, h, i].nonzero()[:, 0].tolist()) == allowed, (b, h, i)


@pytest.mark.parametrize("ratio", RATIOS)
def test_masked_attention_equals_token_by_token_softmax(ratio):
    layout = random_layout(2, query_len=(1, 5), rows=(1, 3), cols=(1, 3), cell_tokens=(1, 2), pad=(0, 3), seed=2)
    q, k, v = inputs(layout, grad=False)
    real = layout.attention_mask[:, None, :, None]
    diff = (masked_attention(q, k, v, layout, ratio) - loop_attention(q, k, v, paper_sets(layout, 4, ratio))) * real
    log.info("max|diff| masked vs token-by-token (ratio=%s): %.2e", ratio, diff.abs().max())
    assert diff.abs().max() <= 1e-12


# ------------------------------------------------------ (b) bucketed, exact case
@pytest.mark.parametrize("budget", [None, 200])  # 200: force many small chunks (single-head bucket ranges)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ratio", RATIOS)
def test_bucketed_equals_masked_when_globals_cover_q_and_segments_fit(ratio, dtype, budget, monkeypatch):
    if budget:
        monkeypatch.setitem(mate_bucketed.CHUNK_ELEMENTS, "cpu", budget)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for layout in exact_layouts():
        seg = max_segment_lengths(layout)
        assert seg["query"] <= 16 and seg["row"] <= 16 and seg["column"] <= 16
        q, k, v = inputs(layout, dtype=dtype)
        ref = run(lambda q, k, v: masked_attention(q, k, v, layout, ratio), layout, q, k, v)
        plan = bucket_plan(layout, 4, ratio, 16, 16)
        got = run(lambda q, k, v: bucketed_attention(q, k, v, plan), layout, q, k, v)
        diff = max_diff(got, ref)
        log.info(
            "max|diff| bucketed vs masked, exact regime (ratio=%s, %s, budget=%s): %.2e", ratio, dtype, budget, diff
        )
        assert diff <= tol


def test_bucketed_with_paper_defaults_is_exact_on_short_tables():
    """G=116, R=42 cover everything of a short table (G >= N included)."""
    layout = random_layout(3, query_len=(5, 20), rows=(2, 6), cols=(2, 5), cell_tokens=(1, 3), pad=(0, 6), seed=4)
    q, k, v = inputs(layout)
    backend = MateAttention(num_heads=4, head_dim=8, variant="bucketed")
    got = run(lambda *x: backend(*x, layout), layout, q, k, v)
    diff = max_diff(got, run(lambda *x: masked_attention(*x, layout), layout, q, k, v))
    log.info("max|diff| bucketed (G=116, R=42) vs masked on short tables: %.2e", diff)
    assert diff <= 1e-12


# ---------------------------------------------------- (b) bucketed, approximate
def reachable_exactly(layout, plan, ratio, num_heads):
    """``[B, H, N]`` bool: real tokens whose whole A_k^i lies in globals + their window.

    Built from the set definition and the sort order; for those tokens the bucketed
    algorithm sees exactly A_k^i, so it must equal the masked reference there.
    """
    G, R = plan.global_len, plan.radius
    perm = plan.perm
    out = torch.zeros(layout.batch_size, num_heads, layout.seq_len, dtype=torch.bool)
    for b, per_head in enumerate(paper_sets(layout, num_heads, ratio)):
        for h, rows in enumerate(per_head):
            where = {int(t): s for s, t in enumerate(perm[b, h].tolist())}  # token -> sorted slot
            for i, allowed in rows.items():
                s = where[i]
                if s < min(G, int(layout.is_query[b].sum())):
                    out[b, h, i] = True  # query token among the globals: a dense row
                    continue
                lo, hi = (s // R - 1) * R, (s // R + 2) * R
                out[b, h, i] = all(where[j] < G or lo <= where[j] < hi for j in allowed)
    return out


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("G,R", [(4, 3), (2, 5)])  # G < |Q| and rows/columns longer than R
def test_bucketed_approximation_is_exact_where_the_window_covers_and_bounded_elsewhere(ratio, G, R):
    layout = random_layout(3, query_len=(3, 8), rows=(2, 5), cols=(2, 4), cell_tokens=(1, 3), pad=(0, 4), seed=11)
    q, k, v = inputs(layout)
    plan = bucket_plan(layout, 4, ratio, G, R)
    fused = run(lambda q, k, v: bucketed_attention(q, k, v, plan), layout, q, k, v)
    # 1. the fused path is App. D exactly (outputs and gradients), whatever G and R
    reference = run(lambda q, k, v: bucketed_attention_reference(q, k, v, plan), layout, q, k, v)
    assert max_diff(fused, reference) <= 1e-12
    # 2. tokens whose allowed set is reachable are exact; the others are approximated
    masked = run(lambda q, k, v: masked_attention(q, k, v, layout, ratio), layout, q, k, v)[0]
    covered = reachable_exactly(layout, plan, ratio, 4)
    err = (fused[0] - masked).abs().amax(-1)
    exact, approx = err[covered].max().item(), err[~covered & layout.attention_mask[:, None]]
    log.info(
        "bucketed G=%d R=%d ratio=%s: covered %d/%d tokens, max|diff| there %.2e; elsewhere max %.2e, mean %.2e",
        G,
        R,
        ratio,
        int(covered.sum()),
        int(layout.attention_mask.sum()) * 4,
        exact,
        approx.max(),
        approx.mean(),
    )
    assert exact <= 1e-12
    assert approx.numel() > 0 and approx.max() > 1e-3  # the approximation is real here
    assert torch.isfinite(fused[0]).all() and approx.max() < 10  # ... and bounded (|v| ~ N(0, 1))


def test_fused_bucketed_matches_reference_with_bnhd_inputs_and_gradcheck_with_dropout():
    layout = random_layout(2, query_len=(1, 3), rows=(1, 2), cols=(1, 2), cell_tokens=(1, 2), pad=(0, 2), seed=3)
    b, n, h, d = layout.batch_size, layout.seq_len, 2, 4
    plan = bucket_plan(layout, h, 0.5, 2, 2)
    g = torch.Generator().manual_seed(0)
    # the encoder's layout: a [B, N, H, D] buffer seen as [B, H, N, D]
    q, k, v = (
        torch.randn(b, n, h, d, generator=g, dtype=torch.float64).transpose(1, 2).requires_grad_() for _ in range(3)
    )
    assert (
        max_diff(
            run(lambda *x: bucketed_attention(*x, plan), layout, q, k, v),
            run(lambda *x: bucketed_attention_reference(*x, plan), layout, q, k, v),
        )
        <= 1e-12
    )
    fn = lambda q, k, v: bucketed_attention(q, k, v, plan, 0.3, seed=1234)  # noqa: E731
    assert torch.equal(fn(q, k, v), fn(q, k, v))  # the seed fixes the dropout mask
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6)


# ----------------------------------------------------------- (c) block sparse
def long_segment_layout():
    """Rows and columns of very different lengths (some far longer than a 16-token bin)."""
    cells = [[[3, 1, 30], [2, 2, 1], [40, 1, 2], [1, 1, 1]], [[1, 2], [5, 70], [2, 3]]]
    return layout_from_cells([5, 2], cells, pad=[3, 0])


@pytest.mark.parametrize("ratio", RATIOS)
def test_block_sparse_equals_masked_forward_and_backward(ratio):
    for layout in (*exact_layouts(), long_segment_layout()):
        q, k, v = inputs(layout)
        ref = run(lambda *x: masked_attention(*x, layout, ratio), layout, q, k, v)
        got = run(lambda *x: block_sparse_attention(*x, layout, ratio, use_flex=False), layout, q, k, v)
        diff = max_diff(got, ref)
        log.info("max|diff| block_sparse vs masked (ratio=%s, N=%d): %.2e", ratio, layout.seq_len, diff)
        assert diff <= 1e-12


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("ratio", RATIOS)
def test_flex_path_forward_equals_masked(ratio):
    for layout in (next(exact_layouts()), long_segment_layout()):
        q, k, v = inputs(layout, dtype=torch.float32, grad=False)
        real = layout.attention_mask[:, None, :, None]
        ref = masked_attention(q, k, v, layout, ratio)
        got = flex_mate_attention(q, k, v, layout, ratio, block_size=16, compiled=False)
        diff = ((got - ref) * real).abs().max().item()
        log.info("max|diff| flex (eager) vs masked (ratio=%s, N=%d): %.2e", ratio, layout.seq_len, diff)
        assert diff <= 1e-5


@pytest.mark.slow
def test_compiled_flex_forward_equals_masked():
    layout = long_segment_layout()
    q, k, v = inputs(layout, dtype=torch.float32, grad=False)
    with torch.no_grad():
        got = flex_mate_attention(q, k, v, layout, 0.5, block_size=16)
    diff = ((got - masked_attention(q, k, v, layout)) * layout.attention_mask[:, None, :, None]).abs().max().item()
    log.info("max|diff| flex (compiled) vs masked: %.2e", diff)
    assert diff <= 1e-5


# ------------------------------------------------- (d) every implementation
PAIRS = [(variant, impl) for variant, impls in mate_mod.VARIANTS.items() for impl in impls]


def mate_triton_interpreting() -> bool:
    from mate_cli.modeling.attention.mate import triton as mate_triton

    return mate_triton.triton_available() and mate_triton.interpreting()


@pytest.mark.parametrize("variant,impl", PAIRS)
def test_padding_never_influences_real_outputs_and_gradients_are_finite(variant, impl):
    if impl == "triton" and not mate_triton_interpreting():  # compiled: tests/modeling/test_mate_triton.py, on CUDA
        pytest.skip("Triton's interpreter is off here (Triton compiled, which takes CUDA tensors, or missing)")
    layout = random_layout(4, query_len=(1, 9), rows=(1, 5), cols=(1, 4), cell_tokens=(1, 4), pad=(1, 12), seed=9)
    backend = MateAttention(num_heads=4, head_dim=8, variant=variant, impl=impl, global_size=8, radius=5)
    q, k, v = inputs(layout)
    out, *grads = run(lambda *x: backend(*x, layout), layout, q, k, v)
    assert out.shape == q.shape and all(torch.isfinite(g).all() for g in grads)
    pad = ~layout.attention_mask[:, None, :, None]
    noise = [torch.randn_like(t) * 1e3 * pad for t in (q, k, v)]
    with torch.no_grad():
        full = backend(q, k, v, layout)
        perturbed = backend(*(t + n for t, n in zip((q, k, v), noise)), layout)
    assert torch.isfinite(full).all() and torch.isfinite(perturbed).all()
    real = layout.attention_mask[:, None, :, None]
    diff = ((full - perturbed) * real).abs().max().item()
    log.info("variant=%s impl=%s: padding perturbation changes real outputs by %.2e", variant, impl, diff)
    assert diff <= 1e-12


def test_exact_auto_picks_masked_or_block_sparse_by_length_and_grad_mode_and_logs_once(caplog):
    backend = MateAttention(num_heads=2, head_dim=4, variant="exact")
    limit = mate_mod.AUTO[("exact", "cpu", None, False)][0]
    at_limit, past = (torch.zeros(1, 2, n, 4) for n in (limit, limit + 1))
    assert backend.resolve_impl(at_limit, at_limit, at_limit) == "masked"
    assert backend.resolve_impl(past, past, past) == "block_sparse"
    train_limit = mate_mod.AUTO[("exact", "cpu", None, True)][0]
    grad = torch.zeros(1, 2, train_limit, 4, requires_grad=True)
    assert backend.resolve_impl(grad, grad, grad) == "masked"
    with torch.no_grad():  # inputs that require grad, but no graph: inference
        assert backend.resolve_impl(grad, grad, grad) == ("masked" if train_limit <= limit else "block_sparse")
    with caplog.at_level(logging.INFO, logger=mate_mod.__name__):
        caplog.clear()
        mate_mod.LOGGED_CHOICES.clear()
        for _ in range(3):
            backend.resolve_impl(past, past, past)
        another_layer = MateAttention(num_heads=2, head_dim=4, variant="exact")  # once per process, not per layer
        for _ in range(3):
            another_layer.resolve_impl(past, past, past)
    assert [r.message for r in caplog.records if "impl=auto" in r.message] == [
        "mate attention variant=exact impl=auto: using 'block_sparse' on cpu for sequences of ~1024 tokens (inference)"
    ]
    # an explicit impl is never switched
    assert (
        MateAttention(num_heads=2, head_dim=4, variant="exact", impl="masked").resolve_impl(past, past, past)
        == "masked"
    )


def test_bucketed_auto_and_kernel_run_the_fused_kernel_only_where_it_applies():
    kernel = mate_bucketed.cpu_kernel_applies(torch.zeros(1))  # False where it does not build here
    x = torch.zeros(1, 2, 16, 4)
    for impl in ("auto", "kernel"):
        backend = MateAttention(num_heads=2, head_dim=4, variant="bucketed", impl=impl, dropout=0.1)
        assert backend.eval().resolve_impl(x, x, x) == ("kernel" if kernel else "eager")
        assert backend.resolve_impl(*(t.double() for t in (x, x, x))) == "eager"
        assert backend.resolve_impl(*(t.bfloat16() for t in (x, x, x))) == ("kernel" if kernel else "eager")
        assert backend.train().resolve_impl(x, x, x) == ("kernel" if kernel else "eager")  # dropout too
    assert MateAttention(num_heads=2, head_dim=4, impl="eager").resolve_impl(x, x, x) == "eager"


def test_options_name_the_function_in_repr():
    exact = MateAttention(num_heads=2, head_dim=4, variant="exact", impl="block_sparse")
    assert repr(exact) == "MateAttention(variant=exact, impl=block_sparse, row_heads_ratio=0.5)"
    default = MateAttention(num_heads=2, head_dim=4)
    assert "variant=bucketed, impl=auto" in repr(default) and "global_size=116, radius=42" in repr(default)


# ------------------------------------------------------------------ (f) config
def test_no_parameters_and_layout_required():
    backend = MateAttention(num_heads=2, head_dim=4)
    assert not list(backend.parameters())
    with pytest.raises(MateError):
        backend(*(torch.zeros(1, 2, 3, 4) for _ in range(3)), None)


# ------------------------------------------------------------ (g) linear cost
class CostCounter(TorchDispatchMode):
    """Matmul FLOPs (``mm/addmm/bmm/baddbmm``, in-place and ``out=`` variants too, which
    ``FlopCounterMode`` skips) and the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.flops, self.largest = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip("_")
        if name in ("mm", "addmm", "bmm", "baddbmm"):
            a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
            self.flops += 2 * a.numel() * b.shape[-1]
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_bucketed_cost_grows_linearly_with_length():
    """The torch path (the fused CPU kernel's count is in test_mate_cpu_kernel.py)."""

    def cost(seq_len: int, grad: bool) -> CostCounter:
        layout = filled_layout(seq_len, query_tokens=32, columns=4, cell_tokens=32)
        backend = MateAttention(num_heads=2, head_dim=16, variant="bucketed", impl="eager")
        q, k, v = (torch.randn(1, 2, seq_len, 16, requires_grad=grad) for _ in range(3))
        backend(q, k, v, layout)  # builds and caches the plan outside the count
        with CostCounter() as counter, torch.set_grad_enabled(grad):
            out = backend(q, k, v, layout)
            if grad:
                out.sum().backward()
        return counter

    for grad in (False, True):
        small, large = cost(2048, grad), cost(4096, grad)
        flops, largest = large.flops / small.flops, large.largest / small.largest
        log.info(
            "bucketed, length x2 (%s): matmul FLOPs x%.3f, largest tensor x%.3f (%d elements at 4096)",
            "fwd+bwd" if grad else "fwd",
            flops,
            largest,
            large.largest,
        )
        assert flops <= 2.1 and largest <= 2.1
        assert large.largest < 4096 * 4096 / 4  # never anything near N x N


def test_the_global_part_attends_to_its_whole_row_or_column_as_the_paper_says():
    """§3.1 / App. D: the first G sorted tokens "attend to and from everything" (under MATE's pattern), so a table
    token sorted into the global part sees its whole column even where the column is longer than the window: its
    output and gradients are exact MATE's, in every implementation (a window-only global part fails here)."""
    from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel

    layout = layout_from_cells([2], [[[2]] * 13])  # one column of 13 two-token cells: 26 tokens, R=3
    heads, dim, G, R = 2, 8, 10, 3
    plan = bucket_plan(layout, heads, 0.5, G, R)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, layout.seq_len, dim) for _ in range(3))
    perm, _ = layout.head_sort_order(heads, 0.5)
    rows = torch.zeros(1, heads, layout.seq_len, 1)
    for h in range(heads):
        rows[0, h, perm[0, h, :G]] = 1.0  # each head's global part
    paths = {
        "exact": lambda *x: masked_attention(*x, layout, 0.5),
        "reference": lambda *x: bucketed_attention_reference(*x, plan),
        "eager": lambda *x: bucketed_attention(*x, plan, use_cpu_kernel=False),
    }
    if mate_cpu_kernel.available():
        paths["kernel"] = lambda *x: bucketed_attention(*x, plan)
    from mate_cli.modeling.attention.mate import triton as mate_triton

    if mate_triton_interpreting():  # compiled: tests/modeling/test_mate_triton.py
        structure = mate_triton.TritonStructure.of(layout, heads, 0.5, G, R)
        paths["triton"] = lambda *x: mate_triton.triton_bucketed_attention(*x, structure, 0.0)
    results = {}
    for name, fn in paths.items():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves) * rows
        out.sum().backward()
        results[name] = [out.detach()] + [t.grad for t in leaves]
    assert layout.seq_len - 4 > 3 * R  # the column is longer than any window
    for name, got in results.items():
        for a, b in zip(got, results["exact"]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_the_earlier_global_part_stays_one_function_for_runs_trained_with_it():
    """``global_rows=query`` (this project's function before 2026-11-26: only the query set of the global part has
    dense rows) is still computed alike by every implementation, and differs from the paper's on a long column; run
    configs of that time are rebuilt with it."""
    from omegaconf import OmegaConf

    from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel
    from mate_cli.run.rebuild import recorded_functions

    layout = layout_from_cells([2], [[[2]] * 13])
    heads, dim, G, R = 2, 8, 10, 3
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, layout.seq_len, dim) for _ in range(3))
    query_plan = bucket_plan(layout, heads, 0.5, G, R, "query")
    reference = bucketed_attention_reference(q, k, v, query_plan)
    torch.testing.assert_close(bucketed_attention(q, k, v, query_plan, use_cpu_kernel=False), reference)
    if mate_cpu_kernel.available():
        torch.testing.assert_close(bucketed_attention(q, k, v, query_plan), reference, atol=1e-5, rtol=1e-5)
    from mate_cli.modeling.attention.mate import triton as mate_triton

    if mate_triton_interpreting():
        structure = mate_triton.TritonStructure.of(layout, heads, 0.5, G, R, "query")
        got = mate_triton.triton_bucketed_attention(q, k, v, structure, 0.0)
        torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
    paper = bucketed_attention_reference(q, k, v, bucket_plan(layout, heads, 0.5, G, R, "all"))
    assert (paper - reference).abs().max() > 1e-3

    run = OmegaConf.create({"attention": {"_target_": "mate_cli.modeling.attention.mate.MateAttention", "radius": 42},
                            "model": {"encoder": {"attention": {
                                "_target_": "mate_cli.modeling.attention.mate.MateAttention"}}}})  # fmt: skip
    OmegaConf.set_struct(run, True)
    recorded_functions(run, Path("resolved_config.yaml"))
    assert run.attention.global_rows == "query" and run.model.encoder.attention.global_rows == "query"
    with pytest.raises(MateError, match="attention.global_rows='every' is unknown: choose all or query"):
        MateAttention(num_heads=2, head_dim=8, global_rows="every")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_auto_on_cuda_takes_triton_in_bf16_and_float32_with_or_without_dropout_and_eager_in_float64():
    from mate_cli.modeling.attention.mate.triton import triton_runs_on

    layout = random_layout(2, seed=0).to("cuda")
    x = torch.randn(layout.batch_size, 2, layout.seq_len, 8, device="cuda", dtype=torch.bfloat16)
    grad = x.clone().requires_grad_()
    auto = MateAttention(num_heads=2, head_dim=8, variant="bucketed", impl="auto", dropout=0.1)
    fast = "triton" if triton_runs_on(x) else "eager"
    assert auto.eval().resolve_impl(x, x, x) == fast
    assert auto.train().resolve_impl(grad, grad, grad) == fast  # attention dropout in the kernels
    assert auto.eval().resolve_impl(x.float(), x.float(), x.float()) == fast
    assert auto.eval().resolve_impl(x.double(), x.double(), x.double()) == "eager"


def test_a_removed_implementation_is_refused_in_one_line_with_what_replaces_it():
    with pytest.raises(MateError, match=r"attention.impl=flex was removed .*attention.impl=auto, the same function"):
        MateAttention(num_heads=2, head_dim=8, variant="bucketed", impl="flex")


def test_auto_is_one_table_with_the_reason_for_each_boundary():
    choice, cuda = mate_mod.auto_choice, torch.device("cuda")
    assert [choice("bucketed", cuda, torch.bfloat16, grad, n) for grad in (False, True) for n in (16, 32768)] == [
        "triton"
    ] * 4
    assert choice("bucketed", cuda, torch.float16, True, 4096) == "triton"
    assert [choice("bucketed", cuda, torch.float32, grad, 32768) for grad in (False, True)] == ["triton"] * 2
    assert choice("bucketed", cuda, torch.float64, False, 2048) is None  # no row: eager
    assert [choice("exact", cuda, torch.bfloat16, grad, n) for grad in (False, True) for n in (4096, 4097)] == [
        "masked", "block_sparse"] * 2  # fmt: skip
    assert choice("exact", cuda, torch.float32, True, 4097) == "block_sparse"  # the any-dtype row
    exact = MateAttention(num_heads=2, head_dim=4, variant="exact")  # a call reads its device's rows (meta: CUDA's)
    calls = [torch.empty(1, 2, n, 4, device="meta", requires_grad=True) for n in (4096, 4097)]
    assert [exact.resolve_impl(q, q, q) for q in calls] == ["masked", "block_sparse"]
    assert all(
        row[1] in mate_mod.VARIANTS[key[0]] and row[2] in mate_mod.VARIANTS[key[0]]
        for key, row in mate_mod.AUTO.items()
    )
    assert choice("exact", torch.device("mps"), torch.float32, False, 2048) == "masked"  # CUDA's row
    assert choice("exact", torch.device("cpu"), torch.bfloat16, False, 577) == "block_sparse"  # any dtype
    assert all(row[3] for row in mate_mod.AUTO.values())
