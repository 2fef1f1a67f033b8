"""DT-Fixup for real: an init-only `mate train` run (no step; in process) measures mu over the bundled
training set with the real MiniLM, records it, scales the new layers, and keeps mu in the
checkpoint; an independent pass of the same (untrained) encoder over the same data finds
the same mu."""

from __future__ import annotations

import json

import pytest
import torch
from hydra.utils import instantiate

from mate_cli.run.rebuild import load_run_config
from tests.inprocess import run_command


def test_an_init_only_run_records_mu_and_scales_the_new_layers(tmp_path):
    run = tmp_path / "run"
    run_command(
        "train",
        [
            "experiment=hybridqa_mate_dt_fixup",
            "model.extra_layers=2",
            "trainer.max_steps=0",
            "dataset.max_length=128",
            "logger=csv",
            "validate_best=false",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        run,
    )
    metrics = json.loads((run / "metrics.json").read_text())
    mu = metrics["dt_fixup/mu"]
    assert metrics["dt_fixup/scale"] == 2**-0.5 / (2 * mu)
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert float(state["state_dict"]["extra.mu"]) == mu
    assert "extra.layers.1.fc2.weight" in state["state_dict"] and not any(".norm" in k for k in state["state_dict"])

    cfg = load_run_config(str(run / "checkpoints" / "last.ckpt"), None)  # the same data and encoder, measured again
    datamodule = instantiate(cfg.dataset, cache_dir=str(tmp_path / "cache2"))
    encoder = instantiate(cfg.model.encoder).eval()  # MiniLM has no TAPAS type tables: the run's own start
    encoder.load_state_dict(
        {k[len("encoder.") :]: v for k, v in state["state_dict"].items() if k.startswith("encoder.")}
    )
    datamodule.setup("fit")
    expected = 0.0
    with torch.no_grad():
        for batch in datamodule.train_dataloader():
            norms = encoder(batch.input_ids, batch.layout).norm(dim=-1)
            expected = max(expected, float(norms[batch.layout.attention_mask].max()))
    assert abs(mu - expected) <= 1e-4 * expected
    assert 1.0 < mu < 100.0  # "on the order of 10 for pre-trained models" (§3.3)


def test_the_extra_layers_train_at_their_own_learning_rate_and_the_encoder_at_the_optimisers(tmp_path):
    """DT-Fixup trains the added layers faster than the pre-trained encoder (Xu et al. 2021): model.extra_lr is
    the extra layers' rate, in parameter groups of their own; every other parameter keeps model.optimizer.lr."""
    from tests.inprocess import build, compose_command

    cfg = compose_command("train", ["experiment=hybridqa_mate_dt_fixup", "model.optimizer.lr=2e-5"], tmp_path)
    _, model, _ = build(cfg, tmp_path)
    model.scheduler = None  # its total steps come from a fitting Trainer; the groups do not depend on it
    optimizer = model.configure_optimizers()["optimizer"]
    rate = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    extra = {id(p) for p in model.extra.parameters()}
    assert extra and {rate[i] for i in extra} == {1e-4}
    assert {r for i, r in rate.items() if i not in extra} == {2e-5}
    assert len(rate) == sum(1 for p in model.parameters() if p.requires_grad)  # every parameter in one group


def test_a_learning_rate_that_is_not_positive_is_refused_in_one_line(tmp_path):
    from tests.inprocess import build, compose_command

    cfg = compose_command("train", ["experiment=hybridqa_mate_dt_fixup", "model.extra_lr=0"], tmp_path)
    with pytest.raises(Exception, match=r"model.extra_lr=0 is invalid: a learning rate > 0, or null"):
        build(cfg, tmp_path)


def test_a_resume_whose_optimiser_groups_differ_is_refused_in_one_line(tmp_path):
    """A dt_fixup run interrupted before model.extra_lr existed trained 2 parameter groups; the experiment now makes 4:
    resuming it is one line saying so, not Lightning's bare ValueError inside the fit."""
    from mate_cli.errors import MateError
    from mate_cli.trainer.optim import parameter_groups
    from mate_cli.run.rebuild import check_optimizer_groups
    from tests.inprocess import build, compose_command

    cfg = compose_command("train", ["experiment=hybridqa_mate_dt_fixup"], tmp_path)
    _, model, _ = build(cfg, tmp_path)
    earlier = [{"params": list(range(len(g["params"])))} for g in parameter_groups(model)]  # no rates of its own
    data = {"optimizer_states": [{"param_groups": earlier, "state": {}}]}
    with pytest.raises(MateError, match=r"its optimiser trained 2 parameter groups .* this run's model has 4"):
        check_optimizer_groups(tmp_path / "last.ckpt", data, model)
    same = [{"params": list(range(len(g["params"])))} for g in parameter_groups(model, model.own_rates())]
    check_optimizer_groups(tmp_path / "last.ckpt", {"optimizer_states": [{"param_groups": same}]}, model)
