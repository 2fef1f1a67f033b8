"""`mate export ckpt_path=<run>`: that run as a transformers TAPAS task directory (:mod:`mate_cli.run.tapas_export`);
writes ``export.json`` (what was written where)."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mate_cli.commands.common import hydra_app, quiet_third_party_logs, write_result
from mate_cli.errors import MateError
from mate_cli.lit_modules.entailment import EntailmentModule
from mate_cli.lit_modules.table_qa import TableQAModule
from mate_cli.run.job import run_dir
from mate_cli.run.rebuild import load_trained
from mate_cli.run.tapas_export import export_run


def export(cfg: DictConfig) -> dict:
    quiet_third_party_logs()
    if OmegaConf.is_missing(cfg, "ckpt_path") or cfg.ckpt_path is None:
        raise MateError("ckpt_path is missing; pass ckpt_path=<sqa|wtq|tabfact run dir> or one of its checkpoints")
    directory = Path(str(cfg.directory)) if cfg.get("directory") else run_dir() / "model"
    run = load_trained(str(cfg.ckpt_path), cfg.get("overrides"), (TableQAModule, EntailmentModule), "export",
                       torch.device("cpu"), bool(cfg.get("trust_run_config")))  # fmt: skip
    written, architecture = export_run(run, directory)
    result = {"ckpt_path": run.ckpt_path, "directory": str(written), "architecture": architecture,
              "task": str(run.cfg.dataset.task)}  # fmt: skip
    return write_result("export", result, model=written)


main = hydra_app(__name__, export)
