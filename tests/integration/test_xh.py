"""Transformer-XH on HybridQA through `mate train`'s own function (in process), on the bundled sample and the
real MiniLM: a few steps, the stage-1 metrics every other encoder reports, hop weights that trained, and PointR's
pipeline refusing the run in one line (it ranks the cells of one sequence per question)."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from mate_cli.errors import MateError
from mate_cli.config.naming import dir_name
from tests.inprocess import run_command


def test_hybridqa_xh_trains_through_mate_train_with_the_stage1_metrics(tmp_path):
    run = tmp_path / "run"
    run_command(
        "train",
        [
            "experiment=hybridqa_xh",
            "trainer.max_epochs=1",
            "dataset.max_nodes=12",
            "dataset.node_length=48",
            "dataset.limit_questions=4",
            "dataset.batch_size=2",
            "logger=csv",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        run,
    )
    run_name = OmegaConf.load(run / "resolved_config.yaml").run_name  # the run dir's name, less time and tag
    overrides = "max_epochs1_max_nodes12_node_length48_limit_questions4_batch_size2"  # logger=csv: not in the name
    assert dir_name(run_name) == f"hybridqa_xh-dense-hybridqa_sample-seed42-{overrides}", run_name
    metrics = json.loads((run / "metrics.json").read_text())
    assert all(0.0 <= metrics[f"val/hits@{k}"] <= 1.0 for k in (1, 3, 5))
    assert metrics["perf/examples_per_s"] > 0
    assert '"nodes_max": 12' in (run / "train.log").read_text(encoding="utf-8")
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert len([k for k in state if k.startswith("hop.hops.") and k.endswith("query.weight")]) == 6  # every layer
    hidden = state["encoder.embeddings.word_embeddings.weight"].shape[1]
    assert float(state["hop.hops.4.combine.weight"][:, hidden:].abs().max()) > 0  # [I | 0] moved: the hops trained
    # the last layer's hop reaches no cell score: frozen as it started
    assert float(state["hop.hops.5.combine.weight"][:, hidden:].abs().max()) == 0

    # PointR's pipeline ranks cells of one sequence per question: an XH run is refused in one line
    ckpt = run / "checkpoints" / "last.ckpt"
    with pytest.raises(MateError) as refused:
        run_command("pointr", [f"stage1.ckpt_path={ckpt}", f"stage2.ckpt_path={ckpt}"], tmp_path / "pointr")
    assert "is a run of mate_cli.lit_modules.xh.GraphCellSelectionModule, not CellSelectionModule" in str(refused.value)
