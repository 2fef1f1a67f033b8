"""`mate pretrain`: masked-LM pre-training on tables (MATE §3.2, App. A.1), `mate train`'s loop on
``conf/pretrain.yaml``. ``mate train model.encoder.pretrained=<run dir>/encoder`` fine-tunes from the export."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mate_cli.commands.common import run_task
from mate_cli.commands.train import objective, train
from mate_cli.paths import CONF_DIR, register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="pretrain")
def main(cfg: DictConfig) -> float | None:
    return objective(cfg, run_task(train, cfg))  # val/mlm_loss, the monitored metric
