"""The fused CPU kernel of bucketed MATE (``csrc/mate_bucketed_cpu.cpp``) against the torch path.

The kernel is compiled on first use; where no compiler exists the tests that need it
skip with the reason (the torch path is then what runs everywhere, and the bucketed
tests in test_attention_mate.py cover it).
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from mate_cli.bench.measure import relative_error
from mate_cli.modeling.attention.mate import bucketed as mate_bucketed
from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel
from mate_cli.modeling.attention.mate.bucketed import bucketed_attention
from mate_cli.modeling.attention.mate.plan import bucket_plan
from mate_cli.modeling.attention.mate.reference import bucketed_attention_reference
from mate_cli.modeling.synthetic import filled_layout
from tests.modeling.random_layouts import random_layout
from tests.modeling.bucketed_cases import CASES, with_hole

log = logging.getLogger(__name__)

needs_kernel = pytest.mark.skipif(
    not mate_cpu_kernel.available(), reason=f"fused CPU kernel unavailable: {mate_cpu_kernel.unavailable_reason()}"
)


class OpCalls(TorchDispatchMode):
    """Names of the aten/custom ops a block dispatches."""

    def __enter__(self):
        self.names = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def both_paths(q, k, v, plan):
    with torch.no_grad():
        return tuple(bucketed_attention(q, k, v, plan, use_cpu_kernel=use) for use in (True, False))


#: head dims: whole vectors of every build (16); a narrow tail after whole vectors with 16
#: lanes (24); and narrower than one vector with 16 lanes, a tail with 8 (12): the scalar
#: edges of the products and transposes in each build
DIMS = [16, 24, 12]


@needs_kernel
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("ratio", [0.5, 0.0, 1.0])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_equals_torch_path_and_reference(case, ratio, dim):
    make, G, R = CASES[case]
    layout = make()
    heads = 4
    plan = bucket_plan(layout, heads, ratio, G, R)
    g = torch.Generator().manual_seed(case)
    # the encoder's layout: a [B, N, H, D] buffer seen as [B, H, N, D]
    q, k, v = (
        torch.randn(layout.batch_size, layout.seq_len, heads, dim, generator=g).transpose(1, 2) for _ in range(3)
    )
    fused, torch_path = both_paths(q, k, v, plan)
    reference = bucketed_attention_reference(q, k, v, plan)
    real = layout.attention_mask[:, None, :, None]
    diff = ((fused - torch_path) * real).abs().max().item()
    diff_ref = ((fused - reference) * real).abs().max().item()
    log.info("kernel vs torch path (case %d, ratio %s, G=%d, R=%d): %.2e; vs App. D reference %.2e",
             case, ratio, G, R, diff, diff_ref)  # fmt: skip
    assert diff <= 2e-6 and diff_ref <= 2e-6
    assert fused.shape == q.shape and torch.isfinite(fused).all()


@needs_kernel
def test_kernel_runs_only_where_it_applies():
    layout = random_layout(2, seed=3)
    shape = (2, 2, layout.seq_len, 8)

    def ops(dtype, grad=False, dropout=0.0, use_cpu_kernel=True):
        q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=grad) for _ in range(3))
        plan = bucket_plan(layout, 2, 0.5, 8, 4)
        with OpCalls() as calls, torch.set_grad_enabled(grad):
            bucketed_attention(q, k, v, plan, dropout_p=dropout, use_cpu_kernel=use_cpu_kernel)
        return "mate_cpu.bucketed_forward" in calls.names

    assert ops(torch.float32)  # inference
    assert ops(torch.float32, grad=True)  # forward of a training step
    assert ops(torch.float32, grad=True, dropout=0.1)  # attention dropout too (its own masks)
    assert ops(torch.bfloat16) and ops(torch.float16, grad=True)  # CPU autocast: widened to float32
    assert not ops(torch.float64)
    assert not ops(torch.float32, use_cpu_kernel=False)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout_kind", ["bnhd", "bhnd"])
@pytest.mark.parametrize("case", [1, 4, 5])
def test_reduced_precision_is_the_float32_kernel_on_widened_inputs_rounded_once(case, layout_kind, dtype):
    """bf16/fp16 q, k, v (CPU autocast) run the float32 kernel: the output is the float32
    kernel's on the widened inputs, rounded once, and each gradient is the float32 backward's
    on the widened tensors (the rounded output among them), rounded once; bit for bit. Its
    error against float32 inputs is below the torch path's in the same dtype."""
    make, G, R = CASES[case]
    layout = make()
    heads, dim = 4, 24
    plan = bucket_plan(layout, heads, 0.5, G, R)
    g = torch.Generator().manual_seed(case)
    shape = (layout.batch_size, layout.seq_len, heads, dim)
    base = [torch.randn(shape, generator=g).transpose(1, 2) for _ in range(4)]
    if layout_kind == "bhnd":
        base = [t.contiguous() for t in base]
    *qkv, cot = base
    leaves = [t.to(dtype).requires_grad_() for t in qkv]
    workspace = mate_bucketed.Workspace()  # the float32 copies' scratch, as the layers share it
    with OpCalls() as calls:
        out = bucketed_attention(*leaves, plan, workspace=workspace)
        out.backward(cot.to(dtype))
    # results own their memory: another call through the same scratch leaves them as they were
    kept = [t.clone() for t in (out.detach(), *(leaf.grad for leaf in leaves))]
    others = [torch.randn_like(t).requires_grad_() for t in leaves]
    bucketed_attention(*others, plan, workspace=workspace).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(kept, (out.detach(), *(leaf.grad for leaf in leaves))))
    assert {"mate_cpu.bucketed_forward", "mate_cpu.bucketed_backward"} <= set(calls.names)
    assert out.dtype == dtype and out.transpose(1, 2).is_contiguous()  # still a [B, N, H, D] buffer
    with torch.no_grad():
        widened = [t.detach().float() for t in leaves]
        assert torch.equal(out, bucketed_attention(*widened, plan).to(dtype))
    grads32 = mate_bucketed._fused_cpu_backward(
        *widened, out.detach().float(), cot.to(dtype).float(), plan, 0.0, 0, mate_bucketed.Workspace()
    )
    for leaf, grad32 in zip(leaves, grads32):
        assert leaf.grad.dtype == dtype and leaf.grad.stride() == leaf.stride()
        assert torch.equal(leaf.grad, grad32.to(dtype))
    # float32 math beats the torch path's reduced-precision math against float32 inputs
    real = layout.attention_mask[:, None, :, None]
    with torch.no_grad():
        reference = bucketed_attention(*qkv, plan)
        eager = bucketed_attention(*(t.to(dtype) for t in qkv), plan, use_cpu_kernel=False)
    kernel_error, eager_error = (relative_error(x, reference, real) for x in (out, eager))
    log.info("%s, case %d: error vs float32, kernel %.1e, torch path %.1e", dtype, case, kernel_error, eager_error)
    assert 0 < kernel_error < eager_error


