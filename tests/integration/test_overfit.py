"""``debug=overfit`` through `mate train`'s own function (in process, tests/inprocess.py):
every head memorises one fixed batch.

A head, loss or supervision with a bug cannot fit ``dataset.batch_size`` examples. Each case
trains the bundled MiniLM on the first batch of its bundled sample and asserts that the
task's own metric on that batch, as ``mate train`` writes it into ``metrics.json``
(``train/<metric>``), reaches 0.95 within a fixed number of steps, and that the run was
the debug mode it says: no best checkpoint, no final validation, no W&B run. The cases
that take longest are marked slow (``make test-slow``). WikiTQ memorises its batch with
hard EM; with TAPAS's own answer loss it does not, a known gap (``KNOWN_GAPS``).
"""

from __future__ import annotations

import csv
import json

import pytest

from tests.inprocess import run_command

#: name -> (command, overrides, metric, its value for "memorised", steps)
CASES = {
    "cell selection": ("train", ["experiment=hybridqa_mate", "dataset.max_length=256"], "train/hits@1", 0.95, 6),
    "TabFact": (
        "train",
        ["experiment=tabfact_mate", "dataset.max_length=128", "dataset.batch_size=8"],
        "train/accuracy",
        0.95,
        6,
    ),
    "span reader": (
        "train",
        ["experiment=hybridqa_reader", "dataset.max_length=256", "dataset.batch_size=4"],
        "train/em",
        95.0,
        20,
    ),
    "SQA": ("train", ["experiment=sqa_mate", "dataset.max_length=256"], "train/accuracy", 0.95, 60),
    # model=mlm keeps MiniLM's absolute positions: with TAPAS's per-cell reset, masked one-word cells differ
    # only by the row and column embeddings, which a BERT checkpoint lacks (docs/debugging.md)
    "masked LM": ("pretrain", [], "train/mlm_accuracy", 0.95, 60),
    "DoT": (
        "train",
        ["experiment=tabfact_dot", "dataset.max_length=512", "dataset.batch_size=8"],
        "train/accuracy",
        0.95,
        12,
    ),
    "Transformer-XH": ("train", ["experiment=hybridqa_xh"], "train/hits@1", 0.95, 12),
    # hard EM trains the selection the prediction decodes; questions whose answer the 256-token cut removed
    # cannot be answered (docs/debugging.md)
    "WikiTQ, hard EM": (
        "train",
        [
            "experiment=wtq_mate",
            "dataset.max_length=256",
            "dataset.drop_cut_answers=true",
            "model.head.aggregation_supervision=hard_em",
        ],
        "train/accuracy",
        0.95,
        50,
    ),
    "WikiTQ, TAPAS's expected result": (
        "train",
        ["experiment=wtq_mate", "dataset.max_length=256", "dataset.drop_cut_answers=true"],
        "train/accuracy",
        0.95,
        100,
    ),
}
#: the cheap ones run in `make test`; the others take 1-5 minutes each (`make test-slow`)
CHEAP = {"cell selection", "TabFact"}
#: TAPAS's answer loss fits the expected result of a soft selection: on WikiTQ's first batch the loss falls
#: while COUNT questions decode to no cell (docs/debugging.md); strict: this fails once TAPAS's own
#: loss memorises the batch, and docs/debugging.md's account of it is then wrong
KNOWN_GAPS = {"WikiTQ, TAPAS's expected result"}


def overfit(name: str, tmp_path, lr: float = 5e-4) -> tuple[dict, list[dict], object]:
    command, overrides, _, _, steps = CASES[name]
    run = tmp_path / "run"
    metrics = run_command(
        command,
        [
            *overrides,
            "debug=overfit",
            f"trainer.max_steps={steps}",
            f"model.optimizer.lr={lr}",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        run,
    )
    with open(run / "csv" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert json.loads((run / "metrics.json").read_text()) == metrics
    return metrics, rows, run


def marks(name: str) -> list:
    out = [] if name in CHEAP else [pytest.mark.slow]
    if name in KNOWN_GAPS:
        out.append(
            pytest.mark.xfail(strict=True, reason="the expected result fits the answer, the decoded one does not")
        )
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in CASES])
def test_every_head_memorises_one_fixed_batch(name, tmp_path):
    """Some heads take over 20 s: memorising a batch takes tens of optimiser steps."""
    _, _, metric, target, steps = CASES[name]
    metrics, rows, run = overfit(name, tmp_path)
    assert metrics[metric] >= target, (name, metrics)
    logged = {int(r["step"]): float(r[metric]) for r in rows if r.get(metric)}
    assert set(range(steps)) <= set(logged)  # the task's metric on the training batch, every step
    assert logged[0] < target  # it was learned here, not known from the start
    # the debug mode it says: no checkpoint selection, no final validation (val/* in metrics.json, if any,
    # are the last one-batch validation inside fit), no W&B
    validations = [r for r in rows if any(k.startswith("val/") and v for k, v in r.items())]
    last = {k: float(v) for k, v in validations[-1].items() if k.startswith("val/") and v} if validations else {}
    assert {k: v for k, v in metrics.items() if k.startswith("val/")} == pytest.approx(last)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["last.ckpt"]
    assert not (run / "wandb").exists()
