"""``init_from=<run dir | checkpoint>``: a training run starts from another run's weights, its
heads included, through `mate train`'s own function (in process, tests/inprocess.py)."""

from __future__ import annotations

import torch
from hydra.utils import instantiate

import pytest

from mate_cli.errors import MateError, find_in_chain
from mate_cli.lit_modules.table_qa import TableQAModule
from mate_cli.pretrained import load_weights_only
from mate_cli.run.rebuild import init_weights_from, load_trained, run_checkpoint
from tests.inprocess import compose_command, run_command

SQA = ["experiment=sqa_mate", "dataset.max_length=256", "logger=csv"]


def first_batch(run):
    datamodule = instantiate(run.cfg.dataset)
    datamodule.setup("validate")
    return next(iter(datamodule.val_dataloader()))


def test_a_run_started_from_another_predicts_what_the_other_predicts(trained, tmp_path, caplog):
    source = trained("sqa_task")  # tests/shared_runs.py: SQA, 3 steps
    run = tmp_path / "run"
    # one step at learning rate 0: the weights are the loaded ones
    run_command(
        "train",
        [
            *SQA,
            f"init_from={source}",
            "trainer.max_steps=1",
            "model.optimizer.lr=0.0",
            "validate_best=false",
            "callbacks.best_checkpoint=null",
            f"dataset.cache_dir={source.parent / 'cache'}",
        ],
        run,
    )
    log = (run / "train.log").read_text(encoding="utf-8")
    assert f"init_from={run_checkpoint(source)}: loaded encoder" in log and "head 4/4 tensors" in log
    cpu = torch.device("cpu")
    before = load_trained(str(source), None, TableQAModule, "source", cpu)
    after = load_trained(str(run / "checkpoints" / "last.ckpt"), None, TableQAModule, "loaded", cpu)
    batch = first_batch(before)
    with torch.no_grad():
        a, b = before.model(batch), after.model(batch)
    assert torch.equal(a.logits, b.logits)
    assert before.model.decode(batch, a) == after.model.decode(batch, b)


def test_wikitq_from_an_sqa_run_takes_the_cell_head_and_starts_aggregation_fresh(trained, tmp_path):
    source = trained("sqa_task")
    cfg = compose_command("train", ["experiment=wtq_mate", "dataset.max_length=256"], tmp_path / "run")
    model = instantiate(cfg.model)
    fresh = model.head.aggregation_classifier.weight.clone()
    line = init_weights_from(model, source)
    assert line.endswith("head 4/6 tensors (fresh: aggregation_classifier.weight, aggregation_classifier.bias)")
    assert "encoder" in line and "(fresh" not in line.split("; head")[0]
    state = load_weights_only(run_checkpoint(source), "")["state_dict"]
    for name in ("output_weights", "output_bias", "column_output_weights", "column_output_bias"):
        assert torch.equal(getattr(model.head, name), state[f"head.{name}"]), name
    assert torch.equal(
        model.encoder.embeddings.word_embeddings.weight, state["encoder.embeddings.word_embeddings.weight"]
    )
    assert torch.equal(model.head.aggregation_classifier.weight, fresh)


def test_init_from_a_folder_without_checkpoints_is_one_line(tmp_path):
    cfg = compose_command("train", ["experiment=sqa_mate"], tmp_path / "run")
    with pytest.raises(MateError, match=r"^init_from=.*: a folder without checkpoints/last.ckpt"):
        init_weights_from(instantiate(cfg.model), tmp_path)
    with pytest.raises(MateError, match=r"^init_from=.*nowhere: no such checkpoint or run dir"):
        init_weights_from(instantiate(cfg.model), tmp_path / "nowhere")


def test_a_checkpoint_of_another_encoder_or_with_nan_weights_or_no_weights_is_one_line(trained, tmp_path):
    cfg = compose_command("train", ["experiment=sqa_mate"], tmp_path / "run")
    model = instantiate(cfg.model)
    state = load_weights_only(run_checkpoint(trained("sqa_task")), "")["state_dict"]
    cases = {
        "other": ({"state_dict": {name: torch.zeros(3) for name in state}}, "holds no encoder weight of this model's"),
        "nan": (
            {
                "state_dict": {
                    **state,
                    "encoder.embeddings.word_embeddings.weight": torch.full_like(
                        state["encoder.embeddings.word_embeddings.weight"], float("nan")
                    ),
                }
            },
            r"holds NaN or infinite weights \(encoder.embeddings.word_embeddings.weight\)",
        ),
        "bare": ({"weights": 1}, "holds no state_dict"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.ckpt"
        torch.save(data, path)
        with pytest.raises(MateError, match=rf"^init_from={path} {message}"):
            init_weights_from(model, path)


def test_a_frozen_first_stage_trains_the_pooler_and_heads_on_the_loaded_encoder(trained, tmp_path):
    """``model.frozen``: two steps from a WikiTQ run with the embeddings and layers frozen leave them as loaded,
    while the pooler (read by the aggregation classifier) and the heads move."""
    source = trained("wtq_task")
    run = tmp_path / "run"
    overrides = [
        "experiment=wtq_mate",
        "dataset.max_length=256",
        "logger=csv",
        f"dataset.root={source.parent / 'wtq_root'}",
        f"dataset.cache_dir={source.parent / 'cache'}",
        f"init_from={source}",
        "model.frozen=[encoder.embeddings,encoder.encoder]",
        "trainer.max_steps=2",
        "model.optimizer.lr=1e-3",
        "model.scheduler.warmup_ratio=0",
        "validate_best=false",
        "callbacks.best_checkpoint=null",
    ]
    run_command("train", overrides, run)
    assert "model.frozen=['encoder.embeddings', 'encoder.encoder']: " in (run / "train.log").read_text("utf-8")
    before = load_weights_only(run_checkpoint(source), "")["state_dict"]
    after = load_weights_only(run / "checkpoints" / "last.ckpt", "")["state_dict"]
    kept = [n for n in before if n.startswith(("encoder.embeddings.", "encoder.encoder."))]
    moved = [n for n in before if n.startswith(("encoder.pooler.", "head.")) and n.endswith(("weight", "weights"))]
    assert len(kept) > 90 and len(moved) == 4
    assert [n for n in kept if not torch.equal(before[n], after[n])] == []
    assert [n for n in moved if torch.equal(before[n], after[n])] == []


def test_a_frozen_prefix_that_names_no_parameter_is_one_line(tmp_path):
    for prefix, message in [("encoder.embedings", "names no parameter of the encoder"), ("head", "heads always train")]:
        cfg = compose_command("train", ["experiment=wtq_mate", f"model.frozen=[{prefix}]"], tmp_path / "run")
        with pytest.raises(Exception) as raised:  # Hydra wraps it; `mate` prints the cause, one line
            instantiate(cfg.model)
        cause = find_in_chain(raised.value, MateError)
        assert cause is not None and str(cause).startswith(f"model.frozen: '{prefix}' ") and message in str(cause)
