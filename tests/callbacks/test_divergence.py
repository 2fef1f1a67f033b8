"""mate_cli/callbacks/divergence.py's readers of non-finite numbers and its test of an optimiser that skips on the
device (the callback that stops training is exercised in tests/integration/test_training_loop.py, through a real
Trainer)."""

from __future__ import annotations

import math

import pytest
import torch

from mate_cli.callbacks.divergence import non_finite_metrics, non_finite_tensors, skips_steps_on_device


def test_non_finite_tensors_names_floating_tensors_with_a_nan_or_an_infinity():
    state = {
        "fine": torch.ones(3),
        "nan": torch.tensor([1.0, math.nan]),
        "inf": torch.tensor([-math.inf]),
        "ints": torch.tensor([1, 2]),  # not floating: never non-finite
        "step": 7,
    }
    assert non_finite_tensors(state) == ["nan", "inf"]


def test_non_finite_metrics_are_sorted_and_leave_booleans_and_text_alone():
    metrics = {"val/loss": math.nan, "a/b": math.inf, "ok": 0.5, "flag": True, "path": "x.ckpt", "n": 3}
    assert non_finite_metrics(metrics) == ["a/b", "val/loss"]


@pytest.mark.parametrize(
    "make, skips",
    [
        (lambda p: torch.optim.AdamW(p, fused=True), True),
        (lambda p: torch.optim.Adam(p, fused=True), True),
        (lambda p: torch.optim.AdamW(p), False),
        (lambda p: torch.optim.SGD(p, lr=0.1), False),
    ],
    ids=["fused AdamW", "fused Adam", "AdamW", "SGD"],
)
def test_only_fused_adam_skips_a_flagged_step_on_the_device(make, skips):
    assert skips_steps_on_device(make([torch.nn.Parameter(torch.ones(2))])) is skips


@pytest.mark.parametrize("written", [False, None], ids=["fused=false", "no fused option, as before it existed"])
def test_a_fused_adam_resumed_from_an_unfused_state_does_not_skip_on_the_device(written):
    """A resumed optimiser takes its groups' ``fused`` from the state it loads; torch's unfused step then refuses the
    ``found_inf`` a fused one takes, so the test reads the groups, not the defaults it was built with."""
    params = [torch.nn.Parameter(torch.ones(2))]
    state = torch.optim.AdamW(params, fused=written).state_dict()
    resumed = torch.optim.AdamW(params, fused=True)
    resumed.load_state_dict(state)
    assert not skips_steps_on_device(resumed)
    params[0].grad = torch.ones(2)
    if skips_steps_on_device(resumed):
        resumed.found_inf = torch.zeros(())
    resumed.step()  # what the callback leads to: before, torch's "Expected grad_scale and found_inf to be None"