@needs_kernel
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("layout_kind", ["bnhd", "bhnd"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_backward_equals_torch_backward_and_float64_reference(case, layout_kind, dim):
    """The fused backward (``mate_cpu.bucketed_backward``) against the eager backward (float32)
    and against autograd through the App. D reference in float64. The cotangent is nonzero on
    padding rows too, so their (uniform-softmax) gradients are compared as well."""
    make, G, R = CASES[case]
    layout = make()
    heads = 4
    plan = bucket_plan(layout, heads, 0.5, G, R)
    g = torch.Generator().manual_seed(case)
    shape = (layout.batch_size, layout.seq_len, heads, dim)
    if layout_kind == "bnhd":  # the encoder's layout
        base = [torch.randn(shape, generator=g).transpose(1, 2) for _ in range(3)]
    else:
        base = [torch.randn(shape, generator=g).transpose(1, 2).contiguous() for _ in range(3)]
    cot = torch.randn(base[0].shape, generator=g)
    grads = {}
    for path in ("kernel", "torch", "reference"):
        leaves = [(t.double() if path == "reference" else t.clone()).requires_grad_() for t in base]
        with OpCalls() as calls:
            if path == "reference":
                out = bucketed_attention_reference(*leaves, plan)
            else:
                out = bucketed_attention(*leaves, plan, use_cpu_kernel=path == "kernel")
            (out * cot.to(out.dtype)).sum().backward()
        assert ("mate_cpu.bucketed_backward" in calls.names) == (path == "kernel")
        grads[path] = [t.grad for t in leaves]
    vs_torch = max((a - b).abs().max().item() for a, b in zip(grads["kernel"], grads["torch"]))
    vs_reference = max((a.double() - b).abs().max().item() for a, b in zip(grads["kernel"], grads["reference"]))
    scale = max(b.abs().max().item() for b in grads["reference"])
    log.info("backward, case %d (%s): kernel vs torch %.2e, vs float64 reference %.2e (largest gradient %.2f)",
             case, layout_kind, vs_torch, vs_reference, scale)  # fmt: skip
    assert vs_torch <= 5e-6 and vs_reference <= 5e-6 * max(scale, 1.0)
    assert all(a.shape == b.shape and a.stride() == b.stride() for a, b in zip(grads["kernel"], base))


@needs_kernel
@pytest.mark.parametrize("hole", [False, True], ids=["prefix", "hole"])
@pytest.mark.parametrize("layout_kind", ["bnhd", "bhnd"])
def test_kernel_dropout_is_seeded_unbiased_and_its_backward_redraws_the_forward_masks(layout_kind, hole):
    layout = random_layout(2, query_len=(2, 6), rows=(2, 4), cols=(2, 3), cell_tokens=(1, 3), pad=(0, 4), seed=4)
    layout = with_hole(layout) if hole else layout
    plan = bucket_plan(layout, 4, 0.5, 8, 6)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(layout.batch_size, layout.seq_len, 4, 8, generator=g).transpose(1, 2) for _ in range(3))
    if layout_kind == "bhnd":
        q, k, v = (t.contiguous() for t in (q, k, v))
    real = layout.attention_mask[:, None, :, None].bool()

    def attend(q, k, v, seed=123, p=0.3):
        return bucketed_attention(q, k, v, plan, dropout_p=p, seed=seed)

    with torch.no_grad():
        first = attend(q, k, v)
        assert torch.equal(first, attend(q, k, v))  # one seed, one mask ...
        other = attend(*(t.contiguous() if layout_kind == "bnhd" else t.transpose(1, 2).contiguous().transpose(1, 2)
                         for t in (q, k, v)))  # fmt: skip
        assert torch.allclose(first, other, atol=1e-6)  # ... whatever the memory layout
        assert not torch.allclose(first, attend(q, k, v, seed=124))
        assert torch.equal(attend(q, k, v, p=0.0), bucketed_attention(q, k, v, plan))
        # E[mask] = 1: the mean over many seeds approaches the output without dropout
        mean = sum(attend(q, k, v, seed=s) for s in range(300)) / 300
        assert ((mean - attend(q, k, v, p=0.0)) * real).abs().max() < 0.15 < (first - mean).abs().max()
    # the backward's gradient is the derivative of the forward with the same masks:
    # directional derivatives against central differences (float32, eps 1e-2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    cot = torch.randn(q.shape, generator=g)
    (attend(*leaves) * cot).sum().backward()
    for _ in range(3):
        d = [torch.randn(t.shape, generator=g) for t in leaves]
        with torch.no_grad():
            # summed in float64, so the difference's noise is the outputs' float32 rounding only
            ahead, behind = ((attend(*[t + s * 1e-2 * x for t, x in zip(leaves, d)]).double() * cot).sum()
                             for s in (1, -1))  # fmt: skip
        numeric = ((ahead - behind) / 2e-2).item()
        analytic = sum((t.grad * x).sum() for t, x in zip(leaves, d)).item()
        # float32 forward: ~1e-3 of noise; other masks would be off by O(1) (e.g. 25.5 vs 35.9)
        assert abs(numeric - analytic) <= 1e-2 + 2e-3 * abs(analytic), (numeric, analytic)


@needs_kernel
def test_flop_counter_sees_the_kernel_and_cost_is_linear():
    def flops(seq_len: int) -> int:
        layout = filled_layout(seq_len)
        plan = bucket_plan(layout, 4, 0.5, 116, 42)
        q, k, v = (torch.randn(1, 4, seq_len, 16, requires_grad=True) for _ in range(3))
        keys = plan.kernel_args[1]
        per_gemm = 42 * 16 * (int(keys.sum()) + 3 * 42 * keys.numel()) + plan.dense_rows * plan.real_len[0] * 16 * 4
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            bucketed_attention(q, k, v, plan)
        assert counter.get_total_flops() == 4 * per_gemm  # scores + context
        out = bucketed_attention(q, k, v, plan)
        with FlopCounterMode(display=False) as counter:
            out.sum().backward()
        assert counter.get_total_flops() == 10 * per_gemm  # scores again, dP, dV, dQ, dK
        return 4 * per_gemm

    assert flops(4096) / flops(2048) <= 2.1


@pytest.mark.skipif(
    os.environ.get("MATE_REQUIRE_CPU_KERNEL") != "1", reason="MATE_REQUIRE_CPU_KERNEL=1 (set by .ci/run) not set"
)
def test_kernel_builds_where_required():
    """CI has a compiler: there a missing kernel is a failure, not a row of skips."""
    assert mate_cpu_kernel.available(), mate_cpu_kernel.unavailable_reason()


def test_switch_off_by_environment(monkeypatch):
    monkeypatch.setattr(mate_cpu_kernel, "_state", {})
    monkeypatch.setenv("MATE_CPU_KERNEL", "0")
    assert mate_cpu_kernel.load() is False
    assert mate_cpu_kernel.unavailable_reason() == "MATE_CPU_KERNEL=0"


X86 = platform.machine().lower() in ("x86_64", "amd64")


@needs_kernel
@pytest.mark.skipif(not X86, reason="the narrower builds are named by x86 flags")
@pytest.mark.parametrize(
    "flags, lanes",
    [pytest.param("-mno-avx512f", 8, id="avx2"), pytest.param("-mno-avx", 4, id="sse", marks=pytest.mark.slow)],
)
def test_narrower_vector_builds_agree_with_the_torch_path(flags, lanes, tmp_path):
    """The kernel's vector code takes its lanes (and register blocks) from the build
    target. This machine's build is the widest it has; a user's may be narrower (AVX2 on
    most desktops), so that build is made here too, in a fresh process (the op library
    loads once per process), and must pass the exactness tests. Where this machine's own
    build already has that many lanes (an AVX2 machine), it is that build, which the rest of
    this module tests."""
    if mate_cpu_kernel.vector_lanes() == lanes:
        pytest.skip(f"this machine's own build has {lanes}-lane vectors already: the tests above ran it")
    env = {**os.environ, mate_cpu_kernel.EXTRA_FLAGS_ENV: flags, "MATE_REQUIRE_CPU_KERNEL": "1"}
    probe = (
        "from mate_cli.modeling.attention.mate import cpu_kernel as m; "
        "assert m.load(), m.unavailable_reason(); print(m.vector_lanes())"
    )
    built = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    assert int(built.stdout.split()[-1]) == lanes
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-k", "equals or dropout or builds_where_required",
         "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert " passed" in tests.stdout and " skipped" not in tests.stdout.split("slowest")[0], tests.stdout[-1500:]


def test_malformed_extra_flags_give_one_line_naming_the_variable(monkeypatch, caplog):
    monkeypatch.setattr(mate_cpu_kernel, "_state", {})
    monkeypatch.setenv(mate_cpu_kernel.EXTRA_FLAGS_ENV, '"-O2')  # unbalanced quote
    with caplog.at_level(logging.WARNING):
        assert mate_cpu_kernel.load() is False
    reason = mate_cpu_kernel.unavailable_reason()
    assert mate_cpu_kernel.EXTRA_FLAGS_ENV in reason and "fix or unset it" in reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
