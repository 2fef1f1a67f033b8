"""Reduced precision: every attention backend and MATE implementation under autocast.

Each runs where a training run puts it: under ``torch.autocast`` (``trainer.precision=
bf16-mixed`` / ``16-mixed``), with q, k, v in the reduced dtype as the encoder's linear
layers give them. Its output and the gradients of q, k, v are compared with the same
module in float32 on the same inputs, as the largest difference over the largest float32
value (padding rows excluded), against a stated tolerance: bfloat16 keeps 8 significant
bits (a relative rounding of 2^-9), float16 11 (2^-12); the tolerances leave a few times
the error measured on these inputs and are far below what a wrong mask or a dropped
rescaling gives (O(1)). Devices: CPU (bfloat16), and CUDA where it exists (bfloat16
and float16).

Through a 2-layer encoder with a token-classification head, a few AdamW steps under
autocast keep a finite cross-entropy within a stated tolerance of the float32 run's, step
by step.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from mate_cli.bench.measure import relative_error
from mate_cli.modeling.attention import REGISTRY
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.modeling.synthetic import filled_layout
from tests.modeling import backend_cases as cases

log = logging.getLogger(__name__)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

#: largest |reduced - float32| / largest |float32|, outputs and input gradients
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}
#: largest |loss_reduced - loss_float32| / loss_float32 over the training steps
LOSS_TOLERANCE = {torch.bfloat16: 5e-3, torch.float16: 2e-3}

CASES = [("cpu", torch.bfloat16)] + (
    [("cuda", torch.bfloat16), ("cuda", torch.float16)] if torch.cuda.is_available() else []
)
CASE_IDS = [f"{device}-{str(dtype).removeprefix('torch.')}" for device, dtype in CASES]


@functools.cache
def batch_layout():
    """A padded batch of two realistic tables (|Q| > G, rows and columns longer than R)."""
    return cases.stack(
        filled_layout(320, query_tokens=20, columns=5, cell_tokens=8, seed=3),
        filled_layout(192, query_tokens=12, columns=4, cell_tokens=6, seed=4),
    )


def run(backend, layout, base, cot, dtype, device) -> list[torch.Tensor]:
    """Output and q, k, v gradients (float32 copies); autocast to ``dtype`` unless float32."""
    train = backend.trainable
    backend.train(train)
    leaves = [t.detach().to(device, dtype).clone().requires_grad_(train) for t in base]
    with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32), torch.set_grad_enabled(train):
        out = backend(*leaves, layout)
        if train:
            (out.float() * cot.to(device)).sum().backward()
    return [out.detach().float()] + ([t.grad.float() for t in leaves] if train else [])


@pytest.mark.parametrize("device,dtype", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name,options", cases.CONFIGS, ids=cases.IDS)
def test_every_backend_under_autocast_stays_within_tolerance_of_float32(name, options, device, dtype):
    backend = cases.make_backend(name, options, 512)
    layout = cases.layer_layout(backend, batch_layout()).to(device)
    backend = backend.to(device)
    g = torch.Generator().manual_seed(0)
    shape = (layout.batch_size, cases.HEADS, layout.seq_len, cases.HEAD_DIM)
    base = [torch.randn(shape, generator=g) for _ in range(3)]
    cot = torch.randn(shape, generator=g)
    reference = run(backend, layout, base, cot, torch.float32, device)
    reduced = run(backend, layout, base, cot, dtype, device)
    real = layout.attention_mask[:, None, :, None]
    errors = [relative_error(a, b, real) for a, b in zip(reduced, reference)]
    log.info("%s %s on %s in %s: relative error out/dq/dk/dv %s", name, options, device, dtype,
             " ".join(f"{e:.1e}" for e in errors))  # fmt: skip
    assert all(torch.isfinite(t).all() for t in reduced)
    assert max(errors) <= TOLERANCE[dtype], errors


ENCODER_CONFIGS = [
    ("dense", {}),
    ("mate", {"variant": "bucketed", "impl": "auto"}),
    ("mate", {"variant": "exact", "impl": "auto"}),
    ("table_etc", {}),
    ("linformer", {}),
]


@pytest.mark.parametrize("device,dtype", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name,options", ENCODER_CONFIGS, ids=[cases.case_id(*c) for c in ENCODER_CONFIGS])
def test_training_steps_under_autocast_track_float32(name, options, device, dtype):
    layout = batch_layout().to(device)
    g = torch.Generator().manual_seed(1)
    ids = (torch.randint(1, 64, (layout.batch_size, layout.seq_len), generator=g) * layout.attention_mask.cpu()).to(
        device
    )
    labels = torch.randint(0, 64, (layout.batch_size, layout.seq_len), generator=g).to(device)
    real = layout.attention_mask
    losses = {}
    for run_dtype in (torch.float32, dtype):
        torch.manual_seed(0)
        config = EncoderConfig(
            vocab_size=64,
            hidden_size=cases.HEADS * cases.HEAD_DIM,
            num_layers=2,
            num_heads=cases.HEADS,
            intermediate_size=64,
            max_position_embeddings=64,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            reset_position_index_per_cell=True,
        )
        model = TableEncoder(config, functools.partial(REGISTRY[name], **cases.OPTIONS.get(name, {}), **options),
                             max_length=512).to(device).train()  # fmt: skip
        head = torch.nn.Linear(cases.HEADS * cases.HEAD_DIM, 64).to(device)  # a token-classification head
        optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-2)
        losses[run_dtype] = []
        for _ in range(4):
            optimizer.zero_grad()
            with torch.autocast(device, dtype=run_dtype, enabled=run_dtype != torch.float32):
                logits = head(model(ids, layout.with_fields()))
            loss = torch.nn.functional.cross_entropy(logits[real].float(), labels[real])
            loss.backward()
            optimizer.step()
            losses[run_dtype].append(loss.item())
    ref, got = losses[torch.float32], losses[dtype]
    errors = [abs(a - b) / abs(b) for a, b in zip(got, ref)]
    log.info("encoder %s %s on %s: float32 losses %s, %s %s", name, options, device,
             ["%.4f" % x for x in ref], dtype, ["%.4f" % x for x in got])  # fmt: skip
    assert all(map(lambda x: x == x and abs(x) != float("inf"), got))
    assert ref[-1] < ref[0]  # the steps train
    assert max(errors) <= LOSS_TOLERANCE[dtype], errors


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
def test_predict_and_pointr_run_under_the_precision_context_lightning_gives_eval(precision):
    """`mate predict` and `mate pointr` run outside a Trainer: their context is Lightning's for the same
    trainer.precision (bf16 on CPU too), so they compute what `mate eval` computes."""
    import lightning as L

    from mate_cli.run.rebuild import autocast

    trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False, enable_progress_bar=False)
    plugin = trainer.precision_plugin  # as `mate eval`'s Trainer builds it (on CPU, 16-mixed becomes bf16-mixed)
    states = []
    for context in (plugin.forward_context(), autocast(torch.device("cpu"), precision)):
        with context:
            states.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
    assert states[0] == states[1] and states[0][0] == precision.endswith("mixed")


def test_a_precision_that_converts_the_weights_is_refused_outside_a_trainer_in_one_line():
    from mate_cli.errors import MateError
    from mate_cli.run.rebuild import autocast

    with pytest.raises(
        MateError, match=r"trainer.precision=bf16-true converts the weights.*use trainer.precision=bf16-mixed"
    ):
        autocast(torch.device("cpu"), "bf16-true")
