"""One attention config computes one function: in training and evaluation, with and
without grad, alone and in any batch.

For every registered backend and every MATE (variant, impl) pair, float32, at layer
level (q, k, v on the layout layer 0 sees) and through a tiny ``TableEncoder``:

(a) a training-mode forward (dropout 0, grad enabled, inputs requiring grad: how a
    training step runs it) equals an eval-mode forward under ``no_grad`` (how eval,
    predict, PointR and an exported encoder run it);
(b) grad enabled equals ``no_grad`` (eval mode);
(c) an example alone equals the same example padded in a batch with a much longer
    one, at its real positions (eval/no-grad and train/grad).

All to max |diff| <= 1e-5. The layouts are realistic tables (:func:`filled_layout`)
whose query set is longer than G and whose rows and columns are longer than R (small
G=8, R=6 keep the test fast), so MATE's bucketed approximation really differs from
the exact pattern here; the lengths straddle the CPU thresholds of MATE's ``auto``
(the short example alone is 448 tokens, the batch 960). The ``none`` floor refuses
training (``TableEncoder.check_trainable``), so it is tested in eval/no-grad only.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli.modeling.attention import REGISTRY
from mate_cli.modeling.attention.mate import VARIANTS, auto_choice
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import TableLayout
from mate_cli.modeling.synthetic import filled_layout
from tests.modeling.backend_cases import (
    CONFIGS,
    G,
    HEAD_DIM,
    HEADS,
    IDS,
    OPTIONS,
    R,
    case_id,
    layer_layout,
    layouts,
    make_backend,
)

log = logging.getLogger(__name__)

TOL = 1e-5


def qkv(shape, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(3)]


def forward(backend, layout, q, k, v, *, train: bool) -> torch.Tensor:
    """Training (train mode, grad, inputs requiring grad) or evaluation (eval mode, no_grad)."""
    backend.train(train)
    with torch.set_grad_enabled(train):
        inputs = [t.detach().requires_grad_(train) for t in (q, k, v)]
        out = backend(*inputs, layout)
    return out.detach()


def max_diff(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> float:
    """Max |a - b| over the real positions ``real`` ``[batch, seq]`` of ``[batch, heads, seq, dim]``."""
    return (a - b).abs().amax((1, 3))[real].max().item()


def skip_floor(name: str) -> None:
    if not REGISTRY[name].trainable:
        pytest.skip(f"'{name}' refuses training: tested in eval/no-grad only (the padding test)")


# ------------------------------------------------------------------ layer level
@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
@pytest.mark.parametrize("which", ["short", "batch"])
def test_training_forward_equals_evaluation_forward(name, options, which):
    """(a) train mode + grad (dropout 0) == eval mode + no_grad."""
    skip_floor(name)
    layout = layouts()[0 if which == "short" else 1]
    backend = make_backend(name, options, layouts()[1].seq_len)
    layout = layer_layout(backend, layout)
    q, k, v = qkv((layout.batch_size, HEADS, layout.seq_len, HEAD_DIM), seed=0)
    trained = forward(backend, layout, q, k, v, train=True)
    evaluated = forward(backend, layout, q, k, v, train=False)
    diff = max_diff(trained, evaluated, layout.attention_mask)
    log.info("%s %s (%s, N=%d): train vs eval max|diff| %.2e", name, options, which, layout.seq_len, diff)
    assert diff <= TOL


@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
@pytest.mark.parametrize("which", ["short", "batch"])
def test_grad_enabled_equals_no_grad(name, options, which):
    """(b) eval mode: inputs requiring grad under grad == no_grad."""
    skip_floor(name)
    layout = layouts()[0 if which == "short" else 1]
    backend = make_backend(name, options, layouts()[1].seq_len).eval()
    layout = layer_layout(backend, layout)
    q, k, v = qkv((layout.batch_size, HEADS, layout.seq_len, HEAD_DIM), seed=1)
    with torch.enable_grad():
        graded = backend(*(t.clone().requires_grad_() for t in (q, k, v)), layout)
    with torch.no_grad():
        plain = backend(q, k, v, layout)
    diff = max_diff(graded.detach(), plain, layout.attention_mask)
    log.info("%s %s (%s, N=%d): grad vs no_grad max|diff| %.2e", name, options, which, layout.seq_len, diff)
    assert graded.requires_grad and diff <= TOL


@pytest.mark.parametrize("name,options", CONFIGS, ids=IDS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_an_example_alone_equals_it_batched_with_a_much_longer_one(name, options, train):
    """(c) the short example alone == the same example padded next to a ~3x longer one."""
    if train:
        skip_floor(name)
    short, batch = layouts()
    backend = make_backend(name, options, batch.seq_len)
    alone, together = layer_layout(backend, short), layer_layout(backend, batch)
    n = alone.seq_len
    assert together.seq_len > 2 * n and torch.equal(together.token_type_ids[1, :n], alone.token_type_ids[0])
    q1, k1, v1 = qkv((1, HEADS, n, HEAD_DIM), seed=2)
    q2, k2, v2 = qkv((2, HEADS, together.seq_len, HEAD_DIM), seed=3)  # padding gets noise, not zeros
    for mine, batched in ((q1, q2), (k1, k2), (v1, v2)):
        batched[1, :, :n] = mine[0]
    out_alone = forward(backend, alone, q1, k1, v1, train=train)
    out_batched = forward(backend, together, q2, k2, v2, train=train)[1:, :, :n]
    diff = max_diff(out_alone, out_batched, alone.attention_mask)
    log.info("%s %s (%s): alone (N=%d) vs batched (N=%d) max|diff| %.2e",
             name, options, "train" if train else "eval", n, together.seq_len, diff)  # fmt: skip
    assert diff <= TOL


def test_the_layouts_make_the_choice_of_function_matter():
    """On these tables bucketed (G=8, R=6) and exact MATE are different functions, so
    the tests above would see a switch between them."""
    short = layouts()[0]
    q, k, v = qkv((1, HEADS, short.seq_len, HEAD_DIM), seed=5)
    exact, bucketed = (
        forward(make_backend("mate", {"variant": variant, "impl": "auto"}, short.seq_len), short, q, k, v, train=False)
        for variant in VARIANTS
    )
    diff = max_diff(exact, bucketed, short.attention_mask)
    log.info("exact vs bucketed (G=%d, R=%d, N=%d): max|diff| %.2e", G, R, short.seq_len, diff)
    assert diff > 0.1
    # and exact's auto switches implementation across these lengths and grad modes
    cpu = torch.device("cpu")
    choice = functools.partial(auto_choice, "exact", cpu, torch.float32)
    choices = {choice(grad, layout.seq_len) for layout in layouts() for grad in (False, True)}
    assert choices == {"masked", "block_sparse"}
    assert choice(True, layouts()[1].seq_len) != choice(False, layouts()[1].seq_len)


# ------------------------------------------------------------------ encoder level
ENCODER_CONFIGS = [
    ("mate", {"variant": "bucketed", "impl": "auto"}),
    ("mate", {"variant": "exact", "impl": "auto"}),
    ("table_etc", {}),
]


def tiny_encoder(name: str, options: dict) -> TableEncoder:
    torch.manual_seed(0)
    config = EncoderConfig(
        vocab_size=64,
        hidden_size=HEADS * HEAD_DIM,
        num_layers=2,
        num_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        reset_position_index_per_cell=True,
    )
    factory = functools.partial(REGISTRY[name], **OPTIONS.get(name, {}), **options)
    return TableEncoder(config, factory, max_length=layouts()[1].seq_len)


def encode(model: TableEncoder, ids: torch.Tensor, layout: TableLayout, *, train: bool) -> torch.Tensor:
    model.train(train)
    with torch.set_grad_enabled(train):
        return model(ids, layout.with_fields()).detach()  # a fresh layout per call, as a new batch


@pytest.mark.parametrize("name,options", ENCODER_CONFIGS, ids=[case_id(*config) for config in ENCODER_CONFIGS])
def test_encoder_computes_one_function(name, options):
    """(a), (b) and (c) through a 2-layer encoder: hidden states at real tokens."""
    short, batch = layouts()
    model = tiny_encoder(name, options)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 64, (2, batch.seq_len), generator=g) * batch.attention_mask
    n = short.seq_len
    ids[1, :n] = torch.randint(1, 64, (n,), generator=g)
    cases = {"short": (ids[1:, :n], short), "batch": (ids, batch)}
    diffs, outputs = {}, {}
    for which, (case_ids, layout) in cases.items():
        evaluated, trained = outputs[which] = [encode(model, case_ids, layout, train=train) for train in (False, True)]
        model.eval()
        with torch.enable_grad():  # (b) eval mode, grad through the parameters
            graded = model(case_ids, layout.with_fields())
        assert graded.requires_grad
        real = layout.attention_mask
        diffs[f"train vs eval ({which})"] = (trained - evaluated).abs().amax(-1)[real].max().item()
        diffs[f"grad vs no_grad ({which})"] = (graded.detach() - evaluated).abs().amax(-1)[real].max().item()
    for i, mode in enumerate(("eval", "train")):
        diffs[f"alone vs batched ({mode})"] = (outputs["short"][i] - outputs["batch"][i][1:, :n]).abs().max().item()
    log.info("encoder %s %s: %s", name, options, ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.parametrize(
    "name,options",
    [("dense", {}), *ENCODER_CONFIGS[:2]],
    ids=["dense", *(case_id(*config) for config in ENCODER_CONFIGS[:2])],
)
def test_gradient_checkpointing_keeps_the_function_and_its_gradients_with_dropout_on(name, options):
    """``model.encoder.gradient_checkpointing=true`` recomputes each layer in the backward pass: the same
    outputs and parameter gradients in training (dropout replays its masks), and nothing saved per layer."""
    short, _ = layouts()
    torch.manual_seed(0)
    config = EncoderConfig(
        vocab_size=64,
        hidden_size=HEADS * HEAD_DIM,
        num_layers=2,
        num_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout=0.1,
        attention_dropout=0.1,
        reset_position_index_per_cell=True,
    )
    model = TableEncoder(
        config, functools.partial(REGISTRY[name], **OPTIONS.get(name, {}), **options), max_length=short.seq_len
    ).train()
    ids = torch.randint(1, 64, (1, short.seq_len), generator=torch.Generator().manual_seed(5))
    runs = {}
    for on in (False, True):
        model.gradient_checkpointing = on
        model.zero_grad()
        torch.manual_seed(7)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = model(ids, short.with_fields())
        out.square().mean().backward()
        runs[on] = (
            out.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            sum(saved),
        )
    (plain, plain_grads, plain_saved), (ckpt, ckpt_grads, ckpt_saved) = runs[False], runs[True]
    model.eval()
    with torch.no_grad():
        assert (model(ids, short.with_fields()) - plain).abs().max() > 1e-3  # dropout was really on
    assert torch.allclose(ckpt, plain, atol=1e-6) and plain_grads.keys() == ckpt_grads.keys()
    assert max((ckpt_grads[n] - g).abs().max().item() for n, g in plain_grads.items()) <= 1e-6
    log.info("%s: saved %d vs %d values", name, ckpt_saved, plain_saved)
    assert ckpt_saved < plain_saved / 4  # only the layers' inputs were kept for the backward pass


@pytest.mark.parametrize("name,options", [("dense", {}), ENCODER_CONFIGS[0]], ids=["dense", "mate-bucketed-auto"])
def test_a_compiled_encoder_is_the_same_function_and_compiles_once_for_every_length(name, options):
    """``model.encoder.compile`` (traced by ``aot_eager`` here: Dynamo and AOTAutograd, no code generation): the same
    hidden states and parameter gradients as the eager stack in training, at three batch lengths; for dense, the
    lengths after the first reuse its graph (dynamic shapes: no recompilation)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    short, batch = layouts()
    model = tiny_encoder(name, options).train()
    compiled = ("aot_eager", None)
    frames = []
    for length in (short.seq_len, batch.seq_len, short.seq_len - 40):
        layout = filled_layout(length, query_tokens=12, columns=4, cell_tokens=6, seed=length)
        ids = torch.randint(1, 64, (1, length), generator=torch.Generator().manual_seed(length))
        runs = []
        for model.compiled in (None, compiled):
            model.zero_grad()
            hidden = model(ids, layout.with_fields())
            hidden.square().mean().backward()
            runs.append((hidden.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        frames.append(counters["frames"]["ok"])
        (eager, eager_grads), (traced, traced_grads) = runs
        assert (eager - traced).abs().max().item() <= TOL
        assert len(eager_grads) == len(traced_grads) > 0
        assert max((a - b).abs().max().item() for a, b in zip(eager_grads, traced_grads)) <= TOL
    assert frames[0] > 0
    if name == "dense":
        assert frames[1] == frames[2] == frames[0], frames


def test_a_compile_setting_that_names_no_backend_or_mode_is_one_line():
    config = tiny_encoder("dense", {}).config
    with pytest.raises(MateError, match=r"model.encoder.compile='nosuch' is invalid; use false, true \(Inductor\)"):
        TableEncoder(config, "dense", compile="nosuch")
    with pytest.raises(MateError, match=r"compile_mode='fastest' is invalid; use null or one of default, reduce-"):
        TableEncoder(config, "dense", compile=True, compile_mode="fastest")
    with pytest.raises(MateError, match=r"compile_mode=reduce-overhead is Inductor's, but model.encoder.compile=aot"):
        TableEncoder(config, "dense", compile="aot_eager", compile_mode="reduce-overhead")
    assert TableEncoder(config, "dense", compile=True, compile_mode="max-autotune").compiled == (
        "inductor",
        "max-autotune",
    )
