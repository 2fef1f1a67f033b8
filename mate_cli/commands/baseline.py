"""`mate baseline dataset=<table task>`: the task's trivial baselines (:mod:`mate_cli.pipelines.trivial`), chosen on
the training split and scored on validation, with no model; prints them and writes ``metrics.json``."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig

from mate_cli import tasks
from mate_cli.commands.common import hydra_app, print_metrics, quiet_third_party_logs, write_result
from mate_cli.run.job import hydra_choices
from mate_cli.errors import MateError


def baseline(cfg: DictConfig) -> dict:
    quiet_third_party_logs()
    if cfg.dataset.get("task") is None:
        raise MateError(
            f"mate baseline scores the table tasks; dataset={hydra_choices().get('dataset')} is not one: "
            f"use dataset=<task> or <task>_sample, a task among {', '.join(tasks.names())}"
        )
    task = tasks.get(cfg.dataset.task)
    datamodule = instantiate(cfg.dataset)
    train, validation = datamodule.questions("train"), datamodule.questions("validation")
    metrics = task.trivial_baselines(train, validation, datamodule.reader)
    metrics.update({"data/train/questions": len(train), "data/validation/questions": len(validation)})
    shown = [k for k in metrics if k.startswith("val/")]
    print_metrics(f"{task.name}: {metrics['rule']}", metrics, shown)
    return write_result("metrics", metrics)


main = hydra_app(__name__, baseline)
