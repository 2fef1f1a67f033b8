"""`mate pretrain`: masked-LM pre-training on tables (MATE §3.2, App. A.1), a Hydra app over
``conf/pretrain.yaml``.

It runs `mate train`'s loop (:func:`mate_cli.commands.train.train`: resumable checkpoints,
loggers, the best checkpoint validated) with the masked-LM module and a pre-training corpus,
plus two things the config switches on: ``validate_start`` scores the starting checkpoint on
the held-out tables before the first step (``start/val/*`` in metrics.json), and
``export_encoder`` writes ``<run dir>/encoder``, the best checkpoint as a
``transformers.TapasForMaskedLM`` directory, which ``mate train
model.encoder.pretrained=<run dir>/encoder`` fine-tunes from.
"""

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
